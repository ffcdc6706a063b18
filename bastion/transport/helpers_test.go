package transport

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/internal/procfs"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// bridgeRoleEnv, when set, makes the test binary run as `postern mcp` does: the stdio bridge
// (see reexecBridge). internal/testutil.Reexec would do, but testutil imports this package.
const bridgeRoleEnv = "POSTERN_TRANSPORT_TEST_BRIDGE"

func TestMain(m *testing.M) {
	if os.Getenv(bridgeRoleEnv) != "" {
		err := Bridge(context.Background(), os.Getenv("POSTERN_TEST_SOCKET"), "/mcp", os.Stdin, os.Stdout)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// reexecBridge returns a command that runs this test binary as the bridge to socketPath.
func reexecBridge(t testing.TB, socketPath string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), bridgeRoleEnv+"=1", "POSTERN_TEST_SOCKET="+socketPath)
	return cmd
}

// whoami is the structured output of the test server's whoami tool.
type whoami struct {
	Caller Caller `json:"caller"`
	OK     bool   `json:"ok"`
	// SawAuthorization is whether an Authorization header reached the tool handler.
	SawAuthorization bool `json:"saw_authorization"`
}

// testServer is a go-sdk server with the tools the tests call.
type testServer struct {
	handler http.Handler
	// waitRelease unblocks calls of the "wait" tool.
	waitRelease chan struct{}
	releaseOnce sync.Once
}

func newTestServer(t testing.TB, opts *mcp.StreamableHTTPOptions) *testServer {
	t.Helper()
	ts := &testServer{waitRelease: make(chan struct{})}
	t.Cleanup(ts.release)
	srv := mcp.NewServer(&mcp.Implementation{Name: "postern-test", Version: "0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, whoami, error) {
		c, ok := CallerFromTokenInfo(req.Extra.TokenInfo)
		saw := req.Extra.Header.Get("Authorization") != ""
		return nil, whoami{Caller: c, OK: ok, SawAuthorization: saw}, nil
	})
	// wait reports progress (when asked to) and blocks until released or cancelled.
	mcp.AddTool(srv, &mcp.Tool{Name: "wait"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Message: "waiting", Progress: 1}); err != nil {
				return nil, struct{}{}, err
			}
		}
		select {
		case <-ts.waitRelease:
		case <-ctx.Done():
			return nil, struct{}{}, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "released"}}}, struct{}{}, nil
	})
	if opts == nil {
		opts = &mcp.StreamableHTTPOptions{}
	}
	opts.Stateless = true
	ts.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, opts)
	return ts
}

func (ts *testServer) release() { ts.releaseOnce.Do(func() { close(ts.waitRelease) }) }

// callWhoami calls the whoami tool and decodes its structured output.
func callWhoami(t testing.TB, cs *mcp.ClientSession) whoami {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "whoami"})
	if err != nil {
		t.Fatalf("whoami: %v", err)
	}
	if res.IsError {
		t.Fatalf("whoami: tool error %+v", res.Content)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var w whoami
	if err := json.Unmarshal(raw, &w); err != nil {
		t.Fatalf("whoami output %s: %v", raw, err)
	}
	return w
}

// headerRoundTripper adds fixed headers to every request.
type headerRoundTripper struct {
	header http.Header
	base   http.RoundTripper
}

func (h headerRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range h.header {
		r.Header[k] = vs
	}
	return h.base.RoundTrip(r)
}

// unixHTTPClient returns an http.Client that reaches socketPath whatever the URL's host.
func unixHTTPClient(socketPath string, header http.Header) *http.Client {
	var d net.Dialer
	base := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", socketPath)
	}}
	return &http.Client{Transport: headerRoundTripper{header: header, base: base}}
}

// serveUnix serves the test server on a fresh socket and returns the socket path.
func serveUnix(t testing.TB, ts *testServer) string {
	t.Helper()
	path := filepath.Join(sockdir.New(t), "run", "postern.sock")
	l, err := ListenUnix(path, UnixAccess{})
	if err != nil {
		t.Fatal(err)
	}
	srv := UnixServer(ts.handler, UnixOptions{})
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	t.Cleanup(func() {
		ts.release()
		srv.Close()
		wg.Wait()
	})
	return path
}

// selfScope is the scope the kernel gives this test process.
func selfScope(t testing.TB) string {
	t.Helper()
	start, err := procfs.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return "run:" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(start, 10)
}

// parentScope is the scope the kernel gives this test process's parent.
func parentScope(t testing.TB) string {
	t.Helper()
	claim, err := BridgeParentClaim()
	if err != nil {
		t.Fatal(err)
	}
	return "run:" + claim
}
