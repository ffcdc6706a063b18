package markers

import (
	"errors"
	"fmt"
	"iter"
	"os"

	"github.com/cockroachdb/pebble/v2"
)

// RawJournal is a journal whose keys can be read as they are stored (the key layout of
// keys.go), to copy it to another backend: `postern journal copy`. A copy of every key keeps
// the records, the indexes, the chain and its signed checkpoints as they were, so the copy's
// export is byte for byte the original's.
type RawJournal interface {
	Raw() iter.Seq2[KV, error]
}

// Raw yields every key of the store and its value, in key order, from one snapshot.
func (s *Store) Raw() iter.Seq2[KV, error] {
	return func(yield func(KV, error) bool) {
		if err := s.readable(); err != nil {
			yield(KV{}, err)
			return
		}
		s.commitMu.Lock()
		snap := s.db.NewSnapshot()
		s.commitMu.Unlock()
		defer snap.Close()
		it, err := snap.NewIter(nil)
		if err != nil {
			yield(KV{}, fmt.Errorf("markers: raw: %w", err))
			return
		}
		defer it.Close()
		for ok := it.First(); ok; ok = it.Next() {
			if !yield(KV{Key: append([]byte(nil), it.Key()...), Value: append([]byte(nil), it.Value()...)}, nil) {
				return
			}
		}
		if err := it.Error(); err != nil {
			yield(KV{}, err)
		}
	}
}

// ImportRaw makes a new store in dir, which must not exist, holding kvs (another journal's
// Raw keys), synced. It checks that kvs hold a store of opts.Graph.
func ImportRaw(dir string, opts Options, kvs iter.Seq2[KV, error]) (n int, err error) {
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("markers: import into %s: it exists (the copy goes to a new journal)", dir)
	}
	opts.EnsureDefaults()
	db, err := openPebble(dir, &opts, false)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	b := db.NewBatch()
	sawGraph := false
	for kv, err := range kvs {
		if err != nil {
			return n, err
		}
		if string(kv.Key) == string(metaGraph) {
			if Graph(kv.Value) != opts.Graph {
				return n, fmt.Errorf("markers: import: the source holds %s records, not %s", kv.Value, opts.Graph)
			}
			sawGraph = true
		}
		if err := b.Set(kv.Key, kv.Value, nil); err != nil {
			return n, err
		}
		n++
		if b.Len() >= 4<<20 {
			if err := b.Commit(pebble.Sync); err != nil {
				return n, fmt.Errorf("markers: import: %w", err)
			}
			b = db.NewBatch()
		}
	}
	if !sawGraph {
		if err := b.Set(metaGraph, []byte(opts.Graph), nil); err != nil {
			return n, err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return n, fmt.Errorf("markers: import: %w", err)
	}
	return n, nil
}
