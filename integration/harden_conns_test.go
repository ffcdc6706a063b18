package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// TestIdleHTTPConnectionsLeaveTheSocketsAnswering: someone without a token opens 20,000
// keep-alive connections to the HTTP endpoint of a bastion whose descriptor limit is 16,384
// — one request refused 401 on each, then idle — and holds them.
// The operator socket (through the operator CLI), the MCP unix socket and an authenticated
// HTTP client keep answering, and the bastion holds a bounded number of descriptors.
func TestIdleHTTPConnectionsLeaveTheSocketsAnswering(t *testing.T) {
	const conns, holders, bastionNoFile = 20000, 4, 16384
	attacker := unixuser.New(t, "hardenconns")
	b := startBastion(t)
	pid := b.PID()
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: bastionNoFile, Max: bastionNoFile}, nil); err != nil {
		t.Fatalf("prlimit the bastion: %v", err)
	}
	fdsBefore := openFDs(t, pid)

	open, refused, release := holdIdleConns(t, attacker, b.Addr, conns, holders)
	defer release()
	held := openFDs(t, pid)
	t.Logf("of %d connections, %d are held open, %d were refused, closed or not made; the bastion holds %d descriptors (%d before)", conns, open, refused, held, fdsBefore)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const answerWithin = 5 * time.Second
	for _, probe := range []struct {
		name string
		run  func(context.Context) error
	}{
		{name: "operator CLI (postern executions list)", run: func(ctx context.Context) error {
			out, err := exec.CommandContext(ctx, harness.Binary(t, "postern"), "executions", "list", "--config", b.ConfigPath).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		}},
		{name: "operator socket", run: func(ctx context.Context) error {
			return getOK(ctx, unixClient(b.OperatorSocket), "http://operator/v1/executions")
		}},
		{name: "MCP unix socket", run: func(ctx context.Context) error {
			return postInitialize(ctx, unixClient(b.Socket), "http://local/mcp", "")
		}},
		{name: "HTTP endpoint with a token", run: func(ctx context.Context) error {
			return postInitialize(ctx, &http.Client{Transport: &http.Transport{}}, b.URL, b.Tokens["agent"])
		}},
	} {
		start := time.Now()
		pctx, pcancel := context.WithTimeout(ctx, answerWithin)
		err := probe.run(pctx)
		pcancel()
		took := time.Since(start)
		t.Logf("%s answered in %v (%v)", probe.name, took.Round(time.Millisecond), err)
		if err != nil {
			t.Errorf("%s did not answer within %v under %d idle connections: %v", probe.name, answerWithin, open, err)
		}
	}
	if limit := 2*1024 + 4096 + 256; held > limit {
		t.Errorf("the bastion holds %d descriptors; want at most %d", held, limit)
	}
}

// holdIdleConns has holders processes, running as u, open n connections to addr between
// them (in 2 minutes at most), each after a request without a token, and hold them; it returns how many are open and how many the server refused or closed, and a
// function that lets them go.
func holdIdleConns(t *testing.T, u unixuser.User, addr string, n, holders int) (open, refused int, release func()) {
	t.Helper()
	var hs []*helper
	for range holders {
		hs = append(hs, runAs(t, u, roleHoldTCP, "POSTERN_TEST_ADDR="+addr, "POSTERN_TEST_COUNT="+strconv.Itoa(n/holders)))
	}
	for _, h := range hs {
		var o, r int
		line := h.line(t)
		if _, err := fmt.Sscanf(line, "open %d refused %d", &o, &r); err != nil {
			t.Fatalf("holder said %q: %v", line, err)
		}
		open, refused = open+o, refused+r
	}
	return open, refused, func() {
		for _, h := range hs {
			h.stop()
		}
	}
}

// holdTCPProcess is roleHoldTCP: it connects $POSTERN_TEST_COUNT times to $POSTERN_TEST_ADDR,
// sending a request without a token on each connection (which a keep-alive server keeps
// open), prints "open N refused M"
// (M: not made, or closed by the server already) and holds the open ones until stdin
// closes.
func holdTCPProcess() int {
	addr := os.Getenv("POSTERN_TEST_ADDR")
	n, _ := strconv.Atoi(os.Getenv("POSTERN_TEST_COUNT"))
	deadline := time.Now().Add(2 * time.Minute)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for range next {
				var c net.Conn
				err := errors.New("out of time")
				if time.Now().Before(deadline) {
					c, err = net.DialTimeout("tcp", addr, 3*time.Second)
				}
				if err == nil {
					_, err = fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", addr)
				}
				if err != nil {
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	// The ones the server closed read EOF after its answer, if any; the others time out
	// reading: they are open.
	open := 0
	buf := make([]byte, 4096)
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		for {
			if _, err := c.Read(buf); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					open++
				}
				break
			}
		}
	}
	fmt.Printf("open %d refused %d\n", open, n-open)
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return 0
}

func openFDs(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join("/proc", fmt.Sprint(pid), "fd"))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func unixClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

func getOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// postInitialize sends an MCP initialize request and wants it answered 200.
func postInitialize(ctx context.Context, hc *http.Client, url, token string) error {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"harden","version":"0"}}}`
	status, out, err := postMCP(ctx, hc, url, token, []byte(body))
	if err == nil && (status != http.StatusOK || !strings.Contains(string(out), `"result"`)) {
		err = fmt.Errorf("%d: %s", status, out)
	}
	return err
}
