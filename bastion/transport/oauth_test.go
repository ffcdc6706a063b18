package transport

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/oauth"
	"github.com/postern-dev/postern/internal/testutil/testop"
)

// oauthFixture is the test server behind HTTPHandler on 127.0.0.1 with OAuth, a real OpenID
// Provider (testop) issuing its tokens, a static token for alice, and the verifier's clock.
type oauthFixture struct {
	url, base  string
	op         *testop.Provider
	innerCalls atomic.Int64
	static     string
	clockMu    sync.Mutex
	offset     time.Duration
}

var (
	deployBot = testop.ServiceAccount{ID: "svc-deploy", Secret: "s3cret-deploy", Groups: []string{"deployers"}}
	stranger  = testop.ServiceAccount{ID: "svc-stranger", Secret: "s3cret-stranger"}
	// opaqueBot gets opaque tokens; introspector is the bastion's client for introspecting.
	opaqueBot    = testop.ServiceAccount{ID: "svc-opaque", Secret: "s3cret-opaque", Groups: []string{"deployers"}, Opaque: true}
	introspector = testop.ServiceAccount{ID: "postern-rs", Secret: "s3cret-rs"}
)

func (f *oauthFixture) now() time.Time {
	f.clockMu.Lock()
	defer f.clockMu.Unlock()
	return time.Now().Add(f.offset)
}

func (f *oauthFixture) advance(d time.Duration) {
	f.clockMu.Lock()
	defer f.clockMu.Unlock()
	f.offset += d
}

func newOAuthFixture(t *testing.T) *oauthFixture {
	t.Helper()
	return newOAuthFixtureWith(t, nil)
}

// newOAuthFixtureWith is newOAuthFixture with the verifier's options changed by mutate
// (given the provider's issuer).
func newOAuthFixtureWith(t *testing.T, mutate func(o *oauth.Options, issuer string)) *oauthFixture {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &oauthFixture{base: "http://" + ln.Addr().String()}
	f.url = f.base + "/mcp"
	f.op = testop.Start(t, testop.Options{Audience: []string{f.url}, ServiceAccounts: []testop.ServiceAccount{deployBot, stranger, opaqueBot, introspector}})
	opts := oauth.Options{
		Issuer: f.op.Issuer, Resource: f.url, Now: f.now,
		Rules: oauth.Rules{
			Actors:     []oauth.Rule{{Actor: "deploy", Groups: []string{"deployers"}}},
			ScopeTools: map[string][]string{"postern:read": {"whoami"}, "postern:wait": {"wait"}},
		},
	}
	if mutate != nil {
		mutate(&opts, f.op.Issuer)
	}
	v, err := oauth.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f.static = tok
	ts := newTestServer(t, nil)
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.innerCalls.Add(1)
		ts.handler.ServeHTTP(w, r)
	})
	h, err := HTTPHandler(counted, HTTPOptions{
		Actors: []Actor{{Name: "alice", TokenSHA256: HashToken(tok)}, {Name: "deploy"}},
		OAuth:  v,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	for _, p := range v.MetadataPaths() {
		mux.Handle(p, OAuthMetadataHandler(v))
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return f
}

func (f *oauthFixture) token(t *testing.T, account testop.ServiceAccount, scope string) string {
	t.Helper()
	tok, err := f.op.ClientCredentialsToken(t.Context(), account, scope)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// post sends one JSON-RPC body with token; it returns the status, the challenge and the body.
func (f *oauthFixture) post(t *testing.T, token, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(data)
}

func (f *oauthFixture) connect(t *testing.T, token string) (*mcp.ClientSession, error) {
	t.Helper()
	client := &http.Client{Transport: headerRoundTripper{header: http.Header{"Authorization": {"Bearer " + token}}, base: http.DefaultTransport}}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "0"}, nil)
	return c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: f.url, HTTPClient: client}, nil)
}

const listToolsBody = `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`

func TestOAuthDiscoveryStartsFromThe401(t *testing.T) {
	f := newOAuthFixture(t)
	status, challenge, _ := f.post(t, "", listToolsBody)
	wantMeta := f.base + "/.well-known/oauth-protected-resource/mcp"
	if status != 401 || !strings.Contains(challenge, `resource_metadata="`+wantMeta+`"`) || strings.Contains(challenge, "error=") {
		t.Fatalf("no token: %d %q; want 401 naming %s without an error", status, challenge, wantMeta)
	}
	for _, path := range []string{"/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"} {
		resp, err := http.Get(f.base + path)
		if err != nil {
			t.Fatal(err)
		}
		var md struct {
			Resource             string   `json:"resource"`
			AuthorizationServers []string `json:"authorization_servers"`
			ScopesSupported      []string `json:"scopes_supported"`
		}
		err = json.NewDecoder(resp.Body).Decode(&md)
		resp.Body.Close()
		if err != nil || md.Resource != f.url || len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != f.op.Issuer ||
			strings.Join(md.ScopesSupported, " ") != "postern:read postern:wait" {
			t.Fatalf("%s: %+v %v", path, md, err)
		}
	}
	if n := f.innerCalls.Load(); n != 0 {
		t.Fatalf("the MCP handler saw %d requests", n)
	}
}

func TestOAuthTokenMapsToActorWithSubject(t *testing.T) {
	f := newOAuthFixture(t)
	cs, err := f.connect(t, f.token(t, deployBot, "postern:read"))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	got := callWhoami(t, cs)
	if !got.OK || got.Caller != (Caller{Actor: "token:deploy", Subject: deployBot.ID}) || got.SawAuthorization {
		t.Fatalf("whoami = %+v", got)
	}
	// The static token goes on working next to OAuth, without a subject.
	cs2, err := f.connect(t, f.static)
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	if got := callWhoami(t, cs2); got.Caller != (Caller{Actor: "token:alice"}) {
		t.Fatalf("static token: whoami = %+v", got)
	}
}

func TestOAuthRefusals(t *testing.T) {
	f := newOAuthFixture(t)
	good := f.token(t, deployBot, "postern:read")
	callWait := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{}}}`

	// A valid token no rule maps: 403, and the handler never sees it.
	status, challenge, body := f.post(t, f.token(t, stranger, "postern:read"), listToolsBody)
	if status != 403 || !strings.Contains(challenge, `error="insufficient_scope"`) || !strings.Contains(body, "maps to no actor") {
		t.Fatalf("unmapped token: %d %q %q", status, challenge, body)
	}
	// A tool the scopes do not allow: 403 insufficient_scope naming the scope that would.
	status, challenge, _ = f.post(t, good, callWait)
	if status != 403 || !strings.Contains(challenge, `error="insufficient_scope"`) || !strings.Contains(challenge, `scope="postern:wait"`) {
		t.Fatalf("tool outside the scopes: %d %q", status, challenge)
	}
	// Nor in a batch, nor spelled so that another decoder would read another name.
	for _, b := range []string{
		`[` + listToolsBody + `,` + callWait + `]`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","NAME":"whoami"}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","name":"wait"}}`,
		`{"jsonrpc":"2.0","id":2,"Method":"tools/call","method":"tools/call","params":{"name":"wait"}}`,
	} {
		if status, _, _ := f.post(t, good, b); status != 403 && status != 400 {
			t.Fatalf("%s: %d, want 403 or 400", b, status)
		}
	}
	if n := f.innerCalls.Load(); n != 0 {
		t.Fatalf("the MCP handler saw %d refused requests", n)
	}
	// The allowed tool goes through.
	if status, _, body := f.post(t, good, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`); status != 200 {
		t.Fatalf("allowed tool: %d %s", status, body)
	}

	// Expired: the verifier's clock 10 minutes on (the provider's tokens live 5).
	f.advance(10 * time.Minute)
	status, challenge, _ = f.post(t, good, listToolsBody)
	if status != 401 || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, "expired") || !strings.Contains(challenge, "resource_metadata=") {
		t.Fatalf("expired token: %d %q", status, challenge)
	}
}

func TestOAuthKeyRotationKeepsClientsWorking(t *testing.T) {
	f := newOAuthFixture(t)
	old := f.token(t, deployBot, "postern:read")
	if status, _, body := f.post(t, old, listToolsBody); status != 200 {
		t.Fatalf("before the rotation: %d %s", status, body)
	}
	// The provider rotates: a new key signs, the old one is withdrawn.
	f.op.Rotate(t, false)
	f.advance(time.Minute) // past the refetch interval
	fresh := f.token(t, deployBot, "postern:read")
	if status, _, body := f.post(t, fresh, listToolsBody); status != 200 {
		t.Fatalf("a token of the new key: %d %s", status, body)
	}
	// The withdrawn key's token is refused (revoked kid) with invalid_token.
	status, challenge, _ := f.post(t, old, listToolsBody)
	if status != 401 || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, "key set") {
		t.Fatalf("a token of the withdrawn key: %d %q", status, challenge)
	}
}

func TestToolCalls(t *testing.T) {
	for body, want := range map[string]string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ssh_exec"}}`:                   "ssh_exec",
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`:                                                "",
		`[{"method":"tools/call","params":{"name":"a"}},{"method":"tools/call","params":{"name":"b"}}]`: "a b",
		`{"method":"tools\/call","params":{"n\u0061me":"x"}}`:                                           "x",
		`{"method":"notifications/initialized"}`:                                                        "",
	} {
		got, err := ToolCalls([]byte(body))
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("ToolCalls(%s) = %q, %v; want %q", body, got, err, want)
		}
	}
	for _, body := range []string{
		`{"method":"tools/call","params":{"name":"a","NAME":"b"}}`,
		`{"method":"tools/call","params":{"name":"a","name":"b"}}`,
		`{"method":"tools/call","METHOD":"x","params":{"name":"a"}}`,
		`{"method":"tools/call","params":{"name":"a"},"Params":{}}`,
		`{"method":"tools/call","params":{"name":7}}`,
		`{"method":"tools/call","params":"x"}`,
		`{"method":"tools/call","params":{"name":"a"}} {}`,
		`not json`,
	} {
		if got, err := ToolCalls([]byte(body)); err == nil {
			t.Errorf("ToolCalls(%s) = %q, want refused", body, got)
		}
	}
}

// FuzzToolCalls: whatever the body, ToolCalls either refuses it or names exactly the tools a
// decoder that reads members by their exact names finds (go-sdk's does).
func FuzzToolCalls(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ssh_exec"}}`))
	f.Add([]byte(`[{"method":"tools/call","params":{"name":"a"}},{"method":"x"}]`))
	f.Add([]byte(`{"method":"tools/call","params":{"name":"a","NAME":"b"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		tools, err := ToolCalls(body)
		if err != nil {
			return
		}
		// The oracle: members by exact name (as go-sdk's case-sensitive decoder reads them).
		var msgs []map[string]json.RawMessage
		trimmed := bytes.TrimSpace(body)
		if len(trimmed) > 0 && trimmed[0] == '[' {
			if json.Unmarshal(trimmed, &msgs) != nil {
				t.Fatalf("accepted a batch encoding/json refuses: %q", body)
			}
		} else {
			var m map[string]json.RawMessage
			if json.Unmarshal(trimmed, &m) != nil {
				t.Fatalf("accepted a message encoding/json refuses: %q", body)
			}
			msgs = append(msgs, m)
		}
		var want []string
		for _, m := range msgs {
			var method string
			if json.Unmarshal(m["method"], &method) != nil || method != "tools/call" {
				continue
			}
			var p map[string]json.RawMessage
			var name string
			if json.Unmarshal(m["params"], &p) != nil || json.Unmarshal(p["name"], &name) != nil {
				t.Fatalf("accepted params encoding/json refuses: %q", body)
			}
			want = append(want, name)
		}
		if strings.Join(tools, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("ToolCalls(%q) = %q, encoding/json reads %q", body, tools, want)
		}
	})
}

// TestOAuthForgedTokensRefused: tokens a resource must refuse — signed by the provider's
// own key but for another audience or issuer, expired, without exp; alg=none; HS256 with a
// secret and with the provider's public key as the secret; a key the provider never
// published — are each answered 401 invalid_token with the metadata URL, and none reaches
// the MCP handler.
func TestOAuthForgedTokensRefused(t *testing.T) {
	f := newOAuthFixture(t)
	now := time.Now()
	claims := func(over map[string]any) map[string]any {
		c := map[string]any{"iss": f.op.Issuer, "sub": "svc-deploy", "aud": []string{f.url}, "client_id": "svc-deploy",
			"groups": []string{"deployers"}, "scope": "postern:read", "exp": now.Add(5 * time.Minute).Unix(), "iat": now.Unix()}
		for k, v := range over {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	good := f.op.Sign(t, claims(nil))
	if status, _, body := f.post(t, good, listToolsBody); status != 200 {
		t.Fatalf("a good token signed by the provider's key: %d %s", status, body)
	}
	// The provider's public key, as JSON, for the HS256 key-confusion forgery.
	resp, err := http.Get(f.op.Issuer + "/keys")
	if err != nil {
		t.Fatal(err)
	}
	jwks, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hs := func(secret []byte, c map[string]any) string {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), f.op.KeyID()))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(signer).Claims(c).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	none := func(c map[string]any) string {
		payload, _ := json.Marshal(c)
		return base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + base64.RawURLEncoding.EncodeToString(payload) + "."
	}
	stranger, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	strangerSigned := func() string {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: stranger}, (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), "never-published"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(signer).Claims(claims(nil)).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}()
	for _, tc := range []struct{ name, token, says string }{
		{"another audience", f.op.Sign(t, claims(map[string]any{"aud": []string{"https://other.example/mcp"}})), "audience"},
		{"another issuer", f.op.Sign(t, claims(map[string]any{"iss": "https://evil.example"})), "issued by"},
		{"expired", f.op.Sign(t, claims(map[string]any{"exp": now.Add(-10 * time.Minute).Unix(), "iat": now.Add(-time.Hour).Unix()})), "expired"},
		{"no exp", f.op.Sign(t, claims(map[string]any{"exp": nil})), "no expiry"},
		{"alg none", none(claims(nil)), "accepted algorithm"},
		{"HS256 with a secret", hs([]byte("0123456789abcdef0123456789abcdef"), claims(nil)), "accepted algorithm"},
		{"HS256 with the public key as the secret", hs(jwks, claims(nil)), "accepted algorithm"},
		{"a key never published", strangerSigned, "key set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, challenge, _ := f.post(t, tc.token, listToolsBody)
			if status != 401 || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, tc.says) ||
				!strings.Contains(challenge, `resource_metadata="`+f.base+`/.well-known/oauth-protected-resource/mcp"`) {
				t.Fatalf("%d %q; want 401 invalid_token saying %q with the metadata URL", status, challenge, tc.says)
			}
		})
	}
	if n := f.innerCalls.Load(); n != 1 {
		t.Fatalf("the MCP handler saw %d requests; want only the good token's", n)
	}
}

// BenchmarkStaticToken is what a Postern token costs a request (hash and constant-time
// match against 16 credentials): the baseline of oauth's BenchmarkVerify.
func BenchmarkStaticToken(b *testing.B) {
	var actors []Actor
	var tok string
	for i := range 16 {
		t, err := NewToken()
		if err != nil {
			b.Fatal(err)
		}
		tok = t
		actors = append(actors, Actor{Name: "a" + string(rune('a'+i)), TokenSHA256: HashToken(t)})
	}
	table, err := newActorTable(actors, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for b.Loop() {
		if _, err := table.authenticate(tok, now); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOAuthOpaqueTokensIntrospected: with introspection configured, an opaque token of the
// provider is checked at its introspection endpoint and maps like a JWT; one it does not know
// is 401 invalid_token; Postern's own tokens are never sent there; without introspection an
// opaque token is just an unknown token.
func TestOAuthOpaqueTokensIntrospected(t *testing.T) {
	f := newOAuthFixtureWith(t, func(o *oauth.Options, issuer string) {
		o.Introspection = &oauth.Introspection{URL: issuer + "/oauth/introspect", ClientID: introspector.ID, ClientSecret: introspector.Secret}
	})
	opaque := f.token(t, opaqueBot, "postern:read")
	if isJWT(opaque) {
		t.Fatalf("the provider issued a JWT to an opaque account: %.20s…", opaque)
	}
	cs, err := f.connect(t, opaque)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got := callWhoami(t, cs); got.Caller != (Caller{Actor: "token:deploy", Subject: opaqueBot.ID}) {
		t.Fatalf("whoami = %+v", got)
	}
	status, challenge, _ := f.post(t, "not-a-token-the-provider-issued", listToolsBody)
	if status != 401 || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, "not active") {
		t.Fatalf("an unknown opaque token: %d %q", status, challenge)
	}
	cs2, err := f.connect(t, f.static)
	if err != nil {
		t.Fatal(err)
	}
	defer cs2.Close()
	if got := callWhoami(t, cs2); got.Caller != (Caller{Actor: "token:alice"}) {
		t.Fatalf("static token with introspection on: %+v", got)
	}

	plain := newOAuthFixture(t)
	status, challenge, _ = plain.post(t, plain.token(t, opaqueBot, "postern:read"), listToolsBody)
	if status != 401 || !strings.Contains(challenge, "unknown token") {
		t.Fatalf("an opaque token without introspection: %d %q", status, challenge)
	}
}
