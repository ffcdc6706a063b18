package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/tokens"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// ciActor is a remote actor whose tokens the bastion issues.
const ciActor = `[[actors]]
name = "ci"
remote = true`

// dialCounter is an HTTP transport that counts the connections it opens.
type dialCounter struct {
	http.Transport
	dials atomic.Int64
}

func newDialCounter() *dialCounter {
	d := &dialCounter{}
	var dialer net.Dialer
	d.Transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.dials.Add(1)
		return dialer.DialContext(ctx, network, addr)
	}
	return d
}

// TestIssuedTokens: `postern token` issues tokens the running bastion accepts at once; a
// revocation refuses the token's next request on the session (and connection) it already
// has open, an expiry refuses it once the time has come, each with the challenge an MCP
// client reads (401, error="invalid_token"); the daemon's log says which was tried, the
// token log who revoked what, `postern token list` the states — and a restart keeps them.
func TestIssuedTokens(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{"http_sessions = true"}, tables: []string{ciActor}})
	b := f.bastion
	ctx := testContext(t)

	issue := func(args ...string) api.IssuedToken {
		t.Helper()
		var issued api.IssuedToken
		if err := json.Unmarshal(postern(t, b, append([]string{"token", "ci", "--json"}, args...)...), &issued); err != nil {
			t.Fatal(err)
		}
		if !tokens.ValidID(issued.View.ID) || !strings.HasPrefix(issued.Token, "pst_") || issued.View.State != "active" {
			t.Fatalf("issued %+v", issued)
		}
		return issued
	}
	long := issue("--expires", "1h")
	if want := time.Now().Add(time.Hour); long.View.Expires.Before(want.Add(-time.Minute)) || long.View.Expires.After(want) {
		t.Errorf("expires %v; want about an hour from now", long.View.Expires)
	}

	rt := newDialCounter()
	cs := harness.ConnectMCP(t, b.URL, harness.TokenHTTPClient(long.Token, runHeader("ci-run"), rt), nil)
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo issued"}); x.State != "completed" {
		t.Fatalf("call with an issued token = %+v; want completed", x)
	}
	agent := f.session(t, "agent", "agent-run") // a static config token, untouched throughout

	// A plain keep-alive client of the same token, to see the refusal on a connection that
	// was open before the revocation (the go-sdk client may open a new one per request).
	keepAlive := newDialCounter()
	if status, _ := initialize(t, b, &http.Client{Transport: keepAlive}, long.Token); status != http.StatusOK {
		t.Fatalf("initialize with the issued token: %d", status)
	}

	// Revoked while the session is open: its next call is refused, as is the next request
	// on the open connection.
	var rev api.TokenRevocation
	if err := json.Unmarshal(postern(t, b, "token", "revoke", long.View.ID, "--json"), &rev); err != nil || !rev.Changed || rev.View.State != "revoked" {
		t.Fatalf("revoke = %+v, %v", rev, err)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts_list", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "Unauthorized") && !strings.Contains(err.Error(), "401") {
		t.Fatalf("call after revocation on the open session %s: %v; want 401", cs.ID(), err)
	}
	if status, challenge := initialize(t, b, &http.Client{Transport: keepAlive}, long.Token); status != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) {
		t.Fatalf("after revocation: %d %q; want 401 invalid_token", status, challenge)
	}
	if n := keepAlive.dials.Load(); n != 1 {
		t.Errorf("the keep-alive client opened %d connections; want the refusal on the one it had", n)
	}
	if x := mustCall(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "echo static"}); x.State != "completed" {
		t.Fatalf("a static token after another's revocation = %+v", x)
	}
	checkChallenge(t, b, long.Token, "token revoked")

	// An expiring token works until its expiry, and not a request after.
	short := issue("--expires", "4s")
	scs := harness.ConnectMCP(t, b.URL, harness.TokenHTTPClient(short.Token, nil, nil), nil)
	if x := mustCall(t, ctx, scs, "ssh_exec", map[string]any{"host": "h1", "command": "echo short"}); x.State != "completed" {
		t.Fatalf("call before expiry = %+v", x)
	}
	time.Sleep(time.Until(short.View.Expires) + 100*time.Millisecond)
	if _, err := scs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts_list", Arguments: map[string]any{}}); err == nil {
		t.Fatal("a call after expiry was accepted")
	}
	checkChallenge(t, b, short.Token, "token expired")

	// The operator's view.
	states := tokenStates(t, b)
	if states[long.View.ID].State != "revoked" || states[short.View.ID].State != "expired" || states["config:agent"].State != "active" ||
		states[long.View.ID].LastUsed.IsZero() || states["config:agent"].LastUsed.IsZero() || !strings.HasPrefix(states[long.View.ID].RevokedBy, "operator:") {
		t.Fatalf("token list = %+v", states)
	}
	text := string(postern(t, b, "token", "list"))
	if strings.Contains(text, "pst_") || !strings.Contains(text, long.View.ID) {
		t.Fatalf("token list text:\n%s", text)
	}
	testutil.WaitFor(t, "the refusals in the daemon's log", func() bool {
		return strings.Contains(b.Logs(), "refused a revoked token") && strings.Contains(b.Logs(), "refused an expired token")
	})
	if strings.Contains(b.Logs(), long.Token) || strings.Contains(b.Logs(), short.Token) {
		t.Fatal("a token reached the daemon's log")
	}
	events := tokenLog(t, b)
	if len(events) != 3 || events[1].Event != "revoke" || events[1].ID != long.View.ID || !strings.HasPrefix(events[1].By, "operator:") {
		t.Fatalf("token log = %+v; want issue, revoke, issue", events)
	}

	// A restart reads the store: the revoked token stays refused, a new one issued before
	// it is accepted after it.
	kept := issue()
	b.Stop(t)
	b.Start(t)
	checkChallenge(t, b, long.Token, "token revoked")
	kcs := harness.ConnectMCP(t, b.URL, harness.TokenHTTPClient(kept.Token, nil, nil), nil)
	if x := mustCall(t, ctx, kcs, "ssh_exec", map[string]any{"host": "h1", "command": "echo kept"}); x.State != "completed" {
		t.Fatalf("an issued token after a restart = %+v", x)
	}
	for _, name := range []string{tokens.StoreFile, tokens.LogFile} {
		if fi, err := os.Stat(filepath.Join(b.StateDir(), name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v; want mode 0600", name, err)
		}
	}
}

// TestIssuedTokenRefusals: what the daemon refuses to issue or revoke says why; with the
// daemon down a revocation goes to the store, which the next start reads.
func TestIssuedTokenRefusals(t *testing.T) {
	f := newFleet(t, fleetOptions{tables: []string{ciActor}})
	b := f.bastion
	for args, want := range map[string]string{
		"token nobody":                            `no remote actor "nobody"`,
		"token revoke tok_aaaaaaaaaaaaaaaa":       "no token tok_aaaaaaaaaaaaaaaa",
		"token ci --expires 2020-01-01T00:00:00Z": "not in the future",
	} {
		out, err := posternResult(t, b, strings.Fields(args)...)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("postern %s: %v\n%s\nwant an error with %q", args, err, out, want)
		}
	}

	var issued api.IssuedToken
	if err := json.Unmarshal(postern(t, b, "token", "ci", "--json"), &issued); err != nil {
		t.Fatal(err)
	}
	b.Stop(t)
	postern(t, b, "token", "revoke", issued.View.ID)
	b.Start(t)
	checkChallenge(t, b, issued.Token, "token revoked")
}

// TestIssuedTokenTSClient: the official TypeScript SDK's client, whose token expires
// between two calls of one session, gets a clean 401 that names the reason.
func TestIssuedTokenTSClient(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{"http_sessions = true"}, tables: []string{ciActor}})
	ctx := testContext(t)
	var issued api.IssuedToken
	if err := json.Unmarshal(postern(t, f.bastion, "token", "ci", "--expires", "5s", "--json"), &issued); err != nil {
		t.Fatal(err)
	}
	lines := runTS(t, ctx,
		map[string]any{"connect": map[string]any{"url": f.bastion.URL, "token": issued.Token, "run": "ts-run"}},
		sshExecStep(map[string]any{"host": "h1", "command": "echo before"}, nil),
		map[string]any{"sleep_ms": time.Until(issued.View.Expires).Milliseconds() + 300},
		sshExecStep(map[string]any{"host": "h1", "command": "echo after"}, nil),
	)
	if lines[1].Result == nil || lines[1].Result.State != "completed" {
		t.Fatalf("call before expiry: %+v", lines[1])
	}
	if !strings.Contains(lines[3].Error, "token expired") {
		t.Fatalf("call after expiry: %+v; want an error naming the expired token", lines[3])
	}
}

// checkChallenge posts an MCP initialize with token and checks the 401 and its challenge.
func checkChallenge(t *testing.T, b *harness.Bastion, token, why string) {
	t.Helper()
	status, challenge := initialize(t, b, &http.Client{}, token)
	if status != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, why) {
		t.Fatalf("status %d, WWW-Authenticate %q; want 401 with invalid_token (%s)", status, challenge, why)
	}
}

// initialize posts an MCP initialize with token over hc, reads the whole answer (so that
// the connection can be reused) and returns its status and challenge.
func initialize(t *testing.T, b *harness.Bastion, hc *http.Client, token string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	req, err := http.NewRequest(http.MethodPost, b.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

func tokenStates(t *testing.T, b *harness.Bastion) map[string]api.TokenView {
	t.Helper()
	var list api.TokenList
	if err := json.Unmarshal(postern(t, b, "token", "list", "--json"), &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]api.TokenView{}
	for _, v := range list.Tokens {
		out[v.ID] = v
	}
	return out
}

func tokenLog(t *testing.T, b *harness.Bastion) []tokens.Event {
	t.Helper()
	fh, err := os.Open(filepath.Join(b.StateDir(), tokens.LogFile))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var out []tokens.Event
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var ev tokens.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// posternResult runs the operator CLI against b and returns its stdout and stderr together,
// and how it exited.
func posternResult(t *testing.T, b *harness.Bastion, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(harness.Binary(t, "postern"), append(args, "--config", b.ConfigPath)...).CombinedOutput()
	return string(out), err
}
