package markers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// gcChunk is how many records a pass looks at, and removes, per batch: it holds their locks
// (and the index lock) only that long.
const gcChunk = 256

// GC is a retention pass (retention.go): it removes the terminal records Options.Removable
// gives up, with their results, index entries and event index, turning the pointer entries
// that still name them into tombstones (Options.TombstoneRetention); drops expired
// tombstones and agent runs with no execution left (Options.RunRetention); prunes the chain's
// prefix up to the newest checkpoint that only removed records (or the event horizon) still
// need, which becomes the chain's base; and compacts what it deleted. A record that is not
// terminal is never removed. Each batch is one synced write; a pass interrupted (ctx, a
// crash) leaves a consistent store, and the next pass goes on.
func (s *Store) GC(ctx context.Context, o GCOptions) (GCResult, error) {
	res := GCResult{DryRun: o.DryRun}
	if s.opts.ReadOnly && !o.DryRun {
		return res, ErrReadOnly
	}
	// Close waits for the pass, which stops at its next step once Close began.
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return res, ErrClosed
	}
	s.passes.Add(1)
	s.mu.RUnlock()
	defer s.passes.Done()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go func() {
		select {
		case <-s.stop:
			stop(ErrClosed)
		case <-ctx.Done():
		}
	}()
	res.BytesBefore = s.diskUsage()
	if !o.DryRun {
		// Sealed first, so the prefix it prunes can reach the head.
		if err := s.submit(&commitReq{seal: true}); err != nil {
			return res, fmt.Errorf("markers: seal before retention: %w", err)
		}
	}
	now := s.now()
	spans := &touched{}
	err := s.removeRecords(ctx, now, o.DryRun, &res, spans)
	if err == nil {
		err = s.expireTombstones(ctx, now, o.DryRun, &res, spans)
	}
	if err == nil {
		err = s.removeRuns(ctx, now, o.DryRun, &res)
	}
	if err == nil {
		err = s.pruneChain(ctx, now, o.DryRun, &res, spans)
	}
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
			err = cause
		}
		return res, err
	}
	if !o.DryRun && res.Removed() {
		if err := spans.compact(ctx, s.db); err != nil {
			return res, fmt.Errorf("markers: compact after retention: %w", err)
		}
		res.Compacted = true
		s.awaitObsoleteDeleted(ctx)
	}
	res.BytesAfter = s.diskUsage()
	return res, nil
}

// diskUsage is the store's size on disk: tables and write-ahead log.
func (s *Store) diskUsage() int64 { return int64(s.db.Metrics().DiskSpaceUsage()) }

// awaitObsoleteDeleted waits (a few seconds at most) until Pebble deleted the tables a
// compaction replaced, which it does in the background once no reader holds them (until
// then they are zombies, then obsolete): the space is free only then.
func (s *Store) awaitObsoleteDeleted(ctx context.Context) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if t := s.db.Metrics().Table.Local; t.ObsoleteSize == 0 && t.ZombieSize == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// removeRecords removes the removable records among those created before now -
// MinRetention, oldest first, gcChunk at a time.
func (s *Store) removeRecords(ctx context.Context, now time.Time, dryRun bool, res *GCResult, spans *touched) error {
	upper := []byte{pTime + 1}
	if s.opts.MinRetention > 0 {
		upper = timePrefix(now.Add(-s.opts.MinRetention))
	}
	lower := []byte{pTime}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		ids, next, err := s.scanKeys(lower, upper, gcChunk, func(k []byte) string { return TimeKeyID(k) })
		if err != nil {
			return err
		}
		if err := s.removeChunk(ids, now, dryRun, res, spans); err != nil {
			return err
		}
		if next == nil {
			return nil
		}
		lower = next
	}
}

// scanKeys returns what name makes of up to n keys in [lower, upper), and the lower bound
// of the next scan (nil at the end).
func (s *Store) scanKeys(lower, upper []byte, n int, name func([]byte) string) ([]string, []byte, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, nil, fmt.Errorf("markers: gc scan: %w", err)
	}
	var out []string
	var next []byte
	for ok := it.First(); ok; ok = it.Next() {
		if len(out) == n {
			next = append([]byte(nil), it.Key()...)
			break
		}
		out = append(out, name(it.Key()))
	}
	return out, next, errors.Join(it.Error(), it.Close())
}

// removeChunk removes the removable records of ids in one synced batch, under their locks
// and the index lock (so that no create takes over one of their pointer entries, nor an
// agent run's first record goes, between the look and the write).
func (s *Store) removeChunk(ids []string, now time.Time, dryRun bool, res *GCResult, spans *touched) error {
	var victims []*Record
	for _, id := range ids {
		unlock := s.locks.Lock(id)
		defer unlock() // held until the batch is committed: no write of these records in between
		rec, err := s.getRecord(id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if !s.opts.Graph.Terminal(rec.State) {
			continue
		}
		if !s.opts.removable(rec, now) {
			res.Kept++
			continue
		}
		victims = append(victims, rec)
	}
	if len(victims) == 0 {
		return nil
	}
	if dryRun {
		res.Records += len(victims)
		return nil
	}
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	tombstones := 0
	var err error
	for _, v := range victims {
		rm := PlanRemoval(v, now, s.opts.tombstoneRetention(v.Class))
		for _, k := range rm.Deletes {
			err = errors.Join(err, b.Delete(k, nil))
			spans.add(k)
		}
		for _, f := range rm.Ranges {
			err = errors.Join(err, b.DeleteRange(f.Start, f.End, nil))
			spans.add(f.Start, f.End)
		}
		for _, pc := range rm.Pointers {
			if !s.pointsTo(pc.Key, rm.ID) {
				continue // a newer execution took this entry over
			}
			if pc.Tombstone == nil {
				err = errors.Join(err, b.Delete(pc.Key, nil))
				continue
			}
			err = errors.Join(err, b.Set(pc.Key, pc.Tombstone, nil), b.Set(pc.ExpiryKey, []byte(rm.ID), nil))
			tombstones++
		}
	}
	if err == nil {
		err = s.commitGC(b)
	}
	for _, v := range victims {
		s.records.drop(v.ID)
	}
	if err != nil {
		return fmt.Errorf("markers: gc: remove %d records: %w", len(victims), err)
	}
	res.Records += len(victims)
	res.Tombstones += tombstones
	return nil
}

// commitGC commits a pass's batch, synced, under commitMu (an export's or a copy's
// snapshot sees it whole).
func (s *Store) commitGC(b *pebble.Batch) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return b.Commit(pebble.Sync)
}

func (s *Store) pointsTo(key []byte, id string) bool {
	v, closer, err := s.db.Get(key)
	if err != nil {
		return false
	}
	defer closer.Close()
	return string(v) == id
}

// expireTombstones drops the tombstones whose time has come, gcChunk at a time: each
// pointer entry still holding one is deleted, and its expiry entry.
func (s *Store) expireTombstones(ctx context.Context, now time.Time, dryRun bool, res *GCResult, spans *touched) error {
	lower, upper := TombstoneFamily.Start, TombstoneExpired(now)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
		if err != nil {
			return fmt.Errorf("markers: gc tombstones: %w", err)
		}
		var keys []KV
		for ok := it.First(); ok && len(keys) < gcChunk; ok = it.Next() {
			keys = append(keys, KV{append([]byte(nil), it.Key()...), append([]byte(nil), it.Value()...)})
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return fmt.Errorf("markers: gc tombstones: %w", err)
		}
		if len(keys) == 0 {
			return nil
		}
		if !dryRun {
			if err := s.dropTombstones(keys, spans); err != nil {
				return err
			}
		}
		res.TombstonesExpired += len(keys)
		lower = append(keys[len(keys)-1].Key, 0)
	}
}

func (s *Store) dropTombstones(expiries []KV, spans *touched) error {
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	var err error
	for _, e := range expiries {
		ptr := TombstonePointer(e.Key)
		v, closer, gerr := s.db.Get(ptr)
		switch {
		case gerr == nil:
			if TombstoneOf(v, string(e.Value)) {
				err = errors.Join(err, b.Delete(ptr, nil))
				spans.add(ptr)
			}
			closer.Close()
		case !errors.Is(gerr, pebble.ErrNotFound):
			err = errors.Join(err, gerr)
		}
		err = errors.Join(err, b.Delete(e.Key, nil))
		spans.add(e.Key)
	}
	if err == nil {
		err = s.commitGC(b)
	}
	if err != nil {
		return fmt.Errorf("markers: gc: drop tombstones: %w", err)
	}
	return nil
}

// removeRuns removes the agent runs first seen before now - RunRetention that have no
// execution of their own left.
func (s *Store) removeRuns(ctx context.Context, now time.Time, dryRun bool, res *GCResult) error {
	if s.opts.RunRetention <= 0 || s.opts.Graph != JournalGraph {
		return nil
	}
	lower, upper := RunTimeFamily.Start, RunTimeBound(now.Add(-s.opts.RunRetention))
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
		if err != nil {
			return fmt.Errorf("markers: gc runs: %w", err)
		}
		var entries []KV
		for ok := it.First(); ok && len(entries) < gcChunk; ok = it.Next() {
			entries = append(entries, KV{append([]byte(nil), it.Key()...), append([]byte(nil), it.Value()...)})
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return fmt.Errorf("markers: gc runs: %w", err)
		}
		if len(entries) == 0 {
			return nil
		}
		n, err := s.removeIdleRuns(entries, dryRun)
		if err != nil {
			return err
		}
		res.Runs += n
		if len(entries) < gcChunk {
			return nil
		}
		lower = append(entries[len(entries)-1].Key, 0)
	}
}

// removeIdleRuns removes each run of entries (run time index entries) that has no execution
// left, under the index lock: a write that names the run records it again if it is gone.
func (s *Store) removeIdleRuns(entries []KV, dryRun bool) (int, error) {
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	n := 0
	var err error
	for _, e := range entries {
		actor, scope, perr := ParseRunKey(e.Value)
		if perr != nil {
			return n, perr
		}
		idle, ierr := s.empty(RunExecFamily(actor, scope))
		if ierr != nil {
			return n, ierr
		}
		if !idle {
			continue
		}
		n++
		err = errors.Join(err, b.Delete(e.Value, nil), b.Delete(e.Key, nil))
	}
	if dryRun || n == 0 {
		return n, err
	}
	if err == nil {
		err = s.commitGC(b)
	}
	if err != nil {
		return 0, fmt.Errorf("markers: gc: remove runs: %w", err)
	}
	return n, nil
}

func (s *Store) empty(f Family) (bool, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: f.Start, UpperBound: f.End})
	if err != nil {
		return false, err
	}
	some := it.First()
	return !some, errors.Join(it.Error(), it.Close())
}

// pruneChain prunes the chain's prefix up to the cut (CutPoint): it scans the prefix for
// the records still held — the first one's event limits a cut by removal; those before the
// event horizon are carried forward (carry) — then moves the base to the cut, keeping the
// checkpoint there, which attests it, and deletes the events and checkpoints before it.
func (s *Store) pruneChain(ctx context.Context, now time.Time, dryRun bool, res *GCResult, spans *touched) error {
	base, err := readChainPos(s.db, metaBase)
	if err != nil {
		return err
	}
	res.BaseSeq = base.Seq
	var cps []LogEntry
	for e, err := range scanSeq(s.db, Family{seqKey(pCheckpoint, base.Seq+1), CheckpointFamily.End}) {
		if err != nil {
			return err
		}
		cps = append(cps, LogEntry{Seq: e.Seq, Value: append([]byte(nil), e.Value...)})
	}
	horizon := s.eventHorizon(now)
	horizonSeq, err := sealedBefore(cps, horizon)
	if err != nil || len(cps) == 0 {
		return err
	}
	limit, held, err := scanPrefix(ctx, scanSeq(s.db, Family{seqKey(pEvent, base.Seq+1), seqKey(pEvent, cps[len(cps)-1].Seq+1)}),
		horizonSeq, s.heldCheck())
	if err != nil {
		return err
	}
	cut, ok, err := CutPoint(cps, limit, horizon)
	if err != nil || !ok {
		return err
	}
	res.Events, res.BaseSeq, res.Carried = cut.Seq-base.Seq, cut.Seq, len(held)
	if dryRun {
		return nil
	}
	for _, id := range held {
		if err := s.carry(ctx, id, cut.Seq, now); err != nil {
			return err
		}
	}
	b := s.db.NewBatch()
	defer b.Close()
	pos, _ := json.Marshal(cut)
	err = errors.Join(
		b.Set(metaBase, pos, nil),
		b.DeleteRange(seqKey(pEvent, 0), seqKey(pEvent, cut.Seq+1), nil),
		// Keep the checkpoint at the cut: it attests the new base.
		b.DeleteRange(seqKey(pCheckpoint, 0), seqKey(pCheckpoint, cut.Seq), nil),
	)
	spans.add(seqKey(pEvent, 0), seqKey(pEvent, cut.Seq), seqKey(pCheckpoint, 0))
	if err == nil {
		err = s.commitGC(b)
	}
	if err != nil {
		return fmt.Errorf("markers: prune events through %d: %w", cut.Seq, err)
	}
	return nil
}

func (s *Store) eventHorizon(now time.Time) time.Time {
	if s.opts.EventRetention <= 0 {
		return time.Time{}
	}
	return now.Add(-s.opts.EventRetention)
}

// heldCheck reports which records are still held.
func (s *Store) heldCheck() HeldFunc {
	return func(ids []string) (map[string]bool, error) {
		held := make(map[string]bool, len(ids))
		for _, id := range ids {
			_, closer, err := s.db.Get(recordKey(id))
			switch {
			case errors.Is(err, pebble.ErrNotFound):
			case err != nil:
				return nil, err
			default:
				closer.Close()
				held[id] = true
			}
		}
		return held, nil
	}
}

// carry carries forward record id's events up to through (PlanCarries), under its lock, so
// that the carried events hold the record as it stands.
func (s *Store) carry(ctx context.Context, id string, through uint64, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock := s.locks.Lock(id)
	defer unlock()
	rec, err := s.getLocked(id)
	if errors.Is(err, ErrNotFound) {
		return nil // removed since the scan
	}
	if err != nil {
		return err
	}
	f := ExecEventFamily(id)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: f.Start, UpperBound: execEventKey(id, through+1)})
	if err != nil {
		return err
	}
	var entries []LogEntry
	for ok := it.First(); ok; ok = it.Next() {
		seq, err := ExecEventSeq(it.Key())
		if err != nil {
			it.Close()
			return err
		}
		v, closer, err := s.db.Get(seqKey(pEvent, seq))
		if errors.Is(err, pebble.ErrNotFound) {
			continue
		}
		if err != nil {
			it.Close()
			return err
		}
		entries = append(entries, LogEntry{Seq: seq, Value: append([]byte(nil), v...)})
		closer.Close()
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	writes, err := PlanCarries(rec, entries, now)
	if err != nil {
		return err
	}
	for _, w := range writes {
		if err := s.submit(&commitReq{Write: w}); err != nil {
			return fmt.Errorf("markers: carry %s forward: %w", id, err)
		}
	}
	return nil
}

// touched collects, per key family (its prefix byte), the span of keys a pass deleted, so
// that it compacts those spans only: records, events and their indexes are time-ordered, so
// what a pass removes is mostly the old end of each family.
type touched struct{ lo, hi [256][]byte }

func (t *touched) add(keys ...[]byte) {
	for _, k := range keys {
		if len(k) == 0 {
			continue
		}
		f := k[0]
		if t.lo[f] == nil || bytes.Compare(k, t.lo[f]) < 0 {
			t.lo[f] = append([]byte(nil), k...)
		}
		if t.hi[f] == nil || bytes.Compare(k, t.hi[f]) > 0 {
			t.hi[f] = append([]byte(nil), k...)
		}
	}
}

// compact compacts each family's span, so that the space its deletions free is reclaimed
// now rather than when Pebble's own compactions reach it.
func (t *touched) compact(ctx context.Context, db *pebble.DB) error {
	for f := range t.lo {
		if t.lo[f] == nil {
			continue
		}
		if err := db.Compact(ctx, t.lo[f], append(t.hi[f], 0), true); err != nil {
			return err
		}
	}
	return nil
}
