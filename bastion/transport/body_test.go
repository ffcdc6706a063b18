package transport

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/ratelog"
)

// TestSlowBodies: a body that does not arrive within the timeout is answered 408; past the
// actor's share of bodies arriving at once, 429 at once; both without waiting for the rest
// of the body.
func TestSlowBodies(t *testing.T) {
	released := make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(released) }) }
	t.Cleanup(release)
	h := limitBody(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), bodyLimits{timeout: 300 * time.Millisecond, perActor: 1}, ratelog.New(nil, ratelog.Options{}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	// The first body never ends (until released): 408 after the timeout.
	first := make(chan int, 1)
	go func() {
		pr, pw := io.Pipe()
		go func() { pw.Write([]byte("{")); <-released; pw.Close() }()
		req, _ := http.NewRequest(http.MethodPost, srv.URL, pr)
		req.ContentLength = 100
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	time.Sleep(100 * time.Millisecond)
	// The actor (none here: the same "") has one body arriving: 429 at once.
	start := time.Now()
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || time.Since(start) > time.Second {
		t.Errorf("second request: %s after %v; want 429 at once", resp.Status, time.Since(start))
	}
	select {
	case st := <-first:
		if st != http.StatusRequestTimeout {
			t.Errorf("the trickling request: %d; want 408", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the trickling request was not answered after its body timeout")
	}
	// Its slot is free again.
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the timeout: %s; want 200", resp.Status)
	}
}
