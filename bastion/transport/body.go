package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/postern-dev/postern/internal/ratelog"
)

// A request's body is read whole, bounded in size and in time, before the MCP handler runs:
// a client that trickles its body holds a connection and a goroutine only for the body
// timeout, and at most a few of one actor's requests may be arriving at once, so an actor
// that trickles spends its own share, not the others'.

// Defaults of the body bounds.
const (
	DefaultBodyTimeout       = 10 * time.Second
	DefaultMaxBodiesPerActor = 16
)

// bodyLimits bound the bodies limitBody reads; zero fields take the defaults.
type bodyLimits struct {
	max      int64
	timeout  time.Duration
	perActor int
}

// limitBody reads the whole body, up to limits.max bytes and within limits.timeout, before
// next runs: a larger body is answered 413, a late one 408 (and its connection closed), one
// that is not valid text a JSON-RPC error (text.go), so the MCP handler never sees a
// partial, oversize or rewritten body whatever the framing (Content-Length, chunked). It runs once the request authenticated: an actor with
// limits.perActor bodies arriving already is answered 429.
func limitBody(next http.Handler, limits bodyLimits, refusals *ratelog.Logger) http.Handler {
	limits.max = orDefault(limits.max, DefaultMaxBodyBytes)
	limits.timeout = orDefault(limits.timeout, DefaultBodyTimeout)
	limits.perActor = orDefault(limits.perActor, DefaultMaxBodiesPerActor)
	var mu sync.Mutex // guards arriving
	arriving := map[string]int{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse := func(status int, reason, detail string) {
			refusals.Log(slog.LevelInfo, reason, "refused request", "remote", r.RemoteAddr, "status", status)
			// What is left of the body is not read: not even by net/http, which would read
			// it (with no deadline) before the answer to keep the connection.
			w.Header().Set("Connection", "close")
			http.Error(w, detail, status)
		}
		if r.ContentLength > limits.max {
			refuse(http.StatusRequestEntityTooLarge, ReasonBodyTooLarge, fmt.Sprintf("request body exceeds %d bytes", limits.max))
			return
		}
		actor := ""
		if c, ok := CallerFromTokenInfo(auth.TokenInfoFromContext(r.Context())); ok {
			actor = c.Actor
		}
		mu.Lock()
		if arriving[actor] >= limits.perActor {
			mu.Unlock()
			w.Header().Set("Retry-After", "1")
			refuse(http.StatusTooManyRequests, ReasonActorBusy, fmt.Sprintf("%d requests of this actor are sending their bodies already; retry", limits.perActor))
			return
		}
		arriving[actor]++
		mu.Unlock()
		body, err := readBody(w, r, limits)
		mu.Lock()
		if arriving[actor]--; arriving[actor] == 0 {
			delete(arriving, actor)
		}
		mu.Unlock()
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			refuse(http.StatusRequestEntityTooLarge, ReasonBodyTooLarge, fmt.Sprintf("request body exceeds %d bytes", limits.max))
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			refuse(http.StatusRequestTimeout, ReasonBodyTimeout, fmt.Sprintf("the request body did not arrive within %v", limits.timeout))
			return
		}
		if err != nil {
			http.Error(w, "reading request body failed", http.StatusBadRequest)
			return
		}
		if refuseBadText(w, r, body, refusals) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// readBody reads r's body within limits. The read deadline is the connection's: it is lifted
// once the body is in, as the server reads on in the background (to notice a client that
// hangs up) and a deadline left behind would cancel the request.
func readBody(w http.ResponseWriter, r *http.Request, limits bodyLimits) ([]byte, error) {
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(limits.timeout)) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limits.max))
	if deadline {
		rc.SetReadDeadline(time.Time{})
	}
	return body, err
}
