package testutil

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/postern-dev/postern/markers"
)

// AuditKey creates an audit key in a temp dir and returns its signer and verifier key.
func AuditKey(t testing.TB) (markers.Options, string) {
	t.Helper()
	signer, vkey, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	return markers.Options{Signer: signer, Logger: slog.New(slog.DiscardHandler)}, vkey
}

// Store is a store opened on a temp dir, closed at cleanup.
type Store struct {
	*markers.Store
	Dir         string
	Opts        markers.Options
	VerifierKey string
}

// OpenStore opens a fresh store of graph g; adjust options with the optional fns.
func OpenStore(t testing.TB, g markers.Graph, adjust ...func(*markers.Options)) *Store {
	t.Helper()
	opts, vkey := AuditKey(t)
	opts.Graph = g
	for _, f := range adjust {
		f(&opts)
	}
	ts := &Store{Dir: filepath.Join(t.TempDir(), "store"), Opts: opts, VerifierKey: vkey}
	ts.Reopen(t)
	t.Cleanup(func() { ts.Store.Close() })
	return ts
}

// Reopen closes the store if open and opens it again on the same dir.
func (ts *Store) Reopen(t testing.TB) {
	t.Helper()
	if ts.Store != nil {
		ts.Store.Close()
	}
	s, err := markers.Open(ts.Dir, ts.Opts)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	ts.Store = s
}
