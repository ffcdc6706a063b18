package oauth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// fakeIssuer is an authorization server's discovery document and JWKS on 127.0.0.1, with
// keys the test rotates, and counts of the fetches.
type fakeIssuer struct {
	srv        *httptest.Server
	issuer     string
	jwksFetch  atomic.Int64
	oidcAnswer atomic.Bool // serve the OpenID document (else only RFC 8414's)
	keysDown   atomic.Bool // answer the JWKS with 503
	mu         sync.Mutex
	keys       map[string]crypto.Signer // by kid, published
}

func newFakeIssuer(t testing.TB, path string) *fakeIssuer {
	t.Helper()
	f := &fakeIssuer{keys: map[string]crypto.Signer{}}
	f.oidcAnswer.Store(true)
	mux := http.NewServeMux()
	doc := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"issuer": f.issuer, "jwks_uri": f.srv.URL + "/keys"})
	}
	mux.HandleFunc(path+"/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		if !f.oidcAnswer.Load() {
			http.NotFound(w, r)
			return
		}
		doc(w, r)
	})
	mux.HandleFunc("/.well-known/oauth-authorization-server"+path, doc)
	mux.HandleFunc("/keys", func(w http.ResponseWriter, _ *http.Request) {
		f.jwksFetch.Add(1)
		if f.keysDown.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		f.mu.Lock()
		var set jose.JSONWebKeySet
		for kid, k := range f.keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: kid, Use: "sig"})
		}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(set)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	f.issuer = f.srv.URL + path
	return f
}

func (f *fakeIssuer) addKey(t testing.TB, kid string, k crypto.Signer) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys[kid] = k
}

func (f *fakeIssuer) removeKey(kid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, kid)
}

func rsaKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sign makes a JWT of claims signed by key with alg under kid.
func sign(t testing.TB, alg jose.SignatureAlgorithm, kid string, key any, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("at+jwt")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

const testResource = "http://127.0.0.1:7410/mcp"

// claimsAt are valid claims for f at now; with overrides applied (nil value: removed).
func claimsAt(f *fakeIssuer, now time.Time, overrides map[string]any) map[string]any {
	c := map[string]any{
		"iss": f.issuer, "sub": "alice@example.com", "aud": []string{testResource},
		"exp": now.Add(5 * time.Minute).Unix(), "iat": now.Unix(), "nbf": now.Unix(),
		"client_id": "agent-1", "scope": "openid postern:exec", "groups": []string{"sre"},
	}
	for k, v := range overrides {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestVerifier(t *testing.T, f *fakeIssuer, clk *clock, mutate func(*Options)) *Verifier {
	t.Helper()
	opts := Options{
		Issuer: f.issuer, Resource: testResource, Now: clk.Now,
		Rules: Rules{Actors: []Rule{{Actor: "ops", Groups: []string{"sre"}}}},
	}
	if mutate != nil {
		mutate(&opts)
	}
	v, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerifyRefusesWhatTheSpecRefuses(t *testing.T) {
	f := newFakeIssuer(t, "")
	key := rsaKey(t)
	f.addKey(t, "k1", key)
	other := rsaKey(t)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f.addKey(t, "ec", ec)
	clk := &clock{now: time.Now()}
	v := newTestVerifier(t, f, clk, nil)
	now := clk.Now()
	pubDER, _ := json.Marshal(jose.JSONWebKey{Key: key.Public()})

	valid := sign(t, jose.RS256, "k1", key, claimsAt(f, now, nil))
	id, m, err := v.Verify(t.Context(), valid)
	if err != nil {
		t.Fatalf("a valid token: %v", err)
	}
	if id.Subject != "alice@example.com" || id.ClientID != "agent-1" || m.Actor != "ops" || strings.Join(id.Scopes, " ") != "openid postern:exec" {
		t.Fatalf("identity %+v mapping %+v", id, m)
	}
	if _, _, err := v.Verify(t.Context(), sign(t, jose.ES256, "ec", ec, claimsAt(f, now, nil))); err != nil {
		t.Fatalf("an ES256 token: %v", err)
	}

	noneToken := func() string {
		h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
		p, _ := json.Marshal(claimsAt(f, now, nil))
		return h + "." + base64.RawURLEncoding.EncodeToString(p) + "."
	}()
	for _, tc := range []struct {
		name, token, want string
	}{
		{"expired", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"exp": now.Add(-2 * time.Minute).Unix(), "iat": now.Add(-time.Hour).Unix(), "nbf": now.Add(-time.Hour).Unix()})), "expired"},
		{"no exp", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"exp": nil})), "no expiry"},
		{"not yet valid", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"nbf": now.Add(5 * time.Minute).Unix()})), "not valid before"},
		{"issued in the future", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"iat": now.Add(5 * time.Minute).Unix()})), "future"},
		{"wrong audience", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"aud": "https://other.example/mcp"})), "audience"},
		{"no audience", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"aud": nil})), "audience"},
		{"wrong issuer", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"iss": "https://evil.example"})), "issued by"},
		{"no subject", sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"sub": nil})), "subject"},
		{"unknown key", sign(t, jose.RS256, "k9", other, claimsAt(f, now, nil)), "not in the issuer's key set"},
		{"known kid, other key", sign(t, jose.RS256, "k1", other, claimsAt(f, now, nil)), "signature does not verify"},
		{"alg none", noneToken, "accepted algorithm"},
		{"HS256 with a secret", sign(t, jose.HS256, "k1", []byte("0123456789abcdef0123456789abcdef"), claimsAt(f, now, nil)), "accepted algorithm"},
		{"HS256 with the public key as secret", sign(t, jose.HS256, "k1", pubDER, claimsAt(f, now, nil)), "accepted algorithm"},
		{"oversize", valid + strings.Repeat("A", MaxTokenBytes), "exceeds"},
		{"garbage", "a.b.c", "accepted algorithm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := v.Verify(t.Context(), tc.token)
			if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidToken saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tc.token[:min(len(tc.token), 40)]) {
				t.Fatalf("the error contains the token: %v", err)
			}
		})
	}

	// Inside the leeway: 30 s past exp is still good with the default 60 s.
	late := sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"exp": now.Add(-30 * time.Second).Unix()}))
	if _, _, err := v.Verify(t.Context(), late); err != nil {
		t.Fatalf("30s past exp, inside the leeway: %v", err)
	}

	// A valid token that maps to nobody.
	nobody := sign(t, jose.RS256, "k1", key, claimsAt(f, now, map[string]any{"groups": []string{"finance"}}))
	if _, _, err := v.Verify(t.Context(), nobody); !errors.Is(err, ErrNoActor) {
		t.Fatalf("a token of no rule: %v, want ErrNoActor", err)
	}
}

func TestKeyRotationAndRefetchRateLimit(t *testing.T) {
	f := newFakeIssuer(t, "/realms/ops")
	f.oidcAnswer.Store(false) // RFC 8414 discovery only
	k1, k2, k3 := rsaKey(t), rsaKey(t), rsaKey(t)
	f.addKey(t, "k1", k1)
	clk := &clock{now: time.Now()}
	v := newTestVerifier(t, f, clk, nil)
	check := func(kid string, key *rsa.PrivateKey) error {
		t.Helper()
		_, _, err := v.Verify(t.Context(), sign(t, jose.RS256, kid, key, claimsAt(f, clk.Now(), nil)))
		return err
	}
	if err := check("k1", k1); err != nil {
		t.Fatal(err)
	}
	if n := f.jwksFetch.Load(); n != 1 {
		t.Fatalf("%d JWKS fetches after the first token, want 1", n)
	}
	// Rotation: k2 published, k1 retired. The first k2 token is 31 s later (past the
	// refetch interval): one fetch, and it verifies.
	f.addKey(t, "k2", k2)
	f.removeKey("k1")
	clk.Add(minRefetchInterval + time.Second)
	if err := check("k2", k2); err != nil {
		t.Fatalf("a token of the new key: %v", err)
	}
	if n := f.jwksFetch.Load(); n != 2 {
		t.Fatalf("%d JWKS fetches after the rotation, want 2", n)
	}
	// The retired key is gone from the cache.
	if err := check("k1", k1); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a token of the retired key: %v", err)
	}
	// A flood of made-up key ids within the interval fetches nothing more.
	for i := range 50 {
		if err := check("made-up-"+string(rune('a'+i%26)), k3); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("made-up kid: %v", err)
		}
	}
	if n := f.jwksFetch.Load(); n != 2 {
		t.Fatalf("%d JWKS fetches after 50 unknown kids within the interval, want 2", n)
	}
}

func TestDiscoveryChecks(t *testing.T) {
	f := newFakeIssuer(t, "")
	f.addKey(t, "k1", rsaKey(t))
	clk := &clock{now: time.Now()}
	// The document names another issuer (no trailing slash): refused, and the verifier
	// says unavailable.
	v := newTestVerifier(t, f, clk, func(o *Options) { o.Issuer = f.issuer + "/" })
	tok := sign(t, jose.RS256, "k1", rsaKey(t), map[string]any{"iss": f.issuer + "/"})
	if _, _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "names issuer") {
		t.Fatalf("discovery of another issuer: %v, want ErrUnavailable", err)
	}
	for _, bad := range []Options{
		{Issuer: "http://idp.example.com", Resource: testResource},
		{Issuer: "https://idp.example.com", Resource: "mcp"},
		{Issuer: "https://idp.example.com", Resource: testResource, JWKSURL: "http://idp.example.com/keys"},
		{Issuer: "https://idp.example.com", Resource: testResource, Algorithms: []string{"HS256"}},
		{Issuer: "https://idp.example.com", Resource: testResource, Algorithms: []string{"none"}},
		{Issuer: "https://idp.example.com", Resource: testResource, Rules: Rules{Actors: []Rule{{Actor: "ops"}}}},
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
}

func TestJWKSSizeBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"keys":[` + strings.Repeat(" ", maxDocumentBytes) + `]}`))
	}))
	t.Cleanup(srv.Close)
	v, err := New(Options{Issuer: srv.URL, Resource: testResource, JWKSURL: srv.URL + "/keys"})
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jose.RS256, "k1", rsaKey(t), map[string]any{"iss": srv.URL})
	if _, _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("an oversize JWKS: %v", err)
	}
}

func TestMetadata(t *testing.T) {
	v, err := New(Options{Issuer: "https://idp.example.com", Resource: "https://postern.example.com/mcp",
		Rules: Rules{ScopeTools: map[string][]string{"postern:read": {"hosts_list"}, "postern:exec": {"ssh_exec"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := v.MetadataURL(); got != "https://postern.example.com/.well-known/oauth-protected-resource/mcp" {
		t.Fatalf("metadata URL %s", got)
	}
	if got := strings.Join(v.MetadataPaths(), " "); got != "/.well-known/oauth-protected-resource/mcp /.well-known/oauth-protected-resource" {
		t.Fatalf("metadata paths %s", got)
	}
	md := v.Metadata()
	if md.Resource != "https://postern.example.com/mcp" || md.AuthorizationServers[0] != "https://idp.example.com" || strings.Join(md.ScopesSupported, " ") != "postern:exec postern:read" {
		t.Fatalf("metadata %+v", md)
	}
}

// A remembered token is still refused once it expires, or once its key is withdrawn.
func TestRememberedTokensStillChecked(t *testing.T) {
	f := newFakeIssuer(t, "")
	k1, k2 := rsaKey(t), rsaKey(t)
	f.addKey(t, "k1", k1)
	clk := &clock{now: time.Now()}
	v := newTestVerifier(t, f, clk, nil)
	tok := sign(t, jose.RS256, "k1", k1, claimsAt(f, clk.Now(), nil))
	for range 3 {
		if _, _, err := v.Verify(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.jwksFetch.Load(); n != 1 {
		t.Fatalf("%d fetches", n)
	}
	// Past exp (5 min) and the leeway (60 s).
	clk.Add(6*time.Minute + time.Second)
	if _, _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("a remembered token past its expiry: %v", err)
	}
	// A fresh token of k1, remembered; then k1 is withdrawn and a k2 token makes the bastion
	// refetch: the remembered k1 token is refused from then on.
	tok = sign(t, jose.RS256, "k1", k1, claimsAt(f, clk.Now(), nil))
	if _, _, err := v.Verify(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	f.addKey(t, "k2", k2)
	f.removeKey("k1")
	clk.Add(minRefetchInterval)
	if _, _, err := v.Verify(t.Context(), sign(t, jose.RS256, "k2", k2, claimsAt(f, clk.Now(), nil))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a remembered token of a withdrawn key: %v", err)
	}
}

// Keys are refetched after maxKeyAge: a key the issuer withdrew without a new kid showing up
// is dropped then, and a refetch that fails keeps the keys it had.
func TestKeysRefetchedWhenStale(t *testing.T) {
	f := newFakeIssuer(t, "")
	k1 := rsaKey(t)
	f.addKey(t, "k1", k1)
	clk := &clock{now: time.Now()}
	v := newTestVerifier(t, f, clk, nil)
	tok := func() string {
		return sign(t, jose.RS256, "k1", k1, claimsAt(f, clk.Now(), map[string]any{"exp": clk.Now().Add(3 * time.Hour).Unix()}))
	}
	if _, _, err := v.Verify(t.Context(), tok()); err != nil {
		t.Fatal(err)
	}
	// The provider is down past maxKeyAge: the refetch fails, the keys stay.
	f.keysDown.Store(true)
	clk.Add(maxKeyAge + time.Minute)
	if _, _, err := v.Verify(t.Context(), tok()); err != nil {
		t.Fatalf("a failed refetch of stale keys: %v", err)
	}
	if n := f.jwksFetch.Load(); n != 2 {
		t.Fatalf("%d JWKS fetches, want 2 (the first, the stale one)", n)
	}
	// Back, with k1 withdrawn and no new kid in any token: past maxKeyAge again, the
	// refetch drops k1, and its tokens — remembered ones too — are refused.
	remembered := tok()
	if _, _, err := v.Verify(t.Context(), remembered); err != nil {
		t.Fatal(err)
	}
	f.keysDown.Store(false)
	f.addKey(t, "k2", rsaKey(t))
	f.removeKey("k1")
	clk.Add(maxKeyAge + time.Minute)
	if _, _, err := v.Verify(t.Context(), remembered); !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), "key set") {
		t.Fatalf("a withdrawn key's remembered token after the hourly refetch: %v", err)
	}
}
