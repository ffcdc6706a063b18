package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// MaxTokenBytes bounds a presented access token: JWTs with a few groups are 1–2 KiB; 8 KiB
// leaves room for large group lists and refuses a header-sized one before any parsing.
const MaxTokenBytes = 8 << 10

// maxSubjectBytes bounds the sub claim, which every call's journal record carries.
const maxSubjectBytes = 255

// DefaultLeeway is the clock skew tolerated on exp, nbf and iat.
const DefaultLeeway = 60 * time.Second

// DefaultGroupsClaim is the claim groups are read from.
const DefaultGroupsClaim = "groups"

// Why a token authenticates nobody. Callers branch on these.
var (
	// ErrInvalidToken: the token is not a valid access token for this resource (401
	// invalid_token: the client should get a new one).
	ErrInvalidToken = errors.New("invalid token")
	// ErrNoActor: a valid token that no rule maps to an actor (403).
	ErrNoActor = errors.New("the token maps to no actor")
	// ErrUnavailable: the issuer's keys could not be fetched, so no token can be checked
	// now (503: the client may retry).
	ErrUnavailable = errors.New("the issuer's keys are unavailable")
)

// SupportedAlgorithms are the signature algorithms a token may use: asymmetric ones only.
var SupportedAlgorithms = []string{
	string(jose.RS256), string(jose.RS384), string(jose.RS512),
	string(jose.PS256), string(jose.PS384), string(jose.PS512),
	string(jose.ES256), string(jose.ES384), string(jose.ES512),
	string(jose.EdDSA),
}

// Options configure a Verifier.
type Options struct {
	// Issuer is the authorization server's issuer identifier, compared exactly with iss.
	// HTTPS, or http on loopback.
	Issuer string
	// Resource is the protected resource's identifier: the MCP endpoint's URL as clients
	// reach it. Tokens must name it in aud (a trailing slash aside) unless Audiences is set.
	Resource string
	// Audiences, when set, are the aud values accepted instead of Resource (exactly).
	Audiences []string
	// JWKSURL overrides the key set URL discovery would find.
	JWKSURL string
	// Algorithms narrows SupportedAlgorithms. Default: all of them.
	Algorithms []string
	// Leeway is the clock skew tolerated. Default DefaultLeeway.
	Leeway time.Duration
	// GroupsClaim names the claim groups (or roles) are read from; a dotted name reads a
	// nested one ("realm_access.roles"). Default DefaultGroupsClaim.
	GroupsClaim string
	// Rules map tokens to actors.
	Rules Rules
	// Introspection, when set, checks opaque tokens (not JWTs) at the authorization server
	// (RFC 7662, introspect.go). Default: opaque tokens are refused.
	Introspection *Introspection
	// HTTPClient fetches discovery and keys. Default NewHTTPClient().
	HTTPClient *http.Client
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Identity is what a valid token says of its bearer.
type Identity struct {
	Issuer  string
	Subject string
	// ClientID is the client_id claim (RFC 9068), else azp.
	ClientID string
	Scopes   []string
	Groups   []string
	Expires  time.Time
}

// Verifier validates access tokens for one resource and maps them to actors.
type Verifier struct {
	opts   Options // Rules unused after New: rules holds them
	algs   []jose.SignatureAlgorithm
	keys   *keySet
	groups []string // GroupsClaim split at dots
	// rules are the rules in force, replaced by SetRules (a reload).
	rules atomic.Pointer[Rules]
	// verified remembers the tokens that passed every check (cache.go).
	verified verifiedTokens
	// introspecting holds a slot per introspection request in flight (introspect.go).
	introspecting chan struct{}
}

// New checks opts and returns their verifier. Nothing is fetched yet: the keys are fetched
// when the first token arrives, so an identity provider that is down does not stop the
// bastion (its static tokens go on working).
func New(opts Options) (*Verifier, error) {
	if err := CheckURL(opts.Issuer); err != nil {
		return nil, fmt.Errorf("oauth: issuer: %w", err)
	}
	if err := checkResource(opts.Resource); err != nil {
		return nil, fmt.Errorf("oauth: resource: %w", err)
	}
	if opts.JWKSURL != "" {
		if err := CheckURL(opts.JWKSURL); err != nil {
			return nil, fmt.Errorf("oauth: jwks_url: %w", err)
		}
	}
	if len(opts.Algorithms) == 0 {
		opts.Algorithms = SupportedAlgorithms
	}
	v := &Verifier{}
	for _, a := range opts.Algorithms {
		if !slices.Contains(SupportedAlgorithms, a) {
			return nil, fmt.Errorf("oauth: algorithm %q: only asymmetric ones are accepted (%s)", a, strings.Join(SupportedAlgorithms, ", "))
		}
		v.algs = append(v.algs, jose.SignatureAlgorithm(a))
	}
	if opts.Leeway <= 0 {
		opts.Leeway = DefaultLeeway
	}
	if opts.GroupsClaim == "" {
		opts.GroupsClaim = DefaultGroupsClaim
	}
	if err := opts.Rules.check(); err != nil {
		return nil, fmt.Errorf("oauth: %w", err)
	}
	if opts.Introspection != nil {
		if err := opts.Introspection.check(); err != nil {
			return nil, fmt.Errorf("oauth: %w", err)
		}
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = NewHTTPClient()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	v.opts = opts
	v.groups = strings.Split(opts.GroupsClaim, ".")
	v.keys = newKeySet(opts.Issuer, opts.JWKSURL, opts.HTTPClient, opts.Now)
	v.rules.Store(&opts.Rules)
	v.introspecting = make(chan struct{}, maxIntrospections)
	return v, nil
}

// Prefetch fetches the issuer's keys now (discovery first, unless JWKSURL is set), so the
// first token does not wait for them and a provider that cannot be reached shows at start.
// It returns how many keys the issuer publishes.
func (v *Verifier) Prefetch(ctx context.Context) (int, error) {
	return v.keys.prefetch(ctx)
}

// SetRules puts rules in force for the tokens that arrive from now on (a reload); rules
// that do not check change nothing.
func (v *Verifier) SetRules(rules Rules) error {
	if err := rules.check(); err != nil {
		return fmt.Errorf("oauth: %w", err)
	}
	v.rules.Store(&rules)
	return nil
}

// checkResource accepts an absolute http(s) URL without fragment: RFC 9728 section 1.2.
func checkResource(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Fragment != "" {
		return fmt.Errorf("%q must be the MCP endpoint's absolute URL (https://host/mcp)", raw)
	}
	return nil
}

// Verify validates raw as an access token for the resource and maps it to an actor. The
// error wraps ErrInvalidToken, ErrNoActor or ErrUnavailable, and says which check failed;
// it never contains the token.
func (v *Verifier) Verify(ctx context.Context, raw string) (Identity, Mapping, error) {
	id, err := v.validateCached(ctx, raw)
	if err != nil {
		return Identity{}, Mapping{}, err
	}
	m, err := v.rules.Load().Map(id)
	return id, m, err
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidToken, fmt.Sprintf(format, args...))
}

// validate runs the checks of a token in the order docs/oauth.md lists them, and returns
// the key id and algorithm that verified it.
func (v *Verifier) validate(ctx context.Context, raw string) (Identity, string, string, error) {
	if len(raw) > MaxTokenBytes {
		return Identity{}, "", "", invalid("the token exceeds %d bytes", MaxTokenBytes)
	}
	tok, err := jwt.ParseSigned(raw, v.algs)
	if err != nil {
		return Identity{}, "", "", invalid("not a JWS signed with an accepted algorithm (%s)", strings.Join(v.opts.Algorithms, ", "))
	}
	if len(tok.Headers) != 1 {
		return Identity{}, "", "", invalid("the token must carry one signature")
	}
	h := tok.Headers[0]
	keys, err := v.keys.keysFor(ctx, h.KeyID, h.Algorithm)
	if errors.Is(err, errUnknownKey) {
		return Identity{}, "", "", invalid("%v", err)
	}
	if err != nil {
		return Identity{}, "", "", err
	}
	var std jwt.Claims
	var claims map[string]json.RawMessage
	kid := ""
	verified := false
	for _, k := range keys {
		if tok.Claims(k.Key, &std, &claims) == nil {
			kid, verified = k.KeyID, true
			break
		}
	}
	if !verified {
		return Identity{}, "", "", invalid("the signature does not verify")
	}
	now := v.opts.Now()
	if std.Issuer != v.opts.Issuer {
		return Identity{}, "", "", invalid("issued by %q, not %q", short(std.Issuer), v.opts.Issuer)
	}
	if !v.audienceOK(std.Audience) {
		return Identity{}, "", "", invalid("the audience (aud) does not name this resource (%s)", v.audiences())
	}
	if std.Expiry == nil {
		return Identity{}, "", "", invalid("the token has no expiry (exp)")
	}
	switch err := std.ValidateWithLeeway(jwt.Expected{Time: now}, v.opts.Leeway); {
	case errors.Is(err, jwt.ErrExpired):
		return Identity{}, "", "", invalid("the token expired at %s", std.Expiry.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrNotValidYet):
		return Identity{}, "", "", invalid("the token is not valid before %s", std.NotBefore.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Identity{}, "", "", invalid("the token was issued in the future")
	case err != nil:
		return Identity{}, "", "", invalid("%v", err)
	}
	if std.Subject == "" || len(std.Subject) > maxSubjectBytes {
		return Identity{}, "", "", invalid("the token's subject (sub) must be 1 to %d bytes", maxSubjectBytes)
	}
	return v.identity(std.Issuer, std.Subject, std.Expiry.Time(), claims), kid, h.Algorithm, nil
}

// identity is what a checked token's claims say of its bearer.
func (v *Verifier) identity(issuer, subject string, expires time.Time, claims map[string]json.RawMessage) Identity {
	id := Identity{Issuer: issuer, Subject: subject, Expires: expires}
	id.ClientID = stringClaim(claims["client_id"])
	if id.ClientID == "" {
		id.ClientID = stringClaim(claims["azp"])
	}
	// scope is RFC 9068's and RFC 7662's (a space-separated string); scp is what Entra ID
	// and Okta send (a string or a list).
	id.Scopes = listClaim(claims["scope"], true)
	if len(id.Scopes) == 0 {
		id.Scopes = listClaim(claims["scp"], true)
	}
	id.Groups = listClaim(nested(claims, v.groups), false)
	return id
}

// short cuts a claim an error quotes to 64 bytes: errors go into a response header and logs.
func short(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}

// audienceOK reports whether aud names this resource: one of Audiences exactly, or, without
// them, the resource (oauthex.MatchesResource: a trailing slash aside).
func (v *Verifier) audienceOK(aud []string) bool {
	if len(v.opts.Audiences) > 0 {
		return slices.ContainsFunc(aud, func(a string) bool { return slices.Contains(v.opts.Audiences, a) })
	}
	return oauthex.MatchesResource(aud, v.opts.Resource)
}

func (v *Verifier) audiences() string {
	if len(v.opts.Audiences) > 0 {
		return strings.Join(v.opts.Audiences, ", ")
	}
	return v.opts.Resource
}

// stringClaim is a string claim's value, "" if absent or not a string.
func stringClaim(raw json.RawMessage) string {
	var s string
	if raw == nil || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// listClaim reads a claim that is a list of strings or one string (split at spaces when
// spaced: a scope string). Anything else reads as none.
func listClaim(raw json.RawMessage, spaced bool) []string {
	if raw == nil {
		return nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return slices.DeleteFunc(list, func(s string) bool { return s == "" })
	}
	var s string
	if json.Unmarshal(raw, &s) != nil || s == "" {
		return nil
	}
	if spaced {
		return strings.Fields(s)
	}
	return []string{s}
}

// nested follows path through nested JSON objects of claims; nil if any step is missing.
func nested(claims map[string]json.RawMessage, path []string) json.RawMessage {
	raw := claims[path[0]]
	for _, key := range path[1:] {
		var obj map[string]json.RawMessage
		if raw == nil || json.Unmarshal(raw, &obj) != nil {
			return nil
		}
		raw = obj[key]
	}
	return raw
}

// Resource is the protected resource's identifier.
func (v *Verifier) Resource() string { return v.opts.Resource }

// Metadata is the protected resource metadata (RFC 9728) clients discover the
// authorization server from.
func (v *Verifier) Metadata() *oauthex.ProtectedResourceMetadata {
	return &oauthex.ProtectedResourceMetadata{
		Resource:               v.opts.Resource,
		AuthorizationServers:   []string{v.opts.Issuer},
		ScopesSupported:        v.rules.Load().Scopes(),
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "Postern",
		ResourceDocumentation:  "https://github.com/postern-dev/postern/blob/main/docs/oauth.md",
	}
}

// MetadataURL is where Metadata is served (RFC 9728 section 3.1: the well-known path
// inserted between the resource's host and its path), as the 401 challenge names it.
func (v *Verifier) MetadataURL() string {
	u, _ := url.Parse(v.opts.Resource) // checked by New
	u.Path, u.RawPath, u.RawQuery = MetadataPath(u.Path), "", ""
	return u.String()
}

// wellKnownMetadata is RFC 9728's well-known path.
const wellKnownMetadata = "/.well-known/oauth-protected-resource"

// MetadataPath is the path Metadata is served at for a resource of path resourcePath.
func MetadataPath(resourcePath string) string {
	return wellKnownMetadata + strings.TrimSuffix(resourcePath, "/")
}

// MetadataPaths are the paths to serve Metadata at: the resource's own (MetadataURL) and
// the bare well-known path, which clients of earlier drafts ask first.
func (v *Verifier) MetadataPaths() []string {
	u, _ := url.Parse(v.opts.Resource)
	paths := []string{MetadataPath(u.Path)}
	if paths[0] != wellKnownMetadata {
		paths = append(paths, wellKnownMetadata)
	}
	return paths
}

// ScopesFor are the scopes that would allow tool (Rules.ScopesFor).
func (v *Verifier) ScopesFor(tool string) []string { return v.rules.Load().ScopesFor(tool) }
