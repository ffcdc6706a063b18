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
	"sync/atomic"

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

// ActorSet is the remote actors HTTP callers authenticate as, replaceable while serving (a
// config reload): every request is checked against the set in force when it arrives, so a
// removed actor's token is refused from its next request on, whatever session it opened.
type ActorSet struct {
	table atomic.Pointer[actorTable]
}

// NewActorSet validates actors (see newActorTable) and returns them as a set.
func NewActorSet(actors []Actor) (*ActorSet, error) {
	t, err := newActorTable(actors)
	if err != nil {
		return nil, err
	}
	s := &ActorSet{}
	s.table.Store(t)
	return s, nil
}

// CheckActors reports what Replace would refuse in actors, changing nothing.
func CheckActors(actors []Actor) error {
	_, err := newActorTable(actors)
	return err
}

// Replace puts actors in force. Actors that do not validate change nothing.
func (s *ActorSet) Replace(actors []Actor) error {
	t, err := newActorTable(actors)
	if err != nil {
		return err
	}
	s.table.Store(t)
	return nil
}

// actorTable holds the decoded hashes of the configured actors.
type actorTable struct {
	names  []string
	hashes [][sha256.Size]byte
}

// newActorTable validates actors: every name non-empty and unique, every hash 64 hex digits
// and unique (two actors sharing a token would make the actor ambiguous). It reports every
// problem at once.
func newActorTable(actors []Actor) (*actorTable, error) {
	t := &actorTable{}
	var errs []error
	seenName := map[string]bool{}
	seenHash := map[[sha256.Size]byte]string{}
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
		raw, err := hex.DecodeString(a.TokenSHA256)
		if err != nil || len(raw) != sha256.Size {
			errs = append(errs, fmt.Errorf("actor %q: token_sha256 must be 64 hex digits", a.Name))
			continue
		}
		h := [sha256.Size]byte(raw)
		if other, dup := seenHash[h]; dup {
			errs = append(errs, fmt.Errorf("actors %q and %q: same token hash", other, a.Name))
			continue
		}
		seenHash[h] = a.Name
		t.names = append(t.names, a.Name)
		t.hashes = append(t.hashes, h)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("transport: actors: %w", err)
	}
	return t, nil
}

// match returns the actor whose hash equals sha256(token). It compares against every hash
// in constant time and selects the index without branching, so timing reveals neither
// whether nor which actor matched.
func (t *actorTable) match(token string) (string, bool) {
	if len(token) > maxTokenBytes {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	found, index := 0, 0
	for i := range t.hashes {
		eq := subtle.ConstantTimeCompare(sum[:], t.hashes[i][:])
		index = subtle.ConstantTimeSelect(eq, i, index)
		found |= eq
	}
	if found != 1 {
		return "", false
	}
	return t.names[index], true
}

// verifier returns the go-sdk TokenVerifier for HTTP callers, matching against the set in
// force. The Postern-Run header was validated by the guard in front of it.
func (s *ActorSet) verifier() auth.TokenVerifier {
	return func(_ context.Context, token string, req *http.Request) (*auth.TokenInfo, error) {
		name, ok := s.table.Load().match(token)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		runID, _ := runIDFromHeader(req.Header)
		return TokenInfoFor(Caller{Actor: "token:" + name, RunID: runID}), nil
	}
}
