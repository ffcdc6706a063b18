package markers

import (
	"errors"
	"fmt"
	"iter"

	"github.com/cockroachdb/pebble/v2"
)

// IndexVersion is the version of the indexes a store written by an older release may lack:
// the actor and run indexes (journal: List by actor or agent run reads only that actor's or
// run's executions). A store records the version it holds under metaIndex; one opened for
// writing without it builds them once (buildIndexes), and until then List by actor scans the
// time index, as before.
const IndexVersion = "1"

// IndexVersionKey holds the index version (see IndexVersion).
func IndexVersionKey() []byte { return metaIndex }

// IndexEntriesOf are the index entries a store of IndexVersion holds for rec beyond those of
// older releases: what building the indexes adds for each record, on every backend.
func IndexEntriesOf(rec *Record) [][]byte {
	if rec.Graph != JournalGraph || rec.Actor == "" {
		return nil
	}
	return [][]byte{timedKey(actorPrefix(rec.Actor), rec.CreatedAt, rec.ID),
		timedKey(runPrefix(rec.Actor, rec.IntentScope), rec.CreatedAt, rec.ID)}
}

// buildIndexes adds the entries of IndexVersion for every record of a store that lacks them,
// in batches, and records the version. Records written meanwhile have them already (this
// runs in Open, before any write).
func (s *Store) buildIndexes() error {
	v, err := s.getMeta(metaIndex)
	switch {
	case err == nil && string(v) == IndexVersion:
		s.indexed = true
		return nil
	case err != nil && !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("markers: read index version: %w", err)
	case s.opts.ReadOnly:
		return nil // List by actor scans the time index
	}
	n := 0
	b := s.db.NewBatch()
	for kv, err := range s.storedRecords() {
		if err != nil {
			b.Close()
			return err
		}
		rec, err := DecodeRecord(kv.Value)
		if err != nil {
			b.Close()
			return err
		}
		for _, k := range IndexEntriesOf(rec) {
			if err := b.Set(k, nil, nil); err != nil {
				b.Close()
				return err
			}
		}
		n++
		if b.Len() >= 4<<20 {
			if err := b.Commit(pebble.Sync); err != nil {
				b.Close()
				return fmt.Errorf("markers: build indexes: %w", err)
			}
			b.Close()
			b = s.db.NewBatch()
		}
	}
	defer b.Close()
	if err := b.Set(metaIndex, []byte(IndexVersion), nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("markers: build indexes: %w", err)
	}
	if n > 0 {
		s.log.Info("built the actor and run indexes of an older store", "records", n)
	}
	s.indexed = true
	return nil
}

// storedRecords yields every stored record (encoded).
func (s *Store) storedRecords() iter.Seq2[KV, error] {
	return func(yield func(KV, error) bool) {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pRecord}, UpperBound: []byte{pRecord + 1}})
		if err != nil {
			yield(KV{}, err)
			return
		}
		defer it.Close()
		for ok := it.First(); ok; ok = it.Next() {
			if !yield(KV{Key: it.Key(), Value: it.Value()}, nil) {
				return
			}
		}
		if err := it.Error(); err != nil {
			yield(KV{}, err)
		}
	}
}
