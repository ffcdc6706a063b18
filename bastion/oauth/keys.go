package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Bounds on what the bastion fetches from the authorization server.
const (
	// maxDocumentBytes bounds a discovery document or a JWKS: real ones are a few KiB.
	maxDocumentBytes = 1 << 20
	// fetchTimeout bounds one fetch (discovery and JWKS together).
	fetchTimeout = 10 * time.Second
	// minRefetchInterval is the least time between two fetches of the keys, however many
	// tokens name a key id the cache does not have: a rotation is picked up within it, and
	// made-up key ids cost the identity provider one request per interval.
	minRefetchInterval = 30 * time.Second
	// maxKeyAge is how long fetched keys are used before the next token refetches them
	// (keeping them if the refetch fails).
	maxKeyAge = time.Hour
	// maxKeys bounds the keys kept from a JWKS.
	maxKeys = 64
	// maxRedirects bounds the redirects of one fetch.
	maxRedirects = 3
)

// errUnknownKey: the token names a key the issuer's JWKS does not have (a removed key, or a
// token of another issuer).
var errUnknownKey = errors.New("the token's signing key is not in the issuer's key set")

// keySet is the issuer's public keys, fetched when first needed and again (rate limited)
// when a token names a key id it does not have.
type keySet struct {
	issuer  string
	jwksURL string // configured; "" = from discovery
	client  *http.Client
	now     func() time.Time

	// fetchMu serializes fetches, so concurrent unknown key ids cause one; taken before mu.
	fetchMu sync.Mutex
	// mu guards the fields below it.
	mu         sync.Mutex
	keys       []jose.JSONWebKey
	discovered string    // the JWKS URL discovery found
	lastFetch  time.Time // the last fetch attempt, successful or not
	lastErr    error     // its error, nil if it succeeded
}

func newKeySet(issuer, jwksURL string, client *http.Client, now func() time.Time) *keySet {
	return &keySet{issuer: issuer, jwksURL: jwksURL, client: client, now: now}
}

// lookup returns the keys that may have signed a token with header kid and alg: the key of
// that id, or, for a token without kid, every key of that algorithm's type.
func (s *keySet) lookup(kid, alg string) []jose.JSONWebKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []jose.JSONWebKey
	for _, k := range s.keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if k.Algorithm != "" && k.Algorithm != alg {
			continue
		}
		if kid == "" || k.KeyID == kid {
			out = append(out, k)
		}
	}
	return out
}

// has reports whether the key set has the key of kid (for a token without kid: a key of
// alg) now.
func (s *keySet) has(kid, alg string) bool {
	return len(s.lookup(kid, alg)) > 0
}

// keysFor returns the candidate keys of a token header, fetching the JWKS when it has none
// and the last fetch is older than minRefetchInterval.
func (s *keySet) keysFor(ctx context.Context, kid, alg string) ([]jose.JSONWebKey, error) {
	if keys := s.lookup(kid, alg); len(keys) > 0 && !s.stale() {
		return keys, nil
	}
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	keys := s.lookup(kid, alg)
	if len(keys) > 0 && !s.stale() { // fetched while this call waited
		return keys, nil
	}
	s.mu.Lock()
	recent := !s.lastFetch.IsZero() && s.now().Sub(s.lastFetch) < minRefetchInterval
	lastErr := s.lastErr
	s.mu.Unlock()
	if recent { // and so not stale: the key is not there
		if lastErr != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, lastErr)
		}
		return nil, errUnknownKey
	}
	// The fetch is the bastion's, not the request's: a client that hangs up must not leave
	// the key set without keys for the next interval.
	if err := s.refresh(context.WithoutCancel(ctx)); err != nil {
		if len(keys) > 0 {
			return keys, nil // a stale set that could not be refreshed keeps its keys
		}
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if keys := s.lookup(kid, alg); len(keys) > 0 {
		return keys, nil
	}
	return nil, errUnknownKey
}

// stale reports whether the keys were last fetched more than maxKeyAge ago: the next token
// refetches them, so a key the issuer withdrew without publishing a new one is dropped too.
func (s *keySet) stale() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lastFetch.IsZero() && s.now().Sub(s.lastFetch) > maxKeyAge
}

// prefetch fetches the keys now, and says how many the issuer publishes.
func (s *keySet) prefetch(ctx context.Context) (int, error) {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	if err := s.refresh(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys), nil
}

// refresh fetches the JWKS (discovering its URL first if needed) and replaces the keys.
// Called with fetchMu held.
func (s *keySet) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	keys, discovered, err := s.fetch(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastFetch, s.lastErr = s.now(), err
	if err != nil {
		return err
	}
	s.keys = keys
	if discovered != "" {
		s.discovered = discovered
	}
	return nil
}

func (s *keySet) fetch(ctx context.Context) (keys []jose.JSONWebKey, discovered string, err error) {
	jwksURL := s.jwksURL
	if jwksURL == "" {
		s.mu.Lock()
		jwksURL = s.discovered
		s.mu.Unlock()
	}
	if jwksURL == "" {
		if jwksURL, err = discoverJWKS(ctx, s.client, s.issuer); err != nil {
			return nil, "", err
		}
		discovered = jwksURL
	}
	var set jose.JSONWebKeySet
	if err := getJSON(ctx, s.client, jwksURL, &set); err != nil {
		return nil, "", fmt.Errorf("jwks: %w", err)
	}
	for _, k := range set.Keys {
		if len(keys) == maxKeys {
			break
		}
		// Public asymmetric keys only: a symmetric key in a JWKS is a misconfiguration, and
		// would let anyone who read the JWKS sign tokens.
		switch k.Key.(type) {
		case []byte:
			continue
		}
		if !k.IsPublic() {
			k = k.Public()
		}
		if k.Valid() {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, "", fmt.Errorf("jwks %s: no public signing key", jwksURL)
	}
	return keys, discovered, nil
}

// discoverJWKS reads the issuer's discovery document — OpenID Connect's
// <issuer>/.well-known/openid-configuration, else RFC 8414's
// <origin>/.well-known/oauth-authorization-server<path> — and returns its jwks_uri, after
// checking that the document names the issuer itself.
func discoverJWKS(ctx context.Context, client *http.Client, issuer string) (string, error) {
	var errs []error
	for _, u := range DiscoveryURLs(issuer) {
		var doc struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		if err := getJSON(ctx, client, u, &doc); err != nil {
			errs = append(errs, err)
			continue
		}
		if doc.Issuer != issuer {
			return "", fmt.Errorf("discovery %s names issuer %q, not %q", u, doc.Issuer, issuer)
		}
		if err := CheckURL(doc.JWKSURI); err != nil {
			return "", fmt.Errorf("discovery %s: jwks_uri: %w", u, err)
		}
		return doc.JWKSURI, nil
	}
	return "", fmt.Errorf("discovery: %w", errors.Join(errs...))
}

// DiscoveryURLs are where an issuer's metadata is looked for, in order: OpenID Connect
// Discovery 1.0 (the issuer with the suffix appended), then RFC 8414 (the suffix inserted
// between the origin and the issuer's path).
func DiscoveryURLs(issuer string) []string {
	oidc := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	u, err := url.Parse(issuer)
	if err != nil {
		return []string{oidc}
	}
	path := strings.TrimSuffix(u.Path, "/")
	u.Path, u.RawPath = "/.well-known/oauth-authorization-server"+path, ""
	return []string{oidc, u.String()}
}

// CheckURL refuses a URL the bastion would fetch keys or metadata from that is not HTTPS,
// unless it is on loopback (an identity provider on the same machine, and tests).
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Host == "" || u.User != nil || u.Fragment != "" {
		return fmt.Errorf("%q must be an absolute URL without user info or fragment", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if isLoopback(u.Hostname()) {
			return nil
		}
	}
	return fmt.Errorf("%q must use https (http only on a loopback address)", raw)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// NewHTTPClient is the client the bastion fetches discovery documents and keys with: the
// default transport, a timeout, and redirects only to URLs CheckURL accepts.
func NewHTTPClient() *http.Client {
	return &http.Client{
		Timeout: fetchTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("more than %d redirects", maxRedirects)
			}
			return CheckURL(req.URL.String())
		},
	}
}

// getJSON GETs u and decodes its JSON body into v: 200 only, at most maxDocumentBytes.
func getJSON(ctx context.Context, client *http.Client, u string, v any) error {
	if err := CheckURL(u); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes+1))
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if len(data) > maxDocumentBytes {
		return fmt.Errorf("GET %s: the document exceeds %d bytes", u, maxDocumentBytes)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}
