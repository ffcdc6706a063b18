package markers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// GCResult says what a GC pass removed.
type GCResult struct {
	Records int    // terminal records past their class's retention
	Events  uint64 // events pruned below the new base
	BaseSeq uint64 // the chain now starts after this event (0: from genesis)
}

// GC removes terminal records whose class retention has passed since they last changed, and,
// with Options.EventRetention set, prunes events up to the newest checkpoint older than that.
// A record that is not terminal is never removed. Pruned events leave a base (seq, hash)
// attested by the checkpoint at the cut, so the remaining chain still verifies.
func (s *Store) GC(ctx context.Context) (GCResult, error) {
	var res GCResult
	if err := s.readable(); err != nil {
		return res, err
	}
	now := s.now()
	for _, state := range s.opts.Graph.States() {
		if !s.opts.Graph.Terminal(state) {
			continue
		}
		prefix := append(joinKey(pState, string(state)), 0)
		ids, err := s.scanIDs(prefix)
		if err != nil {
			return res, err
		}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			removed, err := s.removeIfExpired(id, now)
			if err != nil {
				return res, err
			}
			if removed {
				res.Records++
			}
		}
	}
	if s.opts.EventRetention > 0 {
		pruned, base, err := s.pruneEvents(now.Add(-s.opts.EventRetention))
		if err != nil {
			return res, err
		}
		res.Events, res.BaseSeq = pruned, base
	}
	return res, nil
}

func (s *Store) scanIDs(prefix []byte) ([]string, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, fmt.Errorf("markers: gc scan: %w", err)
	}
	var ids []string
	for ok := it.First(); ok; ok = it.Next() {
		ids = append(ids, string(it.Key()[len(prefix):]))
	}
	return ids, errors.Join(it.Error(), it.Close())
}

// removeIfExpired deletes a terminal record, its index entries and its event index under the
// record's lock, if its retention has passed.
func (s *Store) removeIfExpired(id string, now time.Time) (bool, error) {
	unlock := s.locks.Lock(id)
	defer unlock()
	rec, err := s.getLocked(id)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !s.opts.Graph.Terminal(rec.State) || now.Sub(rec.UpdatedAt) < s.opts.retention(rec.Class) {
		return false, nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	err = errors.Join(b.Delete(recordKey(id), nil), b.Delete(resultKey(id), nil))
	for _, e := range indexEntries(rec) {
		if e.value != nil && !s.pointsTo(e.key, id) {
			continue // a newer execution took this key over
		}
		err = errors.Join(err, b.Delete(e.key, nil))
	}
	// Keyed executions written before they left the fingerprint index out may still have an
	// entry there.
	if rec.IdempotencyKey != "" && rec.Fingerprint != "" {
		if k := fingerprintKey(rec.Actor, rec.IntentScope, rec.Fingerprint); s.pointsTo(k, id) {
			err = errors.Join(err, b.Delete(k, nil))
		}
	}
	prefix := append(joinKey(pExecEvents, id), 0)
	err = errors.Join(err, b.DeleteRange(prefix, prefixEnd(prefix), nil))
	if err == nil {
		err = b.Commit(pebble.Sync)
	}
	s.records.drop(id)
	if err != nil {
		return false, fmt.Errorf("markers: gc %s: %w", id, err)
	}
	return true, nil
}

func (s *Store) pointsTo(key []byte, id string) bool {
	v, closer, err := s.db.Get(key)
	if err != nil {
		return false
	}
	defer closer.Close()
	return string(v) == id
}

// pruneEvents deletes the events up to the newest checkpoint signed before cutoff and makes
// that checkpoint the base of the chain.
func (s *Store) pruneEvents(cutoff time.Time) (uint64, uint64, error) {
	base, err := readChainPos(s.db, metaBase)
	if err != nil {
		return 0, 0, err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: seqKey(pCheckpoint, base.Seq+1), UpperBound: []byte{pCheckpoint + 1}})
	if err != nil {
		return 0, 0, fmt.Errorf("markers: prune: %w", err)
	}
	var cut sealedCheckpoint
	for ok := it.First(); ok; ok = it.Next() {
		cp, err := parseOwnCheckpoint(it.Value())
		if err != nil {
			it.Close()
			return 0, 0, err
		}
		if !cp.At.Before(cutoff) {
			break
		}
		cut = cp
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, 0, fmt.Errorf("markers: prune: %w", err)
	}
	if cut.Seq <= base.Seq {
		return 0, base.Seq, nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	err = b.DeleteRange(seqKey(pEvent, base.Seq+1), seqKey(pEvent, cut.Seq+1), nil)
	// Keep the checkpoint at the cut: it attests the new base.
	err = errors.Join(err, b.DeleteRange(seqKey(pCheckpoint, 0), seqKey(pCheckpoint, cut.Seq), nil))
	pos, _ := json.Marshal(ChainPos{Seq: cut.Seq, Hash: cut.Head})
	err = errors.Join(err, b.Set(metaBase, pos, nil))
	if err == nil {
		err = b.Commit(pebble.Sync)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("markers: prune events through %d: %w", cut.Seq, err)
	}
	return cut.Seq - base.Seq, cut.Seq, nil
}
