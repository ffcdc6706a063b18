package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// Bastion is a `postern serve` process for tests, with two actors ("agent" and "other")
// whose tokens it knows, and the SSH client key of the hostagents it enrolls.
type Bastion struct {
	Dir, ConfigPath, Addr string
	// URL is the Streamable HTTP MCP endpoint; Socket the local one.
	URL, Socket, OperatorSocket string
	// Tokens are the bearer tokens by actor name.
	Tokens map[string]string
	// ClientKey is the bastion's SSH key (hostagents from NewHostagent authorize it).
	ClientKey testutil.SSHKey
	// Bin is the postern binary Start runs; default the one Binary builds. RunRelease sets
	// another release's.
	Bin string
	// addedApprovals is the [approvals] table NewBastion added to the config, which
	// RunRelease takes out again.
	addedApprovals string

	daemon
}

// NewBastion prepares a bastion (config, state dir, client key) without starting it. It
// authenticates to hostagents with key, the ClientKey of the hostagents it will enroll.
// extraConfig lines (settings, then any tables) are added to the TOML config.
func NewBastion(t testing.TB, key testutil.SSHKey, extraConfig ...string) *Bastion {
	t.Helper()
	dir := sockdir.New(t) // holds the MCP and operator sockets
	b := &Bastion{
		Dir: dir, ConfigPath: filepath.Join(dir, "postern.toml"), Addr: testutil.FreeAddr(t),
		Tokens: map[string]string{}, ClientKey: key, daemon: daemon{what: "bastion"},
	}
	stateDir := filepath.Join(dir, "state")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	key.WritePrivateKey(t, filepath.Join(stateDir, "bastion_ed25519"))
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "state_dir = %q\nlisten = %q\nreconcile_interval = \"1s\"\n", stateDir, b.Addr)
	// The extra lines go before the generated tables, so that plain settings stay top-level.
	cfg.WriteString(strings.Join(extraConfig, "\n") + "\n")
	for _, name := range []string{"agent", "other"} {
		tok, err := transport.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		b.Tokens[name] = tok
		fmt.Fprintf(&cfg, "[[actors]]\nname = %q\ntoken_sha256 = %q\n", name, transport.HashToken(tok))
	}
	if !strings.Contains(cfg.String(), "[approvals]") {
		// The tests' agents are remote token actors and root, the bastion's own user here, is
		// their operator: it must be named, since by default the bastion's user may not
		// approve. Tests of who may approve write their own [approvals].
		b.addedApprovals = "[approvals]\noperators = [\"root\"]\n"
		cfg.WriteString(b.addedApprovals)
	}
	if err := os.WriteFile(b.ConfigPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c := config.DefaultConfig(stateDir)
	b.URL = "http://" + b.Addr + bastion.MCPPath
	b.Socket, b.OperatorSocket = c.SocketPath(), c.OperatorSocketPath()
	t.Cleanup(func() { b.Kill(t) })
	return b
}

// RunRelease makes Start run another release's postern binary (skew tests). The config
// loses the [approvals] table NewBastion added: a release before it refuses keys it does not
// know, and let its token actors' operator approve without one.
func (b *Bastion) RunRelease(t testing.TB, bin string) {
	t.Helper()
	b.Bin = bin
	if b.addedApprovals == "" {
		return
	}
	cfg, err := os.ReadFile(b.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.ConfigPath, []byte(strings.Replace(string(cfg), b.addedApprovals, "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	b.addedApprovals = ""
}

// StateDir is the bastion's state dir.
func (b *Bastion) StateDir() string { return filepath.Join(b.Dir, "state") }

// Enroll records h in the bastion's inventory under name, with the key h presents.
func (b *Bastion) Enroll(t testing.TB, name string, h *Hostagent) {
	t.Helper()
	b.EnrollAt(t, name, h.Addr, h)
}

// EnrollAt enrolls h under name but reached at addr (a fault proxy in front of it).
func (b *Bastion) EnrollAt(t testing.TB, name, addr string, h *Hostagent) {
	t.Helper()
	inv := config.DefaultConfig(b.StateDir()).InventoryPath()
	if err := fleet.Enroll(inv, fleet.Host{Name: name, Addr: addr, Account: h.Account, HostKey: h.HostKey}); err != nil {
		t.Fatal(err)
	}
}

// Start runs `postern serve` (again), with serveArgs added (--hold), and waits until it
// serves.
func (b *Bastion) Start(t testing.TB, serveArgs ...string) {
	t.Helper()
	bin := b.Bin
	if bin == "" {
		bin = Binary(t, "postern")
	}
	b.start(t, "postern: serving", bin, append([]string{"serve", "--config", b.ConfigPath}, serveArgs...)...)
}

// bearer adds a bearer token (and optional extra headers) to every request.
type bearer struct {
	token  string
	header http.Header
	next   http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	for k, v := range b.header {
		r.Header[k] = v
	}
	return b.next.RoundTrip(r)
}

// BearerClient returns an HTTP client that sends token as its bearer token.
func BearerClient(token string) *http.Client {
	return &http.Client{Transport: bearer{token: token, next: &http.Transport{}}}
}

// HTTPClient returns an HTTP client that authenticates as actor, adding header to every
// request, over rt (nil: a fresh transport).
func (b *Bastion) HTTPClient(actor string, header http.Header, rt http.RoundTripper) *http.Client {
	return TokenHTTPClient(b.Tokens[actor], header, rt)
}

// TokenHTTPClient returns an HTTP client that sends token as its bearer token and header
// with every request, over rt (nil: a fresh transport).
func TokenHTTPClient(token string, header http.Header, rt http.RoundTripper) *http.Client {
	if rt == nil {
		rt = &http.Transport{}
	}
	return &http.Client{Transport: bearer{token: token, header: header, next: rt}}
}

// Connect opens an MCP client session (the go-sdk client, Streamable HTTP) as actor.
func (b *Bastion) Connect(t testing.TB, actor string, header http.Header) *mcp.ClientSession {
	t.Helper()
	return ConnectMCP(t, b.URL, b.HTTPClient(actor, header, nil), nil)
}

// ConnectMCP opens a go-sdk client session to url over hc.
func ConnectMCP(t testing.TB, url string, hc *http.Client, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "postern-test", Version: "0"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect MCP %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// CallTool calls a tool and decodes its structured result into out (if the call
// succeeded). It returns the raw result and the call error.
func CallTool(ctx context.Context, cs *mcp.ClientSession, name string, args any, out any) (*mcp.CallToolResult, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, err
	}
	if out != nil && res.StructuredContent != nil {
		raw, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return res, err
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return res, err
		}
	}
	return res, nil
}

// ResultText joins a tool result's text content.
func ResultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}
