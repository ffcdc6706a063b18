package transport

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// Actor is a remote agent identity as stored in config: a name and the hash of its token.
type Actor struct {
	Name string
	// TokenSHA256 is the hex SHA-256 of the bearer token (see HashToken).
	TokenSHA256 string
}

// tokenPrefix marks Postern tokens so that secret scanners and humans recognise them.
const tokenPrefix = "pst_"

// maxTokenBytes bounds a presented token; longer ones are rejected before hashing.
const maxTokenBytes = 512

// HashToken returns the hex SHA-256 config form of a token (used by `postern up` to write
// config). A plain hash suffices: tokens are 256-bit random, so there is nothing to brute-force.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// NewToken returns a new random bearer token: "pst_" + base64url of 32 bytes from crypto/rand.
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("transport: new token: %w", err)
	}
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// IssuedToken is a token issued by `postern token` (bastion/tokens), as the HTTP endpoint
// checks it: besides its hash, an id, an expiry (zero: never) and whether it was revoked.
type IssuedToken struct {
	ID      string
	Actor   string
	SHA256  string
	Expires time.Time
	Revoked bool
}

// Why a presented token was refused, for the daemon's log (a token's state, never the token).
var (
	errUnknownToken = errors.New("unknown token")
	errTokenExpired = errors.New("token expired")
	errTokenRevoked = errors.New("token revoked")
)

// ActorSet is the remote actors HTTP callers authenticate as — the config's actors with their
// static tokens, and the tokens issued to them — replaceable while serving (a config reload,
// a token issued or revoked): every request is checked against the set in force when it
// arrives, and an issued token's expiry against the clock, so a removed actor's token, a
// revoked or an expired one is refused from its next request on, whatever session or
// connection it opened.
type ActorSet struct {
	now func() time.Time

	// mu serializes rebuilds and guards actors, issued and used; requests read table alone.
	mu     sync.Mutex
	actors []Actor
	issued []IssuedToken
	// used holds each credential's last use (unix nanoseconds) by useKey, kept across
	// rebuilds so that a reload does not forget it.
	used  map[string]*atomic.Int64
	table atomic.Pointer[actorTable]
}

// NewActorSet validates actors and issued (see newActorTable) and returns them as a set that
// reads the time from now (nil: time.Now).
func NewActorSet(actors []Actor, issued []IssuedToken, now func() time.Time) (*ActorSet, error) {
	if now == nil {
		now = time.Now
	}
	s := &ActorSet{now: now, used: map[string]*atomic.Int64{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.rebuild(actors, issued); err != nil {
		return nil, err
	}
	return s, nil
}

// CheckActors reports what Replace would refuse in actors, changing nothing.
func (s *ActorSet) CheckActors(actors []Actor) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := newActorTable(actors, s.issued, nil)
	return err
}

// Replace puts actors in force, with the issued tokens in force. Actors that do not validate
// change nothing.
func (s *ActorSet) Replace(actors []Actor) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rebuild(actors, s.issued)
}

// SetIssued puts issued in force, with the actors in force; tokens of actors the set does
// not have are ignored (they cannot authenticate as anyone). Tokens that do not validate
// change nothing.
func (s *ActorSet) SetIssued(issued []IssuedToken) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rebuild(s.actors, issued)
}

// rebuild validates and stores the table. Called with s.mu held.
func (s *ActorSet) rebuild(actors []Actor, issued []IssuedToken) error {
	t, err := newActorTable(actors, issued, s.used)
	if err != nil {
		return err
	}
	s.actors, s.issued = actors, issued
	s.table.Store(t)
	// Forget the last use of credentials the table no longer has (bounded by the store).
	inUse := make(map[*atomic.Int64]bool, len(t.creds))
	for _, c := range t.creds {
		inUse[c.used] = true
	}
	for key, u := range s.used {
		if !inUse[u] {
			delete(s.used, key)
		}
	}
	return nil
}

// LastUsed is when the credential was last accepted since the daemon started (zero: not
// since): an issued token by id, a config token by StaticID(actor).
func (s *ActorSet) LastUsed(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.used[id]; ok && u.Load() != 0 {
		return time.Unix(0, u.Load())
	}
	return time.Time{}
}

// StaticID names the config token of actor where issued tokens have an id.
func StaticID(actor string) string { return "config:" + actor }

// credential is one token the table accepts.
type credential struct {
	actor   string
	expires time.Time // zero: never
	revoked bool
	used    *atomic.Int64
}

// actorTable holds the decoded hashes of the configured actors' tokens and the issued ones.
type actorTable struct {
	creds  []credential
	hashes [][sha256.Size]byte
}

// newActorTable validates actors: every name non-empty and unique, every hash 64 hex digits
// and unique (two credentials sharing a token would make the actor ambiguous). It reports
// every problem at once. Issued tokens of actors not in actors are left out. used, when not
// nil, gets the last-use counter of every credential.
func newActorTable(actors []Actor, issued []IssuedToken, used map[string]*atomic.Int64) (*actorTable, error) {
	t := &actorTable{}
	var errs []error
	seenName := map[string]bool{}
	seenHash := map[[sha256.Size]byte]string{}
	add := func(what, useKey, hash string, c credential) {
		raw, err := hex.DecodeString(hash)
		if err != nil || len(raw) != sha256.Size {
			errs = append(errs, fmt.Errorf("%s: token hash must be 64 hex digits", what))
			return
		}
		h := [sha256.Size]byte(raw)
		if other, dup := seenHash[h]; dup {
			errs = append(errs, fmt.Errorf("%s and %s: same token hash", other, what))
			return
		}
		seenHash[h] = what
		if used != nil {
			if used[useKey] == nil {
				used[useKey] = new(atomic.Int64)
			}
			c.used = used[useKey]
		} else {
			c.used = new(atomic.Int64)
		}
		t.creds = append(t.creds, c)
		t.hashes = append(t.hashes, h)
	}
	for i, a := range actors {
		if a.Name == "" || strings.ContainsFunc(a.Name, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			errs = append(errs, fmt.Errorf("actor %d: name %q must be non-empty, without spaces or control characters", i, a.Name))
			continue
		}
		if seenName[a.Name] {
			errs = append(errs, fmt.Errorf("actor %q: configured twice", a.Name))
			continue
		}
		seenName[a.Name] = true
		if a.TokenSHA256 != "" { // "": the actor's tokens are issued ones only
			add(fmt.Sprintf("actor %q", a.Name), StaticID(a.Name), a.TokenSHA256, credential{actor: a.Name})
		}
	}
	for _, it := range issued {
		if seenName[it.Actor] {
			add("token "+it.ID, it.ID, it.SHA256, credential{actor: it.Actor, expires: it.Expires, revoked: it.Revoked})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("transport: actors: %w", err)
	}
	return t, nil
}

// match returns the credential whose hash equals sha256(token). It compares against every
// hash in constant time and selects the index without branching, so timing reveals neither
// whether nor which credential matched (what happens after a match — an expired or revoked
// one is refused — depends on the credential, which the caller holds already).
func (t *actorTable) match(token string) (credential, bool) {
	if len(token) > maxTokenBytes {
		return credential{}, false
	}
	sum := sha256.Sum256([]byte(token))
	found, index := 0, 0
	for i := range t.hashes {
		eq := subtle.ConstantTimeCompare(sum[:], t.hashes[i][:])
		index = subtle.ConstantTimeSelect(eq, i, index)
		found |= eq
	}
	if found != 1 {
		return credential{}, false
	}
	return t.creds[index], true
}

// authenticate returns the actor token proves at now, or why it proves none.
func (t *actorTable) authenticate(token string, now time.Time) (string, error) {
	c, ok := t.match(token)
	switch {
	case !ok:
		return "", errUnknownToken
	case c.revoked:
		return "", errTokenRevoked
	case !c.expires.IsZero() && !now.Before(c.expires):
		return "", errTokenExpired
	}
	c.used.Store(now.UnixNano())
	return c.actor, nil
}

// verifier returns the go-sdk TokenVerifier for HTTP callers, matching against the set in
// force. The Postern-Run header was validated by the guard in front of it. A refusal is
// noted in the request's authState (HTTPHandler logs it and answers the challenge).
func (s *ActorSet) verifier() auth.TokenVerifier {
	return func(ctx context.Context, token string, req *http.Request) (*auth.TokenInfo, error) {
		name, err := s.table.Load().authenticate(token, s.now())
		if err != nil {
			if st, ok := ctx.Value(authStateKey{}).(*authState); ok {
				st.refuse(err)
			}
			return nil, fmt.Errorf("%w: %w", auth.ErrInvalidToken, err)
		}
		runID, _ := runIDFromHeader(req.Header)
		return TokenInfoFor(Caller{Actor: "token:" + name, RunID: runID}), nil
	}
}
