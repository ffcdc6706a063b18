// Package tokens is the store of the bearer tokens `postern token` issues: for each, an id,
// the actor it names, the token's SHA-256 (never the token), who issued it and when, when it
// expires (or never) and whether an operator revoked it. The running daemon is its only
// writer; it authenticates HTTP callers against it (bastion/transport) from the moment a
// change returns.
//
// Invariants: every issue and every revocation is appended to the token log
// (<state dir>/tokens.jsonl, synced) before it applies, and the store file
// (<state dir>/tokens.json, replaced durably) holds the set in force; both are 0600. A revoked
// token stays revoked: nothing un-revokes it. The store is bounded (MaxTokens); a store file
// that does not parse stops the daemon rather than letting revoked tokens in again.
package tokens

import (
	"bytes"
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/postern-dev/postern/internal/durable"
)

// File names in the state dir.
const (
	StoreFile = "tokens.json"
	LogFile   = "tokens.jsonl"
)

// Bounds.
const (
	// MaxTokens bounds the tokens the store holds, ended ones (expired, revoked) included
	// until they are dropped (Retain).
	MaxTokens = 10000
	// maxStoreBytes bounds the store file read at start (a token is ~300 bytes of JSON).
	maxStoreBytes = 16 << 20
	// MaxLifetime bounds an expiry: far enough for any service account that rotates, near
	// enough that a typo (`--expires 3000d`) is caught.
	MaxLifetime = 5 * 365 * 24 * time.Hour
	// DefaultLifetime is a token's lifetime when the operator names none: a credential that
	// is forgotten still ends. `--expires never` is there for who means it.
	DefaultLifetime = 90 * 24 * time.Hour
	// Retain is how long an ended token stays listed before the store drops it (the log
	// keeps its history).
	Retain = 30 * 24 * time.Hour
)

// Token is one issued token as the store keeps it.
type Token struct {
	ID     string `json:"id"`
	Actor  string `json:"actor"`
	SHA256 string `json:"sha256"` // hex SHA-256 of the token
	// Created is when it was issued, CreatedBy the operator who issued it.
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
	// Expires is the first instant the token is refused; zero for never.
	Expires time.Time `json:"expires,omitzero"`
	// Revoked is when an operator (RevokedBy) revoked it; zero if not.
	Revoked   time.Time `json:"revoked,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
}

// State is what a token is at an instant.
type State string

const (
	Active  State = "active"
	Expired State = "expired"
	Revoked State = "revoked"
)

// StateAt is t's state at now: revoked wins over expired; a token expires at Expires itself.
func (t Token) StateAt(now time.Time) State {
	switch {
	case !t.Revoked.IsZero():
		return Revoked
	case !t.Expires.IsZero() && !now.Before(t.Expires):
		return Expired
	}
	return Active
}

// endedAt is when t stopped being usable (zero while it is).
func (t Token) endedAt(now time.Time) time.Time {
	switch t.StateAt(now) {
	case Revoked:
		return t.Revoked
	case Expired:
		return t.Expires
	}
	return time.Time{}
}

// idPattern is a token id: "tok_" and 16 base32 characters (80 random bits: ids are named in
// commands and logs, they need to be unique, not secret).
var idPattern = regexp.MustCompile(`^tok_[a-z2-7]{16}$`)

// ValidID reports whether s has the form of a token id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// actorPattern is an actor name as the config accepts it.
var actorPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

func newID() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("tokens: new id: %w", err)
	}
	return "tok_" + strings.ToLower(base32.StdEncoding.EncodeToString(b[:])), nil
}

// ParseExpiry reads an expiry as `postern token --expires` takes it, relative to now: ""
// (DefaultLifetime from now), "never" (no expiry), a lifetime ("30d", "12h", "90m", "1h30m"; d is 24h) or an instant
// (RFC 3339, "2026-12-31T00:00:00Z"). It must lie in the future, at most MaxLifetime away.
func ParseExpiry(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "":
		return now.Add(DefaultLifetime), nil
	case "never":
		return time.Time{}, nil
	}
	var at time.Time
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		at = t
	} else if d, ok := parseLifetime(s); ok {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("expiry %q: a lifetime must be positive", s)
		}
		if d > MaxLifetime {
			return time.Time{}, fmt.Errorf("expiry %q: at most %dd", s, int(MaxLifetime/(24*time.Hour)))
		}
		at = now.Add(d)
	} else {
		return time.Time{}, fmt.Errorf("expiry %q: want a lifetime (30d, 12h, 90m), an instant (2026-12-31T00:00:00Z) or never", s)
	}
	if !at.After(now) {
		return time.Time{}, fmt.Errorf("expiry %q: %s is not in the future", s, at.UTC().Format(time.RFC3339))
	}
	if at.Sub(now) > MaxLifetime {
		return time.Time{}, fmt.Errorf("expiry %q: at most %dd from now", s, int(MaxLifetime/(24*time.Hour)))
	}
	return at.UTC(), nil
}

// parseLifetime reads "<n>d" or a Go duration.
func parseLifetime(s string) (time.Duration, bool) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, false
		}
		// Clamped before multiplying, so that a huge count cannot overflow into a valid one.
		n = max(0, min(n, int(MaxLifetime/(24*time.Hour))+1))
		return time.Duration(n) * 24 * time.Hour, true
	}
	d, err := time.ParseDuration(s)
	return d, err == nil
}

// Errors callers branch on.
var (
	ErrNotFound = errors.New("no such token")
	ErrFull     = errors.New("token store full")
)

// Store is the issued tokens of one state dir, as the daemon keeps them.
type Store struct {
	dir string

	// mu serializes changes and guards tokens (the set in force, as the file has it).
	mu     sync.Mutex
	tokens []Token
}

// Open reads the store in stateDir (none yet: empty).
func Open(stateDir string) (*Store, error) {
	toks, err := Load(stateDir)
	if err != nil {
		return nil, err
	}
	return &Store{dir: stateDir, tokens: toks}, nil
}

// Load reads the store file of stateDir, read-only (postern token list with the daemon down).
func Load(stateDir string) ([]Token, error) {
	path := filepath.Join(stateDir, StoreFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStoreBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokens: read %s: %w", path, err)
	}
	if len(data) > maxStoreBytes {
		return nil, fmt.Errorf("tokens: %s is larger than %d bytes; it is not a store this bastion wrote", path, maxStoreBytes)
	}
	toks, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("tokens: %s: %w (restore it from a backup: removing it would let no issued token in, not even the valid ones)", path, err)
	}
	return toks, nil
}

// storeFile is the store file's form.
type storeFile struct {
	Tokens []Token `json:"tokens"`
}

// decode parses and checks a store file: ids, actors and hashes well formed, ids and hashes
// unique, at most MaxTokens.
func decode(data []byte) ([]Token, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f storeFile
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if len(f.Tokens) > MaxTokens {
		return nil, fmt.Errorf("%d tokens, more than %d", len(f.Tokens), MaxTokens)
	}
	ids, hashes := map[string]bool{}, map[string]bool{}
	for i, t := range f.Tokens {
		if err := t.check(); err != nil {
			return nil, fmt.Errorf("tokens[%d]: %w", i, err)
		}
		if ids[t.ID] || hashes[t.SHA256] {
			return nil, fmt.Errorf("tokens[%d] (%s): id or hash twice", i, t.ID)
		}
		ids[t.ID], hashes[t.SHA256] = true, true
	}
	return f.Tokens, nil
}

func (t Token) check() error {
	if !ValidID(t.ID) {
		return fmt.Errorf("id %q is not a token id", t.ID)
	}
	if !actorPattern.MatchString(t.Actor) {
		return fmt.Errorf("%s: actor %q is not an actor name", t.ID, t.Actor)
	}
	if b, err := hex.DecodeString(t.SHA256); err != nil || len(b) != 32 || strings.ToLower(t.SHA256) != t.SHA256 {
		return fmt.Errorf("%s: sha256 must be 64 lower-case hex digits", t.ID)
	}
	if t.Created.IsZero() {
		return fmt.Errorf("%s: no creation time", t.ID)
	}
	return nil
}

// Tokens is the store's tokens, oldest first (a copy).
func (s *Store) Tokens() []Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Token(nil), s.tokens...)
}

// Event is one line of the token log.
type Event struct {
	At    time.Time `json:"at"`
	By    string    `json:"by"`
	Event string    `json:"event"` // "issue" or "revoke"
	ID    string    `json:"id"`
	Actor string    `json:"actor"`
	// Expires is an issued token's expiry (zero: never).
	Expires time.Time `json:"expires,omitzero"`
}

// Issue records a new token of actor with the token's hex SHA-256 and expiry (zero: never),
// issued by by at now, and returns it. The caller made the token and gives it out once this
// returns; the store never sees it.
func (s *Store) Issue(actor, sha256Hex string, expires time.Time, by string, now time.Time) (Token, error) {
	id, err := newID()
	if err != nil {
		return Token{}, err
	}
	t := Token{ID: id, Actor: actor, SHA256: sha256Hex, Created: now.UTC(), CreatedBy: by, Expires: expires}
	if err := t.check(); err != nil {
		return Token{}, fmt.Errorf("tokens: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := retained(s.tokens, now)
	if len(next) >= MaxTokens {
		return Token{}, fmt.Errorf("tokens: %w: %d tokens in use or ended less than %v ago; revoke the ones nobody uses", ErrFull, len(next), Retain)
	}
	for _, o := range next {
		if o.ID == t.ID || o.SHA256 == t.SHA256 {
			return Token{}, fmt.Errorf("tokens: a token with this id or hash exists; issue again")
		}
	}
	next = append(next, t)
	if err := s.commit(next, Event{At: t.Created, By: by, Event: "issue", ID: t.ID, Actor: actor, Expires: expires}); err != nil {
		return Token{}, err
	}
	return t, nil
}

// Revoke revokes the token id at now, by by, and returns it; changed is false if it was
// revoked already (then nothing is written).
func (s *Store) Revoke(id, by string, now time.Time) (t Token, changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := -1
	for j := range s.tokens {
		if s.tokens[j].ID == id {
			i = j
		}
	}
	if i < 0 {
		return Token{}, false, fmt.Errorf("tokens: %s: %w", id, ErrNotFound)
	}
	if !s.tokens[i].Revoked.IsZero() {
		return s.tokens[i], false, nil
	}
	next := append([]Token(nil), s.tokens...)
	next[i].Revoked, next[i].RevokedBy = now.UTC(), by
	t = next[i]
	if err := s.commit(retained(next, now), Event{At: t.Revoked, By: by, Event: "revoke", ID: id, Actor: t.Actor}); err != nil {
		return Token{}, false, err
	}
	return t, true, nil
}

// retained is toks without those that ended more than Retain before now (a new slice).
func retained(toks []Token, now time.Time) []Token {
	out := make([]Token, 0, len(toks)+1)
	for _, t := range toks {
		if end := t.endedAt(now); !end.IsZero() && now.Sub(end) > Retain {
			continue
		}
		out = append(out, t)
	}
	return out
}

// commit logs ev (synced), then writes next as the store file and puts it in force. A failed
// write changes nothing in force. Called with s.mu held.
func (s *Store) commit(next []Token, ev Event) error {
	line, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("tokens: %w", err)
	}
	if err := durable.AppendFile(filepath.Join(s.dir, LogFile), append(line, '\n')); err != nil {
		return fmt.Errorf("tokens: the token log could not be written, nothing changed: %w", err)
	}
	data, err := json.MarshalIndent(storeFile{Tokens: next}, "", "  ")
	if err != nil {
		return err
	}
	if err := durable.WriteFile(filepath.Join(s.dir, StoreFile), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("tokens: the store could not be written, nothing changed (the log records the attempt): %w", err)
	}
	s.tokens = next
	return nil
}
