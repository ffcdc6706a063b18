package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// limitedServer serves HTTPHandler (one actor, token) around a handler that answers "ok" on
// a NewHTTPServer with limits; it returns its address.
func limitedServer(t *testing.T, limits HTTPLimits) (addr, token string) {
	t.Helper()
	token, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	h, err := HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), HTTPOptions{Actors: []Actor{{Name: "agent", TokenSHA256: HashToken(token)}}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, l := NewHTTPServer(ln, mux, HTTPServerOptions{Limits: limits})
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(l) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return ln.Addr().String(), token
}

// rawConn is a client connection that sends requests by hand.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// post sends a request (with token, if not "") and returns its status, or an error if the
// connection ended instead.
func (c *rawConn) post(token string) (int, error) {
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: 2\r\n\r\n{}", auth); err != nil {
		return 0, err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// closedByServer reports whether the server closed c (within wait).
func (c *rawConn) closedByServer(wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.br.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestConnectionsWithoutATokenAreNotKept: a response to a request without a known token
// closes its connection; an authenticated connection is kept for the next request.
func TestConnectionsWithoutATokenAreNotKept(t *testing.T) {
	addr, token := limitedServer(t, HTTPLimits{})
	anon := dialRaw(t, addr)
	if st, err := anon.post(""); st != http.StatusUnauthorized || err != nil {
		t.Fatalf("without a token: %d, %v; want 401", st, err)
	}
	if !anon.closedByServer(time.Second) {
		t.Error("the connection without a token stayed open after its 401")
	}
	authed := dialRaw(t, addr)
	for i := range 2 {
		if st, err := authed.post(token); st != http.StatusOK || err != nil {
			t.Fatalf("request %d with the token on one connection: %d, %v; want 200", i, st, err)
		}
	}
}

// TestPeerShareMakesRoom: a peer at its share gets in by closing its oldest connection that
// sent nothing; authenticated connections are never closed for room; with nothing to close,
// the new connection is.
func TestPeerShareMakesRoom(t *testing.T) {
	addr, token := limitedServer(t, HTTPLimits{MaxConnsPerPeer: 3})
	a := dialRaw(t, addr)
	if st, err := a.post(token); st != http.StatusOK {
		t.Fatalf("a: %d, %v", st, err)
	}
	b := dialRaw(t, addr)
	time.Sleep(10 * time.Millisecond) // b is older than c
	c := dialRaw(t, addr)
	d := dialRaw(t, addr)
	if !b.closedByServer(time.Second) {
		t.Fatal("the oldest connection that sent nothing was not closed for the new one")
	}
	if c.closedByServer(50 * time.Millisecond) {
		t.Fatal("a newer connection that sent nothing was closed")
	}
	for name, rc := range map[string]*rawConn{"d": d, "c": c} {
		if st, err := rc.post(token); st != http.StatusOK {
			t.Fatalf("%s: %d, %v", name, st, err)
		}
	}
	// a, c and d authenticated: nothing to close for room.
	e := dialRaw(t, addr)
	if !e.closedByServer(time.Second) {
		t.Error("a connection past the share was kept though every other one authenticated")
	}
	if st, err := a.post(token); st != http.StatusOK {
		t.Errorf("the first authenticated connection after the refusal: %d, %v", st, err)
	}
}

// TestIdleNewConnectionsTimeOut: a connection that sends no request is closed after the
// header timeout.
func TestIdleNewConnectionsTimeOut(t *testing.T) {
	addr, _ := limitedServer(t, HTTPLimits{HeaderTimeout: 200 * time.Millisecond})
	c := dialRaw(t, addr)
	start := time.Now()
	if !c.closedByServer(5 * time.Second) {
		t.Fatal("an idle connection was not closed")
	}
	t.Logf("closed after %v", time.Since(start).Round(time.Millisecond))
}

// TestTotalConnectionsWait: past MaxConns a connection waits (unaccepted) for a free slot.
func TestTotalConnectionsWait(t *testing.T) {
	addr, token := limitedServer(t, HTTPLimits{MaxConns: 2})
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	for _, rc := range []*rawConn{a, b} {
		if st, err := rc.post(token); st != http.StatusOK {
			t.Fatalf("%d, %v", st, err)
		}
	}
	c := dialRaw(t, addr)
	got := make(chan int, 1)
	go func() {
		st, _ := c.post(token)
		got <- st
	}()
	select {
	case st := <-got:
		t.Fatalf("a third connection was served (%d) with two of two open", st)
	case <-time.After(300 * time.Millisecond):
	}
	a.Close()
	select {
	case st := <-got:
		if st != http.StatusOK {
			t.Fatalf("third connection: %d; want 200 once a slot was free", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was not served after a slot was freed")
	}
}

func TestPeerOf(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"127.0.0.1:1", "loopback"},
		{"127.9.8.7:1", "loopback"},
		{"[::1]:1", "loopback"},
		{"192.0.2.7:1", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:1", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:1", "2001:db8:1:2::/64"},
	} {
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := peerOf(a); got != tc.want {
			t.Errorf("peerOf(%s) = %q; want %q", tc.addr, got, tc.want)
		}
	}
}
