package oauth

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"
)

// maxVerified bounds the tokens remembered; when full the memory starts over (a miss costs
// one signature check, never a wrong answer).
const maxVerified = 4096

// A client sends the same token with every request of a session, and a signature check
// costs tens to hundreds of microseconds (BenchmarkVerify); so a token that passed every
// check is remembered by its SHA-256, with what it proved and the key that verified it. A
// remembered token is still checked on every request for what can change after it was
// first seen: its expiry against the clock (with the leeway), and its key still being in
// the issuer's key set — a withdrawn key's tokens are refused from the refetch that drops
// it on (a token of an unknown kid, or the hourly refetch), as if they had never been seen.
type verifiedTokens struct {
	mu     sync.Mutex // guards tokens
	tokens map[[sha256.Size]byte]verifiedToken
}

type verifiedToken struct {
	id       Identity
	kid, alg string
	// introspected: an opaque token the authorization server vouched for, remembered until
	// until (introspect.go); kid and alg are empty.
	introspected bool
	until        time.Time
}

// validateCached is validate, answered from the remembered tokens when it can be.
func (v *Verifier) validateCached(ctx context.Context, raw string) (Identity, error) {
	if v.opts.Introspection != nil && isOpaque(raw) {
		return v.introspectCached(ctx, raw)
	}
	if len(raw) > MaxTokenBytes {
		_, _, _, err := v.validate(ctx, raw)
		return Identity{}, err
	}
	sum := sha256.Sum256([]byte(raw))
	v.verified.mu.Lock()
	vt, ok := v.verified.tokens[sum]
	v.verified.mu.Unlock()
	if ok && !vt.introspected && v.opts.Now().Before(vt.id.Expires.Add(v.opts.Leeway)) && v.keys.has(vt.kid, vt.alg) && !v.keys.stale() {
		return vt.id, nil
	}
	id, kid, alg, err := v.validate(ctx, raw)
	if err != nil {
		if ok {
			v.verified.forget(sum)
		}
		return Identity{}, err
	}
	v.verified.remember(sum, verifiedToken{id: id, kid: kid, alg: alg})
	return id, nil
}

func (c *verifiedTokens) remember(sum [sha256.Size]byte, vt verifiedToken) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokens == nil || len(c.tokens) >= maxVerified {
		c.tokens = make(map[[sha256.Size]byte]verifiedToken)
	}
	c.tokens[sum] = vt
}

func (c *verifiedTokens) forget(sum [sha256.Size]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.tokens, sum)
}
