// Package sshca is the bastion as its hosts' SSH user certificate authority ([ssh_ca],
// docs/ssh-ca.md): the CA's keys on disk in generations (store.go), the user certificates
// it signs (cert.go), and each replica's own short-lived certificate, renewed before it
// expires, that the SSH pool logs in with (issuer.go).
//
// Invariants: a CA private key is only ever on the bastion, 0600 in a 0700 directory; a
// generation signs only from its signs_from time on and never once retired (its private key
// is deleted); every generation that is not retired is published (Trusted), so hosts
// trust the next key before it signs and the previous one until it is retired; every CA
// event (created, rotated, activated, retired) is appended to events.jsonl before the command that made
// it reports success.
package sshca

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/internal/privdir"
)

// Files in the CA directory.
const (
	stateFile  = "ca.json"
	eventsFile = "events.jsonl"
	// maxStateBytes bounds ca.json: a generation takes ~300 bytes, and retired ones stay
	// listed, so this is thousands of rotations.
	maxStateBytes = 1 << 20
)

// Errors callers branch on.
var (
	// ErrNoCA: the directory holds no CA yet (Init makes one).
	ErrNoCA = errors.New("sshca: no SSH CA yet")
	// ErrRotationPending: a generation already waits for its signs_from time; retire or
	// wait for it before rotating again.
	ErrRotationPending = errors.New("sshca: a rotation is already pending")
	// ErrTooEarly: retiring now could refuse certificates still in use.
	ErrTooEarly = errors.New("sshca: too early to retire")
	// ErrNothingToRetire: no generation is older than the one signing.
	ErrNothingToRetire = errors.New("sshca: nothing to retire")
)

// Generation is one CA key.
type Generation struct {
	ID          int    `json:"id"`
	Fingerprint string `json:"fingerprint"`
	// PublicKey is the authorized_keys line hosts trust (TrustedUserCAKeys).
	PublicKey string    `json:"public_key"`
	Created   time.Time `json:"created"`
	// SignsFrom is when it starts signing: hosts have until then to trust it.
	SignsFrom time.Time `json:"signs_from"`
	// Retired is when it was retired (its private key deleted); zero while in use.
	Retired time.Time `json:"retired,omitzero"`
}

// State is ca.json: every generation, oldest first.
type State struct {
	Generations []Generation `json:"generations"`
}

// Signing is the generation that signs at now: the newest one not retired whose SignsFrom
// has come.
func (st State) Signing(now time.Time) (Generation, bool) {
	for i := len(st.Generations) - 1; i >= 0; i-- {
		g := st.Generations[i]
		if g.Retired.IsZero() && !now.Before(g.SignsFrom) {
			return g, true
		}
	}
	return Generation{}, false
}

// Trusted are the generations hosts must trust now: every one not retired (the signing one,
// a pending next one, and a previous one until it is retired).
func (st State) Trusted() []Generation {
	var out []Generation
	for _, g := range st.Generations {
		if g.Retired.IsZero() {
			out = append(out, g)
		}
	}
	return out
}

// Pending is the generation that will sign once its SignsFrom comes, if any.
func (st State) Pending(now time.Time) (Generation, bool) {
	for _, g := range st.Generations {
		if g.Retired.IsZero() && now.Before(g.SignsFrom) {
			return g, true
		}
	}
	return Generation{}, false
}

// TrustedLines are the lines of a TrustedUserCAKeys file (or a hostagent's
// trusted_user_ca_keys_file) that trust exactly the generations not retired.
func (st State) TrustedLines() string {
	var b strings.Builder
	for _, g := range st.Trusted() {
		fmt.Fprintf(&b, "%s postern-ssh-ca-%d\n", g.PublicKey, g.ID)
	}
	return b.String()
}

// Event is one line of events.jsonl.
type Event struct {
	At          time.Time `json:"at"`
	Event       string    `json:"event"` // created, rotated, activated, retired
	Generation  int       `json:"generation"`
	Fingerprint string    `json:"fingerprint"`
	SignsFrom   time.Time `json:"signs_from,omitzero"`
	By          string    `json:"by"`
}

// Store is a CA directory. It is read by every replica sharing it and written by the
// `postern ca` commands (and Init at the first start); each write replaces ca.json whole
// (durable), so a reader sees one state or the next, never a part.
type Store struct {
	dir string
}

// Open returns the store in dir; nothing is read or created yet.
func Open(dir string) *Store { return &Store{dir: dir} }

// Dir is the CA directory.
func (s *Store) Dir() string { return s.dir }

// StatePath is ca.json, whose changes the issuer watches.
func (s *Store) StatePath() string { return filepath.Join(s.dir, stateFile) }

// EventsPath is the CA's event log.
func (s *Store) EventsPath() string { return filepath.Join(s.dir, eventsFile) }

func (s *Store) keyPath(id int) string { return filepath.Join(s.dir, "ca-"+strconv.Itoa(id)) }

// lock serializes the changes to the CA (an exclusive flock on key_dir/.lock): two commands
// at once, or two replicas' first starts on a shared key_dir, each read the state the other
// wrote. Readers take no lock; ca.json is replaced whole.
func (s *Store) lock() (unlock func(), err error) {
	if err := privdir.Ensure(s.dir, "ssh_ca dir", nil); err != nil {
		return nil, fmt.Errorf("sshca: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sshca: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("sshca: lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}

// State reads ca.json; ErrNoCA when there is none.
func (s *Store) State() (State, error) {
	f, err := os.Open(s.StatePath())
	if errors.Is(err, os.ErrNotExist) {
		return State{}, fmt.Errorf("%w in %s (postern serve with [ssh_ca] enabled, or postern ca init, makes one)", ErrNoCA, s.dir)
	}
	if err != nil {
		return State{}, fmt.Errorf("sshca: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return State{}, fmt.Errorf("sshca: read %s: %w", s.StatePath(), err)
	}
	if len(data) > maxStateBytes {
		return State{}, fmt.Errorf("sshca: %s is larger than %d bytes", s.StatePath(), maxStateBytes)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return State{}, fmt.Errorf("sshca: %s: %w", s.StatePath(), err)
	}
	if len(st.Generations) == 0 {
		return State{}, fmt.Errorf("%w: %s lists no generation", ErrNoCA, s.StatePath())
	}
	return st, nil
}

// Init makes the first generation, signing at once, unless the directory holds a CA
// already; created says whether it did.
func (s *Store) Init(now time.Time, by string) (st State, created bool, err error) {
	st, err = s.State()
	if err == nil || !errors.Is(err, ErrNoCA) {
		return st, false, err
	}
	unlock, err := s.lock()
	if err != nil {
		return State{}, false, err
	}
	defer unlock()
	st, err = s.State() // made meanwhile?
	if err == nil || !errors.Is(err, ErrNoCA) {
		return st, false, err
	}
	g, err := s.newGeneration(1, now, now)
	if err != nil {
		return State{}, false, err
	}
	st = State{Generations: []Generation{g}}
	if err := s.commit(st, Event{At: now, Event: "created", Generation: g.ID, Fingerprint: g.Fingerprint, SignsFrom: g.SignsFrom, By: by}, true); err != nil {
		return State{}, false, err
	}
	return st, true, nil
}

// Rotate makes the next generation, which signs from now+overlap: hosts must trust it
// (postern ca keys) before then. An overlap of 0 signs with it at once — for hosts that
// already trust it.
func (s *Store) Rotate(now time.Time, overlap time.Duration, by string) (Generation, error) {
	unlock, err := s.lock()
	if err != nil {
		return Generation{}, err
	}
	defer unlock()
	st, err := s.State()
	if err != nil {
		return Generation{}, err
	}
	if p, ok := st.Pending(now); ok {
		return Generation{}, fmt.Errorf("%w: generation %d signs from %s", ErrRotationPending, p.ID, p.SignsFrom.UTC().Format(time.RFC3339))
	}
	next := st.Generations[len(st.Generations)-1].ID + 1
	g, err := s.newGeneration(next, now, now.Add(overlap))
	if err != nil {
		return Generation{}, err
	}
	st.Generations = append(st.Generations, g)
	return g, s.commit(st, Event{At: now, Event: "rotated", Generation: g.ID, Fingerprint: g.Fingerprint, SignsFrom: g.SignsFrom, By: by}, false)
}

// Activate makes the pending generation sign now, before its overlap ends: for when every
// host already trusts it (postern ca keys shows it).
func (s *Store) Activate(now time.Time, by string) (Generation, error) {
	unlock, err := s.lock()
	if err != nil {
		return Generation{}, err
	}
	defer unlock()
	st, err := s.State()
	if err != nil {
		return Generation{}, err
	}
	p, ok := st.Pending(now)
	if !ok {
		return Generation{}, errors.New("sshca: no generation is pending (postern ca rotate makes one)")
	}
	for i := range st.Generations {
		if st.Generations[i].ID == p.ID {
			st.Generations[i].SignsFrom = now.UTC()
			p = st.Generations[i]
		}
	}
	return p, s.commit(st, Event{At: now, Event: "activated", Generation: p.ID, Fingerprint: p.Fingerprint, SignsFrom: p.SignsFrom, By: by}, false)
}

// Retire retires every generation older than the one signing now, deleting their private
// keys: hosts may drop them from their trusted CA files. Unless force, it refuses while a
// certificate they signed may still be valid: before the signing generation has signed
// for certLifetime (each replica renews onto it within that time).
func (s *Store) Retire(now time.Time, certLifetime time.Duration, force bool, by string) ([]Generation, error) {
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := s.State()
	if err != nil {
		return nil, err
	}
	cur, ok := st.Signing(now)
	if !ok {
		return nil, fmt.Errorf("%w: no generation signs now", ErrNothingToRetire)
	}
	var retired []Generation
	var events []Event
	for i, g := range st.Generations {
		if g.ID >= cur.ID || !g.Retired.IsZero() {
			continue
		}
		if !force && now.Before(cur.SignsFrom.Add(certLifetime)) {
			return nil, fmt.Errorf("%w: certificates of generation %d may be valid until %s (generation %d has signed since %s); retire after that, or with --force",
				ErrTooEarly, g.ID, cur.SignsFrom.Add(certLifetime).UTC().Format(time.RFC3339), cur.ID, cur.SignsFrom.UTC().Format(time.RFC3339))
		}
		st.Generations[i].Retired = now
		retired = append(retired, st.Generations[i])
		events = append(events, Event{At: now, Event: "retired", Generation: g.ID, Fingerprint: g.Fingerprint, By: by})
	}
	if len(retired) == 0 {
		return nil, fmt.Errorf("%w: generation %d signs and none older is in use", ErrNothingToRetire, cur.ID)
	}
	if err := s.commit(st, events[0], false, events[1:]...); err != nil {
		return nil, err
	}
	for _, g := range retired {
		if err := os.Remove(s.keyPath(g.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return retired, fmt.Errorf("sshca: retired generation %d, but its key could not be deleted: %w", g.ID, err)
		}
	}
	return retired, nil
}

// Signer loads generation g's private key.
func (s *Store) Signer(g Generation) (gossh.Signer, error) {
	if !g.Retired.IsZero() {
		return nil, fmt.Errorf("sshca: generation %d is retired", g.ID)
	}
	path := s.keyPath(g.ID)
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("sshca: CA key of generation %d: %w", g.ID, err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("sshca: CA key %s is readable by others (mode %#o): chmod 600 it", path, info.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sshca: %w", err)
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("sshca: CA key %s: %w", path, err)
	}
	if gossh.FingerprintSHA256(signer.PublicKey()) != g.Fingerprint {
		return nil, fmt.Errorf("sshca: CA key %s is %s, but ca.json says generation %d is %s", path,
			gossh.FingerprintSHA256(signer.PublicKey()), g.ID, g.Fingerprint)
	}
	return signer, nil
}

// Events reads the CA's event log.
func (s *Store) Events() ([]Event, error) {
	data, err := os.ReadFile(s.EventsPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sshca: %w", err)
	}
	var out []Event
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("sshca: %s line %d: %w", s.EventsPath(), i+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// newGeneration writes a new ed25519 CA key (0600, create only) and describes it.
func (s *Store) newGeneration(id int, now, signsFrom time.Time) (Generation, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Generation{}, fmt.Errorf("sshca: generate CA key: %w", err)
	}
	block, err := gossh.MarshalPrivateKey(priv, fmt.Sprintf("postern-ssh-ca-%d", id))
	if err != nil {
		return Generation{}, fmt.Errorf("sshca: encode CA key: %w", err)
	}
	if err := durable.CreateFile(s.keyPath(id), pem.EncodeToMemory(block), 0o600); err != nil {
		return Generation{}, fmt.Errorf("sshca: write CA key: %w", err)
	}
	pub, err := gossh.NewPublicKey(priv.Public())
	if err != nil {
		return Generation{}, err
	}
	return Generation{
		ID: id, Fingerprint: gossh.FingerprintSHA256(pub), Created: now.UTC(), SignsFrom: signsFrom.UTC(),
		PublicKey: strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pub))),
	}, nil
}

// commit logs the events, then writes st: an event is never missing from the log for a
// state that holds it. create writes ca.json only if it does not exist (Init racing a
// command).
func (s *Store) commit(st State, first Event, create bool, more ...Event) error {
	var lines []byte
	for _, e := range append([]Event{first}, more...) {
		e.At = e.At.UTC()
		line, err := json.Marshal(e)
		if err != nil {
			return err
		}
		lines = append(append(lines, line...), '\n')
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := durable.AppendFile(s.EventsPath(), lines); err != nil {
		return fmt.Errorf("sshca: log the CA event: %w", err)
	}
	if create {
		err = durable.CreateFile(s.StatePath(), append(data, '\n'), 0o600)
	} else {
		err = durable.WriteFile(s.StatePath(), append(data, '\n'), 0o600)
	}
	if err != nil {
		return fmt.Errorf("sshca: write %s: %w", s.StatePath(), err)
	}
	return nil
}
