package transport

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestToolContextOnClientDisconnect pins what go-sdk v1.8.0 stateless mode does to a tool
// handler's ctx when the HTTP client goes away mid-call (behind HTTPHandler). The bastion
// relies on it: without StreamableHTTPOptions.PropagateRequestCancellation, or with a client
// on a protocol before 2026-07-28, the handler's ctx is NOT cancelled; the handler runs on and
// its result is dropped. Either way the POST's ServeHTTP returns only when the handler does
// (ServerSession.Close waits for in-flight handlers), so http.Server.Shutdown waits for tools.
func TestToolContextOnClientDisconnect(t *testing.T) {
	tests := []struct {
		name          string
		propagate     bool
		clientVersion string // "" is the client default, 2026-07-28
		wantCancelled bool
	}{
		{name: "default options, 2026-07-28 client", clientVersion: "", wantCancelled: false},
		{name: "default options, 2025-11-25 client", clientVersion: "2025-11-25", wantCancelled: false},
		{name: "PropagateRequestCancellation, 2026-07-28 client", propagate: true, clientVersion: "", wantCancelled: true},
		{name: "PropagateRequestCancellation, 2025-11-25 client", propagate: true, clientVersion: "2025-11-25", wantCancelled: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			outcome := make(chan string, 1)
			srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
			mcp.AddTool(srv, &mcp.Tool{Name: "block"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct{}, error) {
				close(started)
				select {
				case <-ctx.Done():
					outcome <- "cancelled"
				case <-release:
					if ctx.Err() != nil {
						outcome <- "cancelled"
					} else {
						outcome <- "live"
					}
				}
				return &mcp.CallToolResult{}, struct{}{}, nil
			})
			mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
				&mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: tt.propagate})
			token, err := NewToken()
			if err != nil {
				t.Fatal(err)
			}
			h, err := HTTPHandler(mcpHandler, HTTPOptions{Actors: []Actor{{Name: "a", TokenSHA256: HashToken(token)}}})
			if err != nil {
				t.Fatal(err)
			}
			callRequest := make(chan context.Context, 1) // server-side ctx of the tools/call POST
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
				r.Body = io.NopCloser(bytes.NewReader(body))
				if bytes.Contains(body, []byte(`"tools/call"`)) {
					callRequest <- r.Context()
				}
				h.ServeHTTP(w, r)
			}))
			defer hs.Close()
			client := &http.Client{Transport: headerRoundTripper{
				header: http.Header{"Authorization": {"Bearer " + token}},
				base:   http.DefaultTransport,
			}}
			c := mcp.NewClient(&mcp.Implementation{Name: "c", Version: "0"}, nil)
			cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: client},
				&mcp.ClientSessionOptions{ProtocolVersion: tt.clientVersion})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()

			callCtx, cancelCall := context.WithCancel(t.Context())
			callDone := make(chan struct{})
			go func() {
				defer close(callDone)
				cs.CallTool(callCtx, &mcp.CallToolParams{Name: "block"})
			}()
			<-started
			cancelCall() // the client goes away
			<-callDone
			if !tt.wantCancelled {
				// net/http has seen the client go; the handler's ctx is still live.
				<-(<-callRequest).Done()
				close(release)
			}
			select {
			case got := <-outcome:
				if want := map[bool]string{true: "cancelled", false: "live"}[tt.wantCancelled]; got != want {
					t.Errorf("tool ctx after client disconnect: %s; want %s", got, want)
				}
			case <-time.After(time.Minute):
				t.Fatal("tool handler never finished")
			}
		})
	}
}

// TestGuardAgreesWithSDKOnHost: go-sdk v1.8.0's streamable handler has its own DNS-rebinding
// check (on a loopback local address it refuses a Host that is not loopback, unless
// DisableLocalhostProtection) and, with CrossOriginProtection nil as the bastion leaves it,
// no Origin check. The guard runs first; for every Host here the two must give the same
// answer on a loopback listen, so a refusal always comes with the guard's reason.
func TestGuardAgreesWithSDKOnHost(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
	sdk := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true}))
	defer sdk.Close()
	g, err := newGuard([]string{"postern.example"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	local := sdk.Listener.Addr().String()
	for _, host := range []string{
		"localhost", "localhost:1", "LOCALHOST:7410", "Localhost", "127.0.0.1", "127.0.0.1:7410", "127.9.9.9:1",
		"[::1]", "[::1]:7410", "::1", "[::ffff:127.0.0.1]:7410", "[fe80::1%25lo]:1",
		"localhost.", "127.0.0.1.", "evil.example", "evil.example:7410", "postern.example",
		"0x7f.0.0.1", "2130706433", "0.0.0.0", "[::]", "localhost.evil.example", "evil.localhost",
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, sdk.URL, bytes.NewReader([]byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sdkRefuses := resp.StatusCode == http.StatusForbidden
		guardRefuses := g.decide(host, nil, local).status == http.StatusForbidden
		if sdkRefuses != guardRefuses {
			t.Errorf("Host %q: go-sdk refuses %v (status %d), guard refuses %v", host, sdkRefuses, resp.StatusCode, guardRefuses)
		}
	}
}
