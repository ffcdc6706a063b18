package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/testop"
)

// The OAuth tests run a real OpenID Provider (internal/testutil/testop: zitadel/oidc's op on
// 127.0.0.1), a real `postern serve` configured as its protected resource, a real hostagent,
// and the official TypeScript SDK as the client (tsclient/oauth.mjs), which finds everything
// from the bastion's 401: the resource metadata, the provider's metadata, its token endpoint.

var (
	deployAccount = testop.ServiceAccount{ID: "svc-deploy", Secret: "deploy-secret"}
	// laterAccount is a service account no rule maps until a reload adds one.
	laterAccount = testop.ServiceAccount{ID: "svc-later", Secret: "later-secret"}
	// opaqueAccount gets opaque tokens, which the bastion introspects as bastionClient.
	opaqueAccount = testop.ServiceAccount{ID: "svc-opaque", Secret: "opaque-secret", Opaque: true}
	bastionClient = testop.ServiceAccount{ID: "postern-rs", Secret: "rs-secret"}
	// oauthPublicClient is the provider's public client for authorization code + PKCE.
	oauthPublicClient = "postern-cli"
)

// oauthBed is a fleet whose bastion takes the provider's tokens.
type oauthBed struct {
	*testbed
	op *testop.Provider
}

// startOAuthFleet starts a hostagent, a provider whose tokens are for the bastion's MCP URL,
// and the bastion: svc-deploy maps to the actor deploy, the provider's user (group sre) to
// people; postern:read allows the readers, postern:exec ssh_exec.
func startOAuthFleet(t *testing.T) *oauthBed {
	t.Helper()
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey, "[[actors]]\nname = \"deploy\"\nremote = true\n[[actors]]\nname = \"people\"\nremote = true")
	op := testop.Start(t, testop.Options{
		Audience:        []string{b.URL},
		ServiceAccounts: []testop.ServiceAccount{deployAccount, laterAccount, opaqueAccount, bastionClient},
		PublicClient:    oauthPublicClient,
		UserGroups:      []string{"sre"},
	})
	secret := filepath.Join(t.TempDir(), "introspection.secret")
	if err := os.WriteFile(secret, []byte(bastionClient.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	oauthTable := fmt.Sprintf(`[oauth]
issuer = %q
resource = %q
introspection_url = %q
introspection_client_id = %q
introspection_secret_file = %q
[[oauth.actors]]
actor = "deploy"
clients = [%q, %q]
[[oauth.actors]]
actor = "people"
groups = ["sre"]
[oauth.scope_tools]
"postern:read" = ["hosts_list", "execution_status", "execution_output", "executions_list"]
"postern:exec" = ["ssh_exec", "execution_status", "execution_output"]
`, op.Issuer, b.URL, op.Issuer+"/oauth/introspect", bastionClient.ID, secret, deployAccount.ID, opaqueAccount.ID)
	appendConfig(t, b, oauthTable)
	b.EnrollAt(t, "h1", h.Addr, h)
	b.Start(t)
	bed := &oauthBed{testbed: &testbed{bastion: b, host: h}, op: op}
	bed.logOnFailure(t)
	return bed
}

// appendConfig adds text to the end of the bastion's config file.
func appendConfig(t *testing.T, b *harness.Bastion, text string) {
	t.Helper()
	f, err := os.OpenFile(b.ConfigPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// tsOAuthLine is a line oauth.mjs prints.
type tsOAuthLine struct {
	Result   *api.Execution `json:"result"`
	IsError  bool           `json:"is_error"`
	Error    string         `json:"error"`
	Requests []string       `json:"requests"`
}

// runTSOAuth runs oauth.mjs with opts and returns its call lines and its requests.
func runTSOAuth(t *testing.T, ctx context.Context, opts map[string]any) ([]tsOAuthLine, []string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (.ci/run installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(tsClientDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed: run `npm ci --prefix integration/tsclient` (scripts/test does): %v", err)
	}
	arg, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, "oauth.mjs", string(arg))
	cmd.Dir = tsClientDir
	cmd.Stderr = testWriter{t}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("oauth.mjs: %v; output:\n%s", err, out)
	}
	lines := jsonLines[tsOAuthLine](t, "oauth.mjs", out)
	if len(lines) == 0 || lines[len(lines)-1].Requests == nil {
		t.Fatalf("oauth.mjs printed no requests line:\n%s", out)
	}
	t.Logf("requests:\n  %s", strings.Join(lines[len(lines)-1].Requests, "\n  "))
	return lines[:len(lines)-1], lines[len(lines)-1].Requests
}

// requestIndex is the index of the first request after from that starts with prefix and
// ends with status, or -1.
func requestIndex(requests []string, from int, prefix, status string) int {
	for i := max(from, 0); i < len(requests); i++ {
		if strings.HasPrefix(requests[i], prefix) && strings.HasSuffix(requests[i], " "+status) {
			return i
		}
	}
	return -1
}

// mustDiscoverInOrder checks that requests show the spec's discovery: the MCP endpoint's 401,
// the protected resource metadata, the provider's metadata, its token endpoint, and the MCP
// endpoint again, answered.
func mustDiscoverInOrder(t *testing.T, requests []string, b *harness.Bastion, op *testop.Provider, tokenStep string) {
	t.Helper()
	base := strings.TrimSuffix(b.URL, "/mcp")
	i := requestIndex(requests, 0, "POST "+b.URL, "401")
	for _, step := range []struct{ prefix, status string }{
		{"GET " + base + "/.well-known/oauth-protected-resource/mcp", "200"},
		{"GET " + op.Issuer + "/.well-known/", "200"},
		{tokenStep, "200"},
		{"POST " + b.URL, "200"},
	} {
		if i < 0 {
			break
		}
		i = requestIndex(requests, i+1, step.prefix, step.status)
	}
	if i < 0 {
		t.Fatalf("the client did not go 401 → resource metadata → provider metadata → token → MCP:\n  %s", strings.Join(requests, "\n  "))
	}
}

// TestOAuthClientCredentialsTSClient: a service account's client (the TypeScript SDK's
// ClientCredentialsProvider) discovers the provider from the bastion's 401, gets a token, and
// runs ssh_exec on a real hostagent as the actor its client id maps to; the journal names the
// token's subject on the call and the run.
func TestOAuthClientCredentialsTSClient(t *testing.T) {
	f := startOAuthFleet(t)
	ctx := testContext(t)
	lines, requests := runTSOAuth(t, ctx, map[string]any{
		"url": f.bastion.URL, "grant": "client_credentials", "issuer": f.op.Issuer,
		"client_id": deployAccount.ID, "client_secret": deployAccount.Secret, "scope": "postern:exec",
		"calls": []map[string]any{{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "echo oauth-ok"}}},
	})
	mustDiscoverInOrder(t, requests, f.bastion, f.op, "POST "+f.op.Issuer+"/oauth/token")
	if !strings.Contains(f.bastion.Logs(), "oauth: the issuer's keys fetched") {
		t.Error("the bastion did not log the keys it fetched at start")
	}
	if len(lines) != 1 || lines[0].Result == nil || lines[0].Result.State != "completed" || strings.TrimSpace(lines[0].Result.Stdout) != "oauth-ok" {
		t.Fatalf("ssh_exec: %+v", lines)
	}
	id := lines[0].Result.ExecutionID
	waitForDelivery(t, f.bastion, id)
	inv := investigate(t, f.bastion, id)
	if len(inv.Calls) != 1 || inv.Calls[0].Subject != deployAccount.ID || inv.Record.Actor != "token:deploy" {
		t.Fatalf("calls %+v of actor %s; want one call of token:deploy with subject %s", inv.Calls, inv.Record.Actor, deployAccount.ID)
	}
	if len(inv.Runs) != 1 || inv.Runs[0].Subject != deployAccount.ID || inv.Runs[0].Token != "deploy" {
		t.Fatalf("runs %+v; want deploy's run with subject %s", inv.Runs, deployAccount.ID)
	}
	// The static tokens of the quick start go on working next to OAuth.
	cs := f.bastion.Connect(t, "agent", nil)
	defer cs.Close()
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo static"}); x.State != "completed" {
		t.Fatalf("static token: %+v", x)
	}
}

// TestOAuthScopesNarrowTools: a token whose scopes do not allow ssh_exec is answered 403
// insufficient_scope (naming postern:exec, transport's TestOAuthRefusals checks the header)
// before anything runs. The TypeScript SDK tries to step up once — its client_credentials
// provider asks for its configured scope again, not the one the 403 names — and gives up;
// a token with the scope then runs the command once.
func TestOAuthScopesNarrowTools(t *testing.T) {
	f := startOAuthFleet(t)
	ctx := testContext(t)
	file := filepath.Join(t.TempDir(), "effects")
	exec := map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "echo once >> " + file}}
	lines, requests := runTSOAuth(t, ctx, map[string]any{
		"url": f.bastion.URL, "grant": "client_credentials", "issuer": f.op.Issuer,
		"client_id": deployAccount.ID, "client_secret": deployAccount.Secret, "scope": "postern:read",
		"calls": []map[string]any{{"name": "hosts_list"}, exec},
	})
	if len(lines) != 2 || lines[0].Error != "" || lines[0].IsError || !strings.Contains(lines[1].Error, "403") {
		t.Fatalf("calls: %+v; want hosts_list answered and ssh_exec refused 403", lines)
	}
	first := requestIndex(requests, 0, "POST "+f.bastion.URL, "403")
	if first < 0 || requestIndex(requests, first, "POST "+f.op.Issuer+"/oauth/token", "200") < 0 || requestIndex(requests, first+1, "POST "+f.bastion.URL, "403") < 0 {
		t.Fatalf("want a 403, one new token, one more 403:\n  %s", strings.Join(requests, "\n  "))
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the command ran %d times before its scope was granted", n)
	}
	lines, _ = runTSOAuth(t, ctx, map[string]any{
		"url": f.bastion.URL, "grant": "client_credentials", "issuer": f.op.Issuer,
		"client_id": deployAccount.ID, "client_secret": deployAccount.Secret, "scope": "postern:read postern:exec",
		"calls": []map[string]any{exec},
	})
	if len(lines) != 1 || lines[0].Result == nil || lines[0].Result.State != "completed" {
		t.Fatalf("with the scope: %+v", lines)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times; want 1", n)
	}
}

// TestOAuthAuthorizationCodePKCE: a person's client (authorization code with PKCE, the
// browser's redirects followed headlessly; the provider logs its user in without a form)
// runs ssh_exec as the actor the user's group maps to.
func TestOAuthAuthorizationCodePKCE(t *testing.T) {
	f := startOAuthFleet(t)
	ctx := testContext(t)
	lines, requests := runTSOAuth(t, ctx, map[string]any{
		"url": f.bastion.URL, "grant": "authorization_code", "client_id": oauthPublicClient, "scope": "openid postern:exec",
		"calls": []map[string]any{{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "echo pkce-ok"}}},
	})
	if requestIndex(requests, 0, "GET "+f.op.Issuer+"/authorize", "302") < 0 {
		t.Fatalf("no authorization request:\n  %s", strings.Join(requests, "\n  "))
	}
	if len(lines) != 1 || lines[0].Result == nil || lines[0].Result.State != "completed" || strings.TrimSpace(lines[0].Result.Stdout) != "pkce-ok" {
		t.Fatalf("ssh_exec: %+v", lines)
	}
	id := lines[0].Result.ExecutionID
	waitForDelivery(t, f.bastion, id)
	inv := investigate(t, f.bastion, id)
	if len(inv.Calls) != 1 || inv.Calls[0].Subject != testop.UserSubject || inv.Record.Actor != "token:people" {
		t.Fatalf("calls %+v of actor %s; want token:people with subject %s", inv.Calls, inv.Record.Actor, testop.UserSubject)
	}
}

// TestOAuthReloadMapsAnActor: a valid token no rule maps is refused 403 and reaches nothing;
// a rule added to the config and `postern reload` map it from its next request on, without a
// restart, and the call runs as the actor the new rule names.
func TestOAuthReloadMapsAnActor(t *testing.T) {
	f := startOAuthFleet(t)
	ctx := testContext(t)
	token, err := f.op.ClientCredentialsToken(ctx, laterAccount, "postern:exec")
	if err != nil {
		t.Fatal(err)
	}
	hc := harness.TokenHTTPClient(token, nil, nil)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.bastion.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "insufficient_scope") {
		t.Fatalf("an unmapped token: %s %q; want 403 insufficient_scope", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	appendConfig(t, f.bastion, fmt.Sprintf("[[oauth.actors]]\nactor = \"deploy\"\nsubjects = [%q]\n", laterAccount.ID))
	if out := string(postern(t, f.bastion, "reload")); !strings.Contains(out, "oauth.actors: 2 rules before, 3 now") {
		t.Fatalf("postern reload said:\n%s", out)
	}
	cs := harness.ConnectMCP(t, f.bastion.URL, hc, nil)
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo mapped"})
	if x.State != "completed" {
		t.Fatalf("after the reload: %+v", x)
	}
	waitForDelivery(t, f.bastion, x.ExecutionID)
	if inv := investigate(t, f.bastion, x.ExecutionID); inv.Record.Actor != "token:deploy" || len(inv.Calls) != 1 || inv.Calls[0].Subject != laterAccount.ID {
		t.Fatalf("actor %s, calls %+v; want token:deploy with subject %s", inv.Record.Actor, inv.Calls, laterAccount.ID)
	}
}

// TestOAuthOpaqueTokenIntrospected: an opaque token (not a JWT) is introspected at the
// provider by the bastion, with the client and the secret file its config names, and runs
// ssh_exec as the actor its client maps to, its subject journaled.
func TestOAuthOpaqueTokenIntrospected(t *testing.T) {
	f := startOAuthFleet(t)
	ctx := testContext(t)
	token, err := f.op.ClientCredentialsToken(ctx, opaqueAccount, "postern:exec")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(token, ".") == 2 {
		t.Fatal("the provider issued a JWT, not an opaque token")
	}
	cs := harness.ConnectMCP(t, f.bastion.URL, harness.TokenHTTPClient(token, nil, nil), nil)
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo opaque"})
	if x.State != "completed" {
		t.Fatalf("ssh_exec: %+v", x)
	}
	waitForDelivery(t, f.bastion, x.ExecutionID)
	if inv := investigate(t, f.bastion, x.ExecutionID); inv.Record.Actor != "token:deploy" || len(inv.Calls) != 1 || inv.Calls[0].Subject != opaqueAccount.ID {
		t.Fatalf("actor %s, calls %+v; want token:deploy with subject %s", inv.Record.Actor, inv.Calls, opaqueAccount.ID)
	}
}
