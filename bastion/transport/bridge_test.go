package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// bridgeFixture runs Bridge in-process with pipes for its stdin and stdout.
type bridgeFixture struct {
	stdin  *io.PipeWriter // what the client writes
	stdout *io.PipeReader // what the client reads
	errc   chan error     // Bridge's result
}

func startBridge(t *testing.T, ctx context.Context, sock string) *bridgeFixture {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	f := &bridgeFixture{stdin: inW, stdout: outR, errc: make(chan error, 1)}
	var wg sync.WaitGroup
	wg.Go(func() {
		err := Bridge(ctx, sock, "/mcp", inR, outW)
		outW.CloseWithError(io.EOF)
		f.errc <- err
	})
	t.Cleanup(func() {
		inW.Close()
		outR.Close()
		wg.Wait()
	})
	return f
}

func TestBridgeWithGoSDKClient(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	for _, version := range []string{"", "2025-11-25", "2025-06-18"} {
		t.Run("protocol "+version, func(t *testing.T) {
			b := startBridge(t, t.Context(), sock)
			c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "0"}, nil)
			cs, err := c.Connect(t.Context(), &mcp.IOTransport{Reader: b.stdout, Writer: b.stdin}, &mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatalf("connect through bridge: %v", err)
			}
			tools, err := cs.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatalf("tools/list: %v", err)
			}
			if len(tools.Tools) != 2 {
				t.Errorf("tools/list = %d tools; want 2", len(tools.Tools))
			}
			got := callWhoami(t, cs)
			// The bridge names its parent, whatever process it runs in: here the test
			// binary's parent (go test), which the kernel confirms.
			if want := parentScope(t); !got.OK || !got.Caller.Local || got.Caller.Scope != want || got.Caller.PID != os.Getppid() {
				t.Errorf("whoami = %+v; want a local caller with scope %s", got, want)
			}
			cs.Close()
			if err := <-b.errc; err != nil {
				t.Errorf("Bridge after client close = %v; want nil", err)
			}
		})
	}
}

// TestBridgeProcessScopeIsItsParent runs the bridge as a separate process of the same
// executable as the server, as `postern mcp` is: the agent is the bridge's parent.
func TestBridgeProcessScopeIsItsParent(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	cmd := reexecBridge(t, sock)
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "0"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect through bridge process: %v", err)
	}
	defer cs.Close()
	got := callWhoami(t, cs)
	if got.Caller.PID != os.Getpid() || got.Caller.Scope != selfScope(t) {
		t.Errorf("whoami through bridge process %d = %+v; want agent pid %d, scope %s",
			cmd.Process.Pid, got.Caller, os.Getpid(), selfScope(t))
	}
}

// rawLines drives the bridge with hand-written lines and reads its output lines.
type rawLines struct {
	t   *testing.T
	b   *bridgeFixture
	out *bufio.Scanner
}

func newRawLines(t *testing.T, b *bridgeFixture) *rawLines {
	sc := bufio.NewScanner(b.stdout)
	sc.Buffer(nil, maxBridgeResponseBytes)
	return &rawLines{t: t, b: b, out: sc}
}

func (r *rawLines) send(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.b.stdin, line+"\n"); err != nil {
		r.t.Fatalf("write to bridge: %v", err)
	}
}

// next returns the next output message, decoded.
func (r *rawLines) next() map[string]any {
	r.t.Helper()
	if !r.out.Scan() {
		r.t.Fatalf("bridge output ended: %v", r.out.Err())
	}
	var msg map[string]any
	if err := json.Unmarshal(r.out.Bytes(), &msg); err != nil {
		r.t.Fatalf("bridge wrote %q: %v", r.out.Bytes(), err)
	}
	return msg
}

func errorCode(msg map[string]any) float64 {
	e, _ := msg["error"].(map[string]any)
	code, _ := e["code"].(float64)
	return code
}

func TestBridgeAnswersEveryCall(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	r := newRawLines(t, startBridge(t, t.Context(), sock))
	tests := []struct {
		name     string
		line     string
		wantID   any // float64 for numeric ids, nil for none
		wantCode float64
	}{
		{name: "not JSON", line: `{"jsonrpc":`, wantCode: codeParseError},
		{name: "not an object", line: `"hello"`, wantCode: codeParseError},
		{name: "batch", line: `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, wantCode: codeInvalidRequest},
		{name: "too long", line: `{"pad":"` + strings.Repeat("x", MaxBridgeLineBytes) + `"}`, wantCode: codeParseError},
		{name: "unknown method is an HTTP error", line: `{"jsonrpc":"2.0","id":7,"method":"no/such"}`, wantID: 7.0, wantCode: codeBridgeError},
		{name: "unsupported protocol version", line: `{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"1999-01-01"}}}`, wantID: 8.0, wantCode: codeBridgeError},
		{name: "string id", line: `{"jsonrpc":"2.0","id":"x","method":"no/such"}`, wantID: "x", wantCode: codeBridgeError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			r.send(tt.line)
			msg := r.next()
			if msg["id"] != tt.wantID || errorCode(msg) != tt.wantCode {
				t.Errorf("reply = %v; want error %v for id %v", msg, tt.wantCode, tt.wantID)
			}
		})
	}
}

func TestBridgeConcurrentCallsAndProgress(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	b := startBridge(t, t.Context(), sock)
	r := newRawLines(t, b)
	const v = "2025-11-25"
	r.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + v + `","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	if msg := r.next(); msg["id"] != 1.0 || msg["result"] == nil {
		t.Fatalf("initialize reply = %v", msg)
	}
	r.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	r.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progressToken":"p"}}}`)
	if msg := r.next(); msg["method"] != "notifications/progress" {
		t.Fatalf("first message after wait = %v; want its progress notification", msg)
	}
	// wait is still blocked; a second call is answered meanwhile.
	r.send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if msg := r.next(); msg["id"] != 3.0 || msg["result"] == nil {
		t.Fatalf("whoami reply while wait is blocked = %v", msg)
	}
	ts.release()
	if msg := r.next(); msg["id"] != 2.0 || msg["result"] == nil {
		t.Fatalf("wait reply = %v", msg)
	}
	b.stdin.Close()
	if err := <-b.errc; err != nil {
		t.Errorf("Bridge at EOF = %v; want nil", err)
	}
}

func TestBridgeCancelledCallIsNotAwaited(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	b := startBridge(t, t.Context(), sock)
	r := newRawLines(t, b)
	r.send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progressToken":"p"}}}`)
	if msg := r.next(); msg["method"] != "notifications/progress" {
		t.Fatalf("first message = %v; want progress", msg)
	}
	r.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}`)
	b.stdin.Close()
	// wait stays blocked in the server until cleanup; the bridge returns at EOF regardless
	// because the cancelled call's HTTP request ended.
	if err := <-b.errc; err != nil {
		t.Errorf("Bridge at EOF = %v; want nil", err)
	}
}

// TestBridgeForwardsCancel: the daemon hears every notifications/cancelled the client sends,
// for a call in flight and for one already answered (a delivery it may revoke), from the
// bridge's agent, before the bridge reads on.
func TestBridgeForwardsCancel(t *testing.T) {
	ts := newTestServer(t, nil)
	var mu sync.Mutex
	var heard []string
	inner := ts.handler
	ts.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte("notifications/cancelled")) {
			c, _ := CallerFromContext(r.Context())
			mu.Lock()
			heard = append(heard, c.Scope+" "+string(body))
			mu.Unlock()
		}
		inner.ServeHTTP(w, r)
	})
	sock := serveUnix(t, ts)
	b := startBridge(t, t.Context(), sock)
	r := newRawLines(t, b)
	r.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if msg := r.next(); msg["id"] != float64(1) {
		t.Fatalf("answer = %v; want the result of call 1", msg)
	}
	r.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`)
	r.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progressToken":"p"}}}`)
	if msg := r.next(); msg["method"] != "notifications/progress" {
		t.Fatalf("message = %v; want progress of call 2", msg)
	}
	r.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`)
	b.stdin.Close()
	if err := <-b.errc; err != nil {
		t.Errorf("Bridge at EOF = %v; want nil", err)
	}
	mu.Lock()
	defer mu.Unlock()
	scope := parentScope(t)
	want := []string{
		scope + ` {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`,
		scope + ` {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`,
	}
	if fmt.Sprint(heard) != fmt.Sprint(want) {
		t.Errorf("the daemon heard %q; want %q", heard, want)
	}
}

func TestBridgeEndsWithContext(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	ctx, cancel := context.WithCancel(t.Context())
	b := startBridge(t, ctx, sock)
	r := newRawLines(t, b)
	r.send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progressToken":"p"}}}`)
	r.next()
	cancel()
	select {
	case err := <-b.errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Bridge after cancel = %v; want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Bridge did not return after its context ended")
	}
}

func TestBridgeWithoutDaemon(t *testing.T) {
	sock := filepath.Join(sockdir.New(t), "absent.sock")
	err := Bridge(t.Context(), sock, "/mcp", strings.NewReader(""), io.Discard)
	if !errors.Is(err, ErrDaemonNotRunning) || !strings.Contains(err.Error(), sock) {
		t.Errorf("Bridge = %v; want ErrDaemonNotRunning naming %s", err, sock)
	}
}

func TestReadSSE(t *testing.T) {
	tests := []struct {
		name    string
		stream  string
		want    []string
		wantErr bool
	}{
		{name: "two events", stream: "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n", want: []string{`{"a":1}`, `{"b":2}`}},
		{name: "CRLF, comment, id and named message", stream: ": hi\r\nid: 1\r\nevent: message\r\ndata:{\"a\":1}\r\n\r\n", want: []string{`{"a":1}`}},
		{name: "multi-line data", stream: "data: {\"a\":\ndata: 1}\n\n", want: []string{"{\"a\":\n1}"}},
		{name: "other event types skipped", stream: "event: prime\ndata: x\n\ndata: {}\n\n", want: []string{`{}`}},
		{name: "unterminated last event dropped", stream: "data: {}\n\ndata: {\"partial\":", want: []string{`{}`}},
		{name: "event too large", stream: "data: " + strings.Repeat("x", 100) + "\n\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			err := readSSE(strings.NewReader(tt.stream), 64, func(d []byte) { got = append(got, string(d)) })
			if (err != nil) != tt.wantErr || strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("readSSE = %q, %v; want %q, error: %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
