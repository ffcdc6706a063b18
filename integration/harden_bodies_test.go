package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
)

// TestSlowBodiesAreCutOff: an authenticated actor sends 50 requests whose bodies trickle in a
// byte a second, over HTTP, and a local peer 5 over the MCP unix socket. Those past the
// actor's share are refused at once (429), the others are answered 408 when the body
// timeout ends, every one is counted, and another actor is served all along.
func TestSlowBodiesAreCutOff(t *testing.T) {
	const overHTTP, overSocket = 50, 5
	b := startBastion(t)
	start := time.Now()
	dialHTTP := func() (net.Conn, error) { return net.Dial("tcp", b.Addr) }
	dialSocket := func() (net.Conn, error) { return net.Dial("unix", b.Socket) }
	var wg sync.WaitGroup
	results := make(chan trickled, overHTTP+overSocket)
	for range overHTTP {
		wg.Go(func() { results <- trickle(dialHTTP, b.Addr, b.Tokens["agent"]) })
	}
	for range overSocket {
		wg.Go(func() { results <- trickle(dialSocket, "local", "") })
	}

	// Another actor is served while the agent's bodies trickle.
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := postInitialize(ctx, &http.Client{}, b.URL, b.Tokens["other"]); err != nil {
		t.Errorf("another actor during the trickle: %v", err)
	}
	cancel()

	wg.Wait()
	close(results)
	byStatus := map[int]int{}
	var last time.Duration
	for r := range results {
		byStatus[r.status]++
		last = max(last, r.after)
		if r.err != nil {
			t.Errorf("a trickling request ended without an answer after %v: %v", r.after, r.err)
		}
	}
	t.Logf("answers by status %v; the last after %v (%v since the first byte)", byStatus, last.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	bound := transport.DefaultBodyTimeout + 5*time.Second
	if last > bound {
		t.Errorf("a trickling request was answered after %v; want all within %v", last, bound)
	}
	if want := overHTTP - transport.DefaultMaxBodiesPerActor; byStatus[http.StatusTooManyRequests] != want {
		t.Errorf("%d requests refused 429; want %d (the actor's share is %d)", byStatus[http.StatusTooManyRequests], want, transport.DefaultMaxBodiesPerActor)
	}
	if want := transport.DefaultMaxBodiesPerActor + overSocket; byStatus[http.StatusRequestTimeout] != want {
		t.Errorf("%d requests answered 408; want %d", byStatus[http.StatusRequestTimeout], want)
	}
	testutil.WaitFor(t, "the refusals counted", func() bool {
		return refusals(t, b, "http", "actor_busy") == overHTTP-transport.DefaultMaxBodiesPerActor &&
			refusals(t, b, "http", "body_timeout") == transport.DefaultMaxBodiesPerActor &&
			refusals(t, b, "mcp_socket", "body_timeout") == overSocket
	})
}

// trickled is how a trickling request ended: the status answered (0: none) and when.
type trickled struct {
	status int
	after  time.Duration
	err    error
}

// trickle sends a POST whose 100-byte body comes a byte a second (for 60 s at most) and
// returns how the server answered.
func trickle(dial func() (net.Conn, error), host, token string) trickled {
	start := time.Now()
	c, err := dial()
	if err != nil {
		return trickled{err: err}
	}
	defer c.Close()
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n%sContent-Length: 100\r\n\r\n{", host, auth)
	answered := make(chan trickled, 1)
	go func() {
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- trickled{after: time.Since(start), err: err}
			return
		}
		resp.Body.Close()
		answered <- trickled{status: resp.StatusCode, after: time.Since(start)}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case r := <-answered:
			return r
		case <-tick.C:
			c.Write([]byte(" "))
		}
	}
}
