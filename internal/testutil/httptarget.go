package testutil

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// HTTPFault is what an HTTPTarget does to a request instead of answering it normally.
type HTTPFault string

const (
	// FaultDropAfterRead reads the whole request, performs its side effect (and stores the
	// response under its key), then closes the connection without answering: the effect
	// happened, the response is lost.
	FaultDropAfterRead HTTPFault = "drop-after-read"
	// FaultDropBeforeEffect reads the whole request and closes the connection without
	// performing anything: the request was written, yet it took no effect.
	FaultDropBeforeEffect HTTPFault = "drop-before-effect"
	// FaultHold reads the request, performs its side effect, then holds the response until
	// Release (or until the target closes).
	FaultHold HTTPFault = "hold"
)

// HTTPTargetOptions configures StartHTTPTarget.
type HTTPTargetOptions struct {
	// Addr is the 127.0.0.1 address to listen on ("" = any free port): a test can start the
	// target where a request failed before.
	Addr string
	// IgnoreKeys makes the target ignore Idempotency-Key: every request is a new effect.
	IgnoreKeys bool
	// Faults arms a one-shot fault per request path: the first request to that path gets it,
	// later ones are served normally. Arm adds more while the target runs.
	Faults map[string]HTTPFault
}

// ReceivedRequest is one request as the target read it.
type ReceivedRequest struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
	// Key is the parsed Idempotency-Key ("" when absent or ignored).
	Key string
	// Fault is the fault this request got ("" = served normally).
	Fault HTTPFault
}

// HTTPTarget is an HTTP API for tests that implements the Idempotency-Key semantics of
// draft-ietf-httpapi-idempotency-key-header and counts side effects:
//
//   - a request with a key seen before and the same payload (method, path, query, body) gets
//     the stored response with "Idempotent-Replayed: true" and performs nothing;
//   - the same key with another payload gets 422; while the first request with a key is still
//     being processed, another one with that key gets 409;
//   - a key that is not an RFC 8941 sf-string gets 400, nothing performed.
//
// Every other request performs one side effect and answers 200 with a JSON body. GET
// /status/{key} answers 200 if that key performed an effect, else 404 (a conditional_write
// endpoint's status check); it performs nothing. A request to a path ending in /echo performs
// nothing and reflects the request, as an API that echoes what it got would (see echo); no
// other route echoes request headers.
type HTTPTarget struct {
	// URL is the base URL (http://127.0.0.1:port); Addr its host:port.
	URL, Addr string

	opts   HTTPTargetOptions
	server *httptest.Server

	mu       sync.Mutex // guards the fields below
	requests []ReceivedRequest
	effects  map[string]int // by key ("" = requests without a key)
	total    int
	stored   map[string]storedAnswer
	inFlight map[string]bool
	faults   map[string]HTTPFault
	held     map[string]chan struct{} // by path: closed by Release
	holding  map[string]int           // by path: requests held now
	closed   chan struct{}            // closed when the target shuts down
}

type storedAnswer struct {
	payload [sha256.Size]byte
	body    []byte
}

// maxTargetBody bounds what the target reads of a request body.
const maxTargetBody = 8 << 20

// StartHTTPTarget starts a target on 127.0.0.1; it is closed at cleanup (held requests are
// released first).
func StartHTTPTarget(t testing.TB, opts HTTPTargetOptions) *HTTPTarget {
	t.Helper()
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("http target: listen %s: %v", addr, err)
	}
	h := &HTTPTarget{
		opts: opts, effects: map[string]int{}, stored: map[string]storedAnswer{},
		inFlight: map[string]bool{}, faults: map[string]HTTPFault{}, held: map[string]chan struct{}{},
		holding: map[string]int{}, closed: make(chan struct{}),
	}
	for p, f := range opts.Faults {
		h.faults[p] = f
	}
	h.server = &httptest.Server{Listener: ln, Config: &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}}
	h.server.Start()
	h.URL, h.Addr = h.server.URL, ln.Addr().String()
	t.Cleanup(h.Close)
	return h
}

// Close releases held requests and stops the target.
func (h *HTTPTarget) Close() {
	h.mu.Lock()
	select {
	case <-h.closed:
		h.mu.Unlock()
		return
	default:
		close(h.closed)
	}
	h.mu.Unlock()
	h.server.CloseClientConnections()
	h.server.Close()
}

// Arm gives the next request to path the fault f.
func (h *HTTPTarget) Arm(path string, f HTTPFault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[path] = f
}

// Release lets the requests held on path answer (and any later one to it pass).
func (h *HTTPTarget) Release(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.gate(path)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// WaitHeld waits until a request to path is held.
func (h *HTTPTarget) WaitHeld(t testing.TB, path string) {
	t.Helper()
	WaitFor(t, "a request to "+path+" to be held by the target", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.holding[path] > 0
	})
}

// Effects is how many side effects requests with key performed.
func (h *HTTPTarget) Effects(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.effects[key]
}

// TotalEffects is how many side effects the target performed.
func (h *HTTPTarget) TotalEffects() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}

// Requests returns every request received so far (status checks included), in order.
func (h *HTTPTarget) Requests() []ReceivedRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]ReceivedRequest(nil), h.requests...)
}

// RequestsTo returns the requests received on path.
func (h *HTTPTarget) RequestsTo(path string) []ReceivedRequest {
	var out []ReceivedRequest
	for _, r := range h.Requests() {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// gate returns path's hold channel; h.mu must be held.
func (h *HTTPTarget) gate(path string) chan struct{} {
	ch, ok := h.held[path]
	if !ok {
		ch = make(chan struct{})
		h.held[path] = ch
	}
	return ch
}

// ParseSFString parses an RFC 8941 sf-string ("..." with \" and \\ escapes, printable ASCII).
func ParseSFString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var sb strings.Builder
	inner := v[1 : len(v)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", false
			}
			sb.WriteByte(inner[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String(), true
}

func (h *HTTPTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTargetBody))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/status/") {
		h.status(w, r, body)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/echo") {
		h.echo(w, r, body)
		return
	}
	rawKey, hasKey := r.Header["Idempotency-Key"]
	key := ""
	if hasKey && !h.opts.IgnoreKeys {
		k, ok := ParseSFString(rawKey[0])
		if len(rawKey) != 1 || !ok || k == "" {
			h.record(r, body, "", "")
			http.Error(w, "Idempotency-Key must be one non-empty sf-string", http.StatusBadRequest)
			return
		}
		key = k
	}
	payload := sha256.Sum256([]byte(r.Method + "\x00" + r.URL.Path + "\x00" + r.URL.RawQuery + "\x00" + string(body)))

	h.mu.Lock()
	fault := h.faults[r.URL.Path]
	delete(h.faults, r.URL.Path)
	h.requests = append(h.requests, received(r, body, key, fault))
	if key != "" {
		if prior, ok := h.stored[key]; ok {
			h.mu.Unlock()
			if prior.payload != payload {
				http.Error(w, "Idempotency-Key reused with another payload", http.StatusUnprocessableEntity)
				return
			}
			if fault == FaultDropAfterRead || fault == FaultDropBeforeEffect {
				h.drop(w)
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			writeJSON(w, prior.body)
			return
		}
		if h.inFlight[key] {
			h.mu.Unlock()
			http.Error(w, "a request with this Idempotency-Key is being processed", http.StatusConflict)
			return
		}
	}
	if fault == FaultDropBeforeEffect {
		h.mu.Unlock()
		h.drop(w)
		return
	}
	// The side effect, and its response stored under the key, happen together.
	h.total++
	h.effects[key]++
	answer, _ := json.Marshal(map[string]any{"effect": h.total, "key": key, "method": r.Method, "path": r.URL.Path, "query": r.URL.RawQuery, "body_bytes": len(body)})
	var gate chan struct{}
	switch {
	case fault == FaultHold:
		// Processing until released: the response is stored only then.
		gate = h.gate(r.URL.Path)
		h.holding[r.URL.Path]++
		if key != "" {
			h.inFlight[key] = true
		}
	case key != "":
		h.stored[key] = storedAnswer{payload: payload, body: answer}
	}
	h.mu.Unlock()

	switch fault {
	case FaultDropAfterRead:
		h.drop(w)
		return
	case FaultHold:
		select {
		case <-gate:
		case <-h.closed:
		}
		h.mu.Lock()
		h.holding[r.URL.Path]--
		if key != "" {
			delete(h.inFlight, key)
			h.stored[key] = storedAnswer{payload: payload, body: answer}
		}
		h.mu.Unlock()
	}
	writeJSON(w, answer)
}

// status answers a status check: did the key perform an effect?
func (h *HTTPTarget) status(w http.ResponseWriter, r *http.Request, body []byte) {
	key := strings.TrimPrefix(r.URL.Path, "/status/")
	h.mu.Lock()
	h.requests = append(h.requests, received(r, body, "", ""))
	n := h.effects[key]
	h.mu.Unlock()
	if n == 0 {
		http.Error(w, "no effect for "+key, http.StatusNotFound)
		return
	}
	b, _ := json.Marshal(map[string]any{"key": key, "effects": n})
	writeJSON(w, b)
}

// echo reflects a request: every request header comes back as the response header
// "Echo-<Name>", and the body is "?pad=N" bytes of 'x' followed by the values of the request
// header "?header=Name" (one per line), or by every header as "Name: value" lines, or with
// "?format=json" by {"headers": {...}} as encoding/json writes it. It performs nothing.
func (h *HTTPTarget) echo(w http.ResponseWriter, r *http.Request, body []byte) {
	h.record(r, body, "", "")
	q := r.URL.Query()
	pad, _ := strconv.Atoi(q.Get("pad"))
	var out bytes.Buffer
	out.WriteString(strings.Repeat("x", min(max(pad, 0), maxTargetBody)))
	names := make([]string, 0, len(r.Header))
	for name, values := range r.Header {
		names = append(names, name)
		for _, v := range values {
			w.Header().Add("Echo-"+name, v)
		}
	}
	sort.Strings(names)
	switch {
	case q.Get("header") != "":
		for _, v := range r.Header.Values(q.Get("header")) {
			out.WriteString(v + "\n")
		}
	case q.Get("format") == "json":
		b, _ := json.Marshal(map[string]any{"headers": r.Header})
		out.Write(b)
	default:
		for _, name := range names {
			for _, v := range r.Header[name] {
				out.WriteString(name + ": " + v + "\n")
			}
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write(out.Bytes())
}

func (h *HTTPTarget) record(r *http.Request, body []byte, key string, fault HTTPFault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests = append(h.requests, received(r, body, key, fault))
}

func received(r *http.Request, body []byte, key string, fault HTTPFault) ReceivedRequest {
	return ReceivedRequest{
		Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(),
		Body: bytes.Clone(body), Key: key, Fault: fault,
	}
}

// drop closes the connection without writing a response byte.
func (h *HTTPTarget) drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (not HTTP/1.x): abort, which closes the stream without a response.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
