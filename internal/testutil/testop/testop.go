// Package testop is a real OpenID Provider for tests: zitadel/oidc's op (discovery, JWKS,
// token endpoint, authorization endpoint with PKCE) on 127.0.0.1, over the in-memory storage
// of zitadel's example, with what Postern's tests need on top: service accounts
// (client_credentials) and a public client (authorization code + PKCE, a login that
// approves itself) whose access tokens are JWTs for a given audience, carrying a groups
// claim; signing keys the test rotates while it runs; and opaque tokens for accounts that
// ask for them, which any service account may introspect (RFC 7662, /oauth/introspect).
package testop

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// ServiceAccount is a confidential client that gets tokens with client_credentials: the
// token's sub and client_id are its ID.
type ServiceAccount struct {
	ID, Secret string
	// Groups go into the token's groups claim.
	Groups []string
	// Opaque: its access tokens are opaque (for introspection, RFC 7662) instead of JWTs.
	Opaque bool
}

// Options configure Start.
type Options struct {
	// Audience is the aud of every access token (the resource it is for).
	Audience []string
	// ServiceAccounts may use client_credentials.
	ServiceAccounts []ServiceAccount
	// PublicClient, when set, is a public client id that may use authorization code + PKCE
	// with any loopback redirect URI; its login approves the example user (UserSubject)
	// without a form.
	PublicClient string
	// UserGroups go into the groups claim of the example user's tokens.
	UserGroups []string
	// TokenLifetime of access tokens. Default 5 minutes.
	TokenLifetime time.Duration
}

// UserSubject is the sub of the example user the public client's login approves.
const UserSubject = "id1"

// Provider is a running OpenID Provider.
type Provider struct {
	// Issuer is its issuer URL (http://127.0.0.1:PORT).
	Issuer string
	st     *provStorage
}

// Start starts a provider on 127.0.0.1 for the test's lifetime.
func Start(t testing.TB, opts Options) *Provider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	if opts.TokenLifetime == 0 {
		opts.TokenLifetime = 5 * time.Minute
	}
	st := &provStorage{
		Storage:  storage.NewStorage(storage.NewUserStore(issuer)),
		issuer:   issuer,
		opts:     opts,
		accounts: map[string]ServiceAccount{},
		issued:   map[string]issuedToken{},
	}
	for _, a := range opts.ServiceAccounts {
		st.accounts[a.ID] = a
	}
	st.rotateLocked(t)
	var key [32]byte
	rand.Read(key[:])
	provider, err := op.NewProvider(&op.Config{
		CryptoKey:                key,
		CodeMethodS256:           true,
		AuthMethodPost:           true,
		SupportedUILocales:       []language.Tag{language.English},
		DefaultLogoutRedirectURI: "/",
	}, st, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatal(err)
	}
	st.callback = op.AuthCallbackURL(provider)
	mux := http.NewServeMux()
	mux.HandleFunc("/login", st.login)
	mux.Handle("/", provider)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return &Provider{Issuer: issuer, st: st}
}

// Rotate publishes a new signing key and signs with it from now on; the previous key stays
// published when keepOld, else it is removed (its tokens no longer verify).
func (p *Provider) Rotate(t testing.TB, keepOld bool) {
	t.Helper()
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	if !keepOld {
		p.st.published = nil
	}
	p.st.rotateLocked(t)
}

// KeyID is the id of the key the provider signs with now.
func (p *Provider) KeyID() string {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	return p.st.current.id
}

// Sign returns a JWT of claims signed with the provider's current key and kid, as its
// tokens are: for tests of what a resource must refuse although the signature is good
// (another audience, another issuer, an expired token).
func (p *Provider) Sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	p.st.mu.Lock()
	k := p.st.current
	p.st.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: k.key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), k.id))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ClientCredentialsToken asks the token endpoint for an access token of account with scope
// (space-separated; "" for none).
func (p *Provider) ClientCredentialsToken(ctx context.Context, account ServiceAccount, scope string) (string, error) {
	form := url.Values{"grant_type": {"client_credentials"}}
	if scope != "" {
		form.Set("scope", scope)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.Issuer+"/oauth/token", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(account.ID), url.QueryEscape(account.Secret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	if out.AccessToken == "" {
		return "", fmt.Errorf("token endpoint: %s %s: %s", resp.Status, out.Error, out.Description)
	}
	return out.AccessToken, nil
}

// signingKey is an RSA key the provider signs or signed with.
type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *signingKey) Key() any                                    { return k.key }
func (k *signingKey) ID() string                                  { return k.id }

// publicKey is a published key (op.Key).
type publicKey struct{ *signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }

// provStorage is the example storage with service accounts, JWT access tokens for the
// audience, a groups claim and rotating keys.
type provStorage struct {
	*storage.Storage
	issuer   string
	opts     Options
	accounts map[string]ServiceAccount
	callback func(context.Context, string) string

	mu        sync.Mutex // guards current, published and issued
	current   *signingKey
	published []*signingKey
	// issued are the access tokens by id, for introspection.
	issued map[string]issuedToken
}

// issuedToken is what introspection says of a token.
type issuedToken struct {
	subject, clientID string
	audience, scopes  []string
	expires           time.Time
}

func (s *provStorage) rotateLocked(t testing.TB) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(k.PublicKey.N.Bytes())
	s.current = &signingKey{id: fmt.Sprintf("k-%x", sum[:6]), key: k}
	s.published = append(s.published, s.current)
}

func (s *provStorage) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, nil
}

func (s *provStorage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *provStorage) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]op.Key, 0, len(s.published))
	for _, k := range s.published {
		keys = append(keys, publicKey{k})
	}
	return keys, nil
}

func (s *provStorage) ClientCredentials(_ context.Context, clientID, clientSecret string) (op.Client, error) {
	a, ok := s.accounts[clientID]
	if !ok || a.Secret != clientSecret {
		return nil, errors.New("wrong client id or secret")
	}
	return &client{id: a.ID, confidential: true, opaque: a.Opaque, lifetime: s.opts.TokenLifetime}, nil
}

func (s *provStorage) ClientCredentialsTokenRequest(_ context.Context, clientID string, scopes []string) (op.TokenRequest, error) {
	if _, ok := s.accounts[clientID]; !ok {
		return nil, errors.New("unknown client")
	}
	return &oidc.JWTTokenRequest{Subject: clientID, Audience: s.opts.Audience, Scopes: scopes}, nil
}

func (s *provStorage) GetClientByClientID(ctx context.Context, clientID string) (op.Client, error) {
	if a, ok := s.accounts[clientID]; ok {
		return &client{id: a.ID, confidential: true, opaque: a.Opaque, lifetime: s.opts.TokenLifetime}, nil
	}
	if clientID != "" && clientID == s.opts.PublicClient {
		return &client{id: clientID, lifetime: s.opts.TokenLifetime}, nil
	}
	return s.Storage.GetClientByClientID(ctx, clientID)
}

func (s *provStorage) AuthorizeClientIDSecret(ctx context.Context, clientID, clientSecret string) error {
	if a, ok := s.accounts[clientID]; ok {
		if a.Secret != clientSecret {
			return errors.New("wrong client secret")
		}
		return nil
	}
	return s.Storage.AuthorizeClientIDSecret(ctx, clientID, clientSecret)
}

// CreateAuthRequest is the example's, with the access token's audience set to the resource
// (the example puts the client id there).
func (s *provStorage) CreateAuthRequest(ctx context.Context, req *oidc.AuthRequest, userID string) (op.AuthRequest, error) {
	ar, err := s.Storage.CreateAuthRequest(ctx, req, userID)
	if err != nil {
		return nil, err
	}
	return &authRequest{AuthRequest: ar, audience: s.opts.Audience}, nil
}

func (s *provStorage) AuthRequestByID(ctx context.Context, id string) (op.AuthRequest, error) {
	ar, err := s.Storage.AuthRequestByID(ctx, id)
	if err != nil {
		return nil, err
	}
	return &authRequest{AuthRequest: ar, audience: s.opts.Audience}, nil
}

func (s *provStorage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	ar, err := s.Storage.AuthRequestByCode(ctx, code)
	if err != nil {
		return nil, err
	}
	return &authRequest{AuthRequest: ar, audience: s.opts.Audience}, nil
}

// CreateAccessToken is the example's, with the configured lifetime, remembered for
// introspection.
func (s *provStorage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, _, err := s.Storage.CreateAccessToken(ctx, req)
	if err != nil {
		return "", time.Time{}, err
	}
	exp := time.Now().Add(s.opts.TokenLifetime)
	clientID := req.GetSubject() // client_credentials: the account is the subject
	if ar, ok := req.(op.AuthRequest); ok {
		clientID = ar.GetClientID()
	}
	s.mu.Lock()
	s.issued[id] = issuedToken{subject: req.GetSubject(), clientID: clientID, audience: req.GetAudience(), scopes: req.GetScopes(), expires: exp}
	s.mu.Unlock()
	return id, exp, nil
}

// SetIntrospectionFromToken answers an introspection of an access token it issued: active
// until it expires, with its subject, audience, scopes, client and groups.
func (s *provStorage) SetIntrospectionFromToken(_ context.Context, resp *oidc.IntrospectionResponse, tokenID, _, _ string) error {
	s.mu.Lock()
	tok, ok := s.issued[tokenID]
	s.mu.Unlock()
	if !ok || !time.Now().Before(tok.expires) {
		return errors.New("token inactive")
	}
	resp.Issuer, resp.Subject, resp.ClientID = s.issuer, tok.subject, tok.clientID
	resp.Audience, resp.Scope = tok.audience, tok.scopes
	resp.Expiration = oidc.FromTime(tok.expires)
	if a, ok := s.accounts[tok.clientID]; ok && len(a.Groups) > 0 {
		resp.Claims = map[string]any{"groups": a.Groups}
	}
	return nil
}

// GetPrivateClaimsFromScopes puts the scope (RFC 9068; zitadel's op leaves it out) and the
// groups claim in access tokens.
func (s *provStorage) GetPrivateClaimsFromScopes(_ context.Context, userID, clientID string, scopes []string) (map[string]any, error) {
	claims := map[string]any{}
	if len(scopes) > 0 {
		claims["scope"] = strings.Join(scopes, " ")
	}
	if a, ok := s.accounts[clientID]; ok && len(a.Groups) > 0 {
		claims["groups"] = a.Groups
	}
	if userID == UserSubject && len(s.opts.UserGroups) > 0 {
		claims["groups"] = s.opts.UserGroups
	}
	return claims, nil
}

// login approves the example user for the auth request it names, without a form, and
// sends the browser back to the provider's callback.
func (s *provStorage) login(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("authRequestID")
	if err := s.CheckUsernamePassword("test-user@127.0.0.1", "verysecure", id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	http.Redirect(w, r, s.callback(r.Context(), id), http.StatusFound)
}

// authRequest is an op.AuthRequest whose tokens are for the resource.
type authRequest struct {
	op.AuthRequest
	audience []string
}

func (a *authRequest) GetAudience() []string { return a.audience }

// client is a service account (confidential, client_credentials) or the public client
// (authorization code + PKCE, loopback redirects); both get JWT access tokens.
type client struct {
	id           string
	confidential bool
	opaque       bool
	lifetime     time.Duration
}

func (c *client) GetID() string { return c.id }
func (c *client) RedirectURIs() []string {
	return nil
}
func (c *client) PostLogoutRedirectURIs() []string { return nil }
func (c *client) ApplicationType() op.ApplicationType {
	if c.confidential {
		return op.ApplicationTypeWeb
	}
	return op.ApplicationTypeNative
}
func (c *client) AuthMethod() oidc.AuthMethod {
	if c.confidential {
		return oidc.AuthMethodBasic
	}
	return oidc.AuthMethodNone
}
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	if c.confidential {
		return []oidc.GrantType{oidc.GrantTypeClientCredentials}
	}
	return []oidc.GrantType{oidc.GrantTypeCode}
}
func (c *client) LoginURL(id string) string { return "/login?authRequestID=" + url.QueryEscape(id) }
func (c *client) AccessTokenType() op.AccessTokenType {
	if c.opaque {
		return op.AccessTokenTypeBearer
	}
	return op.AccessTokenTypeJWT
}
func (c *client) IDTokenLifetime() time.Duration { return c.lifetime }
func (c *client) DevMode() bool                  { return true }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(string) bool           { return true }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *client) ClockSkew() time.Duration             { return 0 }
func (c *client) RedirectURIGlobs() []string {
	return []string{"http://127.0.0.1:*/*", "http://localhost:*/*"}
}
func (c *client) PostLogoutRedirectURIGlobs() []string { return nil }
