package hostagent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/postern-dev/postern/markers"
)

// memStore stands in for the marker store in the markers-off benchmark: the same records in
// memory, nothing written to disk.
type memStore struct {
	mu   sync.Mutex // guards recs
	recs map[string]*markers.Record
	// failCreate, if set, is what every Create returns (a failing disk).
	failCreate error
}

func newMemStore() *memStore { return &memStore{recs: map[string]*markers.Record{}} }

func (m *memStore) Create(_ context.Context, r *markers.Record) (*markers.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failCreate != nil {
		return nil, m.failCreate
	}
	if prior, ok := m.recs[r.ID]; ok {
		return prior.Clone(), markers.ErrExists
	}
	rec := r.Clone()
	rec.Graph, rec.State = markers.HostGraph, markers.Started
	m.recs[r.ID] = rec
	return rec.Clone(), nil
}

func (m *memStore) Transition(ctx context.Context, id string, from, to markers.State, note string, mutate func(*markers.Record) error) (*markers.Record, error) {
	return m.Advance(ctx, id, from, []markers.State{to}, note, mutate)
}

func (m *memStore) Advance(_ context.Context, id string, from markers.State, path []markers.State, _ string, mutate func(*markers.Record) error) (*markers.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return nil, markers.ErrNotFound
	}
	if rec.State != from {
		return rec.Clone(), fmt.Errorf("%w: %s", markers.ErrConflict, rec.State)
	}
	if mutate != nil {
		if err := mutate(rec); err != nil {
			return nil, err
		}
	}
	rec.State = path[len(path)-1]
	return rec.Clone(), nil
}

func (m *memStore) Update(_ context.Context, id, _ string, mutate func(*markers.Record) error) (*markers.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return nil, markers.ErrNotFound
	}
	return rec.Clone(), mutate(rec)
}

func (m *memStore) Get(id string) (*markers.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec, ok := m.recs[id]; ok {
		return rec.Clone(), nil
	}
	return nil, markers.ErrNotFound
}

func (m *memStore) List(markers.Query) ([]*markers.Record, string, error) { return nil, "", nil }
func (m *memStore) FindByOperationKey(string) (*markers.Record, error) {
	return nil, markers.ErrNotFound
}
func (m *memStore) Export(io.Writer) error { return nil }

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
