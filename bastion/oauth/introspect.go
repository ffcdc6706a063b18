package oauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Opaque access tokens (not JWTs) are checked by asking the authorization server (RFC 7662
// token introspection), when the config names its endpoint and the bastion's client there.

// Bounds of introspection.
const (
	// maxIntrospections bounds the introspection requests in flight: tokens no one has seen
	// cost the authorization server a request each, so a flood of made-up tokens gets 503s
	// past this, not a flood of requests to the provider.
	maxIntrospections = 8
	// introspectionTTL is how long an answer is remembered: a token the provider revokes is
	// refused within it.
	introspectionTTL = 30 * time.Second
	// maxIntrospectionBytes bounds an introspection response.
	maxIntrospectionBytes = 64 << 10
)

// Introspection configures RFC 7662 introspection of opaque access tokens.
type Introspection struct {
	// URL is the authorization server's introspection endpoint.
	URL string
	// ClientID and ClientSecret authenticate the bastion there (HTTP Basic, RFC 6749
	// section 2.3.1).
	ClientID, ClientSecret string
}

func (in *Introspection) check() error {
	if err := CheckURL(in.URL); err != nil {
		return fmt.Errorf("introspection_url: %w", err)
	}
	if in.ClientID == "" || in.ClientSecret == "" {
		return fmt.Errorf("introspection needs the bastion's client id and secret at the authorization server")
	}
	return nil
}

// Introspects reports whether opaque tokens are checked by introspection.
func (v *Verifier) Introspects() bool { return v.opts.Introspection != nil }

// isOpaque reports whether a token is not a JWT (compact serialization has three parts).
func isOpaque(raw string) bool { return strings.Count(raw, ".") != 2 }

// introspectCached is introspect, answered from the remembered tokens for introspectionTTL.
func (v *Verifier) introspectCached(ctx context.Context, raw string) (Identity, error) {
	if len(raw) > MaxTokenBytes {
		return Identity{}, invalid("the token exceeds %d bytes", MaxTokenBytes)
	}
	sum := sha256.Sum256([]byte(raw))
	now := v.opts.Now()
	v.verified.mu.Lock()
	vt, ok := v.verified.tokens[sum]
	v.verified.mu.Unlock()
	if ok && vt.introspected && now.Before(vt.until) && now.Before(vt.id.Expires.Add(v.opts.Leeway)) {
		return vt.id, nil
	}
	select {
	case v.introspecting <- struct{}{}:
		defer func() { <-v.introspecting }()
	default:
		return Identity{}, fmt.Errorf("%w: %d introspections in flight already", ErrUnavailable, maxIntrospections)
	}
	id, err := v.introspect(ctx, raw)
	if err != nil {
		if ok {
			v.verified.forget(sum)
		}
		return Identity{}, err
	}
	v.verified.remember(sum, verifiedToken{id: id, introspected: true, until: now.Add(introspectionTTL)})
	return id, nil
}

// introspect asks the authorization server about raw and runs the checks of a JWT's claims
// on its answer: active, iss (when given), aud, exp (required), nbf, iat, sub.
func (v *Verifier) introspect(ctx context.Context, raw string) (Identity, error) {
	in := v.opts.Introspection
	// The request is the bastion's: a client that hangs up does not cancel it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
	defer cancel()
	form := url.Values{"token": {raw}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.URL, strings.NewReader(form.Encode()))
	if err != nil {
		return Identity{}, fmt.Errorf("%w: introspection: %w", ErrUnavailable, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(in.ClientID), url.QueryEscape(in.ClientSecret))
	resp, err := v.opts.HTTPClient.Do(req)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: introspection: %w", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Identity{}, fmt.Errorf("%w: introspection: %s (is the bastion's client allowed to introspect?)", ErrUnavailable, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxIntrospectionBytes+1))
	if err != nil || len(data) > maxIntrospectionBytes {
		return Identity{}, fmt.Errorf("%w: introspection: the response is unreadable or exceeds %d bytes", ErrUnavailable, maxIntrospectionBytes)
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(data, &claims); err != nil {
		return Identity{}, fmt.Errorf("%w: introspection: %w", ErrUnavailable, err)
	}
	var active bool
	if json.Unmarshal(claims["active"], &active) != nil || !active {
		return Identity{}, invalid("the authorization server says the token is not active")
	}
	if iss := stringClaim(claims["iss"]); iss != "" && iss != v.opts.Issuer {
		return Identity{}, invalid("issued by %q, not %q", short(iss), v.opts.Issuer)
	}
	if !v.audienceOK(listClaim(claims["aud"], false)) {
		return Identity{}, invalid("the audience (aud) does not name this resource (%s)", v.audiences())
	}
	now := v.opts.Now()
	exp, ok := timeClaim(claims["exp"])
	switch {
	case !ok:
		return Identity{}, invalid("the token has no expiry (exp)")
	case !now.Before(exp.Add(v.opts.Leeway)):
		return Identity{}, invalid("the token expired at %s", exp.UTC().Format(time.RFC3339))
	}
	if nbf, ok := timeClaim(claims["nbf"]); ok && now.Add(v.opts.Leeway).Before(nbf) {
		return Identity{}, invalid("the token is not valid before %s", nbf.UTC().Format(time.RFC3339))
	}
	if iat, ok := timeClaim(claims["iat"]); ok && now.Add(v.opts.Leeway).Before(iat) {
		return Identity{}, invalid("the token was issued in the future")
	}
	sub := stringClaim(claims["sub"])
	if sub == "" || len(sub) > maxSubjectBytes {
		return Identity{}, invalid("the token's subject (sub) must be 1 to %d bytes", maxSubjectBytes)
	}
	return v.identity(v.opts.Issuer, sub, exp, claims), nil
}

// timeClaim reads a NumericDate claim (seconds since the epoch).
func timeClaim(raw json.RawMessage) (time.Time, bool) {
	var secs float64
	if raw == nil || json.Unmarshal(raw, &secs) != nil || secs <= 0 {
		return time.Time{}, false
	}
	return time.Unix(int64(secs), 0), true
}
