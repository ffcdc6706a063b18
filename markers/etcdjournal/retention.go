package etcdjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/markers"
)

// A retention pass on etcd (see markers.Store.GC for what it removes): the bastion runs it on
// the elected replica. It seals the chain first. Each record's removal is one nested transaction guarded by the
// record's mod_revision and by those of the pointer entries it changes, so a concurrent
// write of another replica makes it skip that record (the next pass sees it again); several
// share a transaction within MaxTxnOps operations and MaxTxnBytes bytes in all. The chain's
// prefix is pruned by moving the base first, then deleting the events before it in bounded
// ranges (an export skips what an interrupted pass left). Then the revision history is
// compacted up to where it was CompactionLag ago (readers at a fixed revision keep theirs),
// so the space is free for etcd to reuse; returning it to the file system is a
// defragmentation, which the operator runs (docs/replicas.md).

// gcPage is how many records a pass reads per request.
const gcPage = 256

// maxRangeDelete bounds the events one range delete of the chain's prefix removes.
const maxRangeDelete = 1000

// GC is a retention pass (see markers.Store.GC); on a replica, one at a time.
func (j *Journal) GC(ctx context.Context, o markers.GCOptions) (markers.GCResult, error) {
	res := markers.GCResult{DryRun: o.DryRun}
	if err := j.readable(); err != nil {
		return res, err
	}
	if j.opts.ReadOnly && !o.DryRun {
		return res, markers.ErrReadOnly
	}
	j.gcMu.Lock()
	defer j.gcMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(j.ctx, cancel)
	defer stop()

	before, err := j.Backend(ctx)
	if err != nil {
		return res, err
	}
	res.BytesBefore = before.InUseBytes
	if !o.DryRun {
		// Sealed first, so the prefix it prunes can reach the head.
		if err := j.commitQueued(&request{seal: true, refresh: true}); err != nil {
			return res, fmt.Errorf("etcdjournal: seal before retention: %w", err)
		}
	}
	now := j.now()
	if err := j.removeRecords(ctx, now, o.DryRun, &res); err != nil {
		return res, err
	}
	if err := j.expireTombstones(ctx, now, o.DryRun, &res); err != nil {
		return res, err
	}
	if err := j.removeRuns(ctx, now, o.DryRun, &res); err != nil {
		return res, err
	}
	if err := j.pruneChain(ctx, now, o.DryRun, &res); err != nil {
		return res, err
	}
	if !o.DryRun {
		rev, err := j.revision(ctx)
		if err != nil {
			return res, err
		}
		if target := j.compactTarget(rev, o.Exclusive); target > 0 {
			if err := j.compact(ctx, target); err != nil {
				return res, err
			}
			res.Compacted = true
		}
	}
	after, err := j.Backend(ctx)
	if err != nil {
		return res, err
	}
	res.BytesAfter = after.InUseBytes
	return res, nil
}

// revision is the store's current revision.
func (j *Journal) revision(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	resp, err := j.kv.Get(ctx, j.key(markers.HeadKey()), clientv3.WithKeysOnly())
	if err != nil {
		return 0, j.wrap("gc", err)
	}
	return resp.Header.Revision, nil
}

// revisionAt is the store's revision at a moment.
type revisionAt struct {
	at  time.Time
	rev int64
}

// compactTarget notes rev, the store's revision now, and returns the revision to compact
// up to: the newest noted at least compactLag ago (0: none yet), so that a reader at a
// revision of the last compactLag — an export, a copy — keeps it; or rev itself when the
// pass has the journal to itself. The caller holds gcMu.
func (j *Journal) compactTarget(rev int64, exclusive bool) int64 {
	if exclusive {
		j.revisions = nil
		return rev
	}
	now := time.Now()
	var target int64
	keep := j.revisions[:0]
	for _, r := range j.revisions {
		if now.Sub(r.at) >= j.compactLag {
			target = r.rev // the newest of those old enough; older ones are done with
			continue
		}
		keep = append(keep, r)
	}
	j.revisions = append(keep, revisionAt{now, rev})
	return target
}

// compact compacts the revision history up to rev, waiting until the members applied it,
// so that what earlier passes deleted (and every superseded version) is free for etcd to
// reuse. Watches are not disturbed: the keys a pass deletes are of ended executions, which
// no replica follows, and a replica's watch of cancels that falls behind resumes from now
// (WatchCancels). A revision compacted already (etcd's auto-compaction) is no error.
func (j *Journal) compact(ctx context.Context, rev int64) error {
	ctx, cancel := context.WithTimeout(ctx, 4*j.opTO)
	defer cancel()
	_, err := j.kv.Compact(ctx, rev, clientv3.WithCompactPhysical())
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return j.wrap("compact the revision history", err)
	}
	return nil
}

// rangeOf reads up to limit keys of [from, end), in key order.
func (j *Journal) rangeOf(ctx context.Context, from, end string, limit int, keysOnly bool) (*clientv3.GetResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(limit))}
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	resp, err := j.kv.Get(ctx, from, opts...)
	if err != nil {
		return nil, j.wrap("gc", err)
	}
	return resp, nil
}

// readRanges runs read ops in transactions of at most MaxTxnOps and returns each op's
// answer, in order.
func (j *Journal) readRanges(ctx context.Context, ops []clientv3.Op) ([]*etcdserverpb.RangeResponse, error) {
	out := make([]*etcdserverpb.RangeResponse, 0, len(ops))
	for len(ops) > 0 {
		n := min(len(ops), MaxTxnOps)
		tctx, cancel := context.WithTimeout(ctx, j.opTO)
		resp, err := j.kv.Txn(tctx).Then(ops[:n]...).Commit()
		cancel()
		if err != nil {
			return nil, j.wrap("gc", err)
		}
		for _, r := range resp.Responses {
			out = append(out, r.GetResponseRange())
		}
		ops = ops[n:]
	}
	return out, nil
}

// readOps is readRanges' key values of each op.
func (j *Journal) readOps(ctx context.Context, ops []clientv3.Op) ([][]*mvccpb.KeyValue, error) {
	ranges, err := j.readRanges(ctx, ops)
	if err != nil {
		return nil, err
	}
	out := make([][]*mvccpb.KeyValue, len(ranges))
	for i, r := range ranges {
		out[i] = r.Kvs
	}
	return out, nil
}

// guarded is one record's (or entry's) part of a pass: its compares and ops, applied as a
// nested transaction.
type guarded struct {
	cmps []clientv3.Cmp
	ops  []clientv3.Op
	size int
}

func (g guarded) cost() int { return 1 + len(g.cmps) + len(g.ops) }

// commitGuarded commits parts in transactions of nested ones within etcd's limits, and
// reports which succeeded (their compares held).
func (j *Journal) commitGuarded(ctx context.Context, parts []guarded) ([]bool, error) {
	done := make([]bool, 0, len(parts))
	for len(parts) > 0 {
		ops, size, n := 0, 0, 0
		for n < len(parts) && (n == 0 || (ops+parts[n].cost() <= MaxTxnOps && size+parts[n].size <= MaxTxnBytes)) {
			ops, size = ops+parts[n].cost(), size+parts[n].size
			n++
		}
		txn := make([]clientv3.Op, n)
		for i, p := range parts[:n] {
			txn[i] = clientv3.OpTxn(p.cmps, p.ops, nil)
		}
		tctx, cancel := context.WithTimeout(ctx, j.opTO)
		resp, err := j.kv.Txn(tctx).Then(txn...).Commit()
		cancel()
		if err != nil {
			return done, j.wrap("gc", err)
		}
		for _, r := range resp.Responses {
			done = append(done, r.GetResponseTxn().Succeeded)
		}
		parts = parts[n:]
	}
	return done, nil
}

func count(ok []bool) int {
	n := 0
	for _, b := range ok {
		if b {
			n++
		}
	}
	return n
}

// removeRecords removes the removable records created before now - MinRetention, oldest
// first.
func (j *Journal) removeRecords(ctx context.Context, now time.Time, dryRun bool, res *markers.GCResult) error {
	from, end := j.key(markers.TimeFamily.Start), j.key(markers.TimeFamily.End)
	if j.opts.MinRetention > 0 {
		end = j.key(markers.TimeBound(now.Add(-j.opts.MinRetention)))
	}
	for {
		page, err := j.rangeOf(ctx, from, end, gcPage, true)
		if err != nil {
			return err
		}
		if err := j.removePage(ctx, page.Kvs, now, dryRun, res); err != nil {
			return err
		}
		if !page.More || len(page.Kvs) == 0 {
			return nil
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

// removePage removes the removable records among a page of time index keys.
func (j *Journal) removePage(ctx context.Context, timeKeys []*mvccpb.KeyValue, now time.Time, dryRun bool, res *markers.GCResult) error {
	reads := make([]clientv3.Op, 0, len(timeKeys))
	for _, kv := range timeKeys {
		reads = append(reads, clientv3.OpGet(j.key(markers.RecordKey(markers.TimeKeyID(kv.Key[len(j.prefix):])))))
	}
	recs, err := j.readOps(ctx, reads)
	if err != nil {
		return err
	}
	type victim struct {
		rec *markers.Record
		rev int64
	}
	var victims []victim
	for _, kvs := range recs {
		if len(kvs) == 0 {
			continue
		}
		rec, err := markers.DecodeRecord(kvs[0].Value)
		if err != nil {
			return err
		}
		if !markers.JournalGraph.Terminal(rec.State) {
			continue
		}
		if !j.opts.IsRemovable(rec, now) {
			res.Kept++
			continue
		}
		victims = append(victims, victim{rec, kvs[0].ModRevision})
	}
	if len(victims) == 0 {
		return nil
	}
	if dryRun {
		res.Records += len(victims)
		return nil
	}
	// The pointer entries each may still hold.
	plans := make([]markers.Removal, len(victims))
	reads = reads[:0]
	for i, v := range victims {
		plans[i] = markers.PlanRemoval(v.rec, now, j.opts.KeepTombstone(v.rec.Class))
		for _, pc := range plans[i].Pointers {
			reads = append(reads, clientv3.OpGet(j.key(pc.Key)))
		}
	}
	ptrs, err := j.readOps(ctx, reads)
	if err != nil {
		return err
	}
	parts := make([]guarded, 0, len(victims))
	tombstones := make([]int, 0, len(victims))
	for i, v := range victims {
		rm := plans[i]
		g := guarded{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(j.key(markers.RecordKey(rm.ID))), "=", v.rev)}}
		for _, k := range rm.Deletes {
			g.ops = append(g.ops, clientv3.OpDelete(j.key(k)))
			g.size += len(k)
		}
		for _, f := range rm.Ranges {
			g.ops = append(g.ops, clientv3.OpDelete(j.key(f.Start), clientv3.WithRange(j.key(f.End))))
			g.size += len(f.Start) + len(f.End)
		}
		g.ops = append(g.ops, clientv3.OpDelete(j.ownerKey(rm.ID)))
		n := 0
		for _, pc := range rm.Pointers {
			kvs := ptrs[0]
			ptrs = ptrs[1:]
			if len(kvs) == 0 || string(kvs[0].Value) != rm.ID {
				continue // a newer execution took this entry over
			}
			pk := j.key(pc.Key)
			g.cmps = append(g.cmps, clientv3.Compare(clientv3.ModRevision(pk), "=", kvs[0].ModRevision))
			if pc.Tombstone == nil {
				g.ops = append(g.ops, clientv3.OpDelete(pk))
				continue
			}
			g.ops = append(g.ops, clientv3.OpPut(pk, string(pc.Tombstone)), clientv3.OpPut(j.key(pc.ExpiryKey), rm.ID))
			g.size += len(pc.Tombstone) + len(pc.ExpiryKey)
			n++
		}
		parts = append(parts, g)
		tombstones = append(tombstones, n)
	}
	// Removals whose compares fail (another replica wrote the record, or took a pointer
	// entry over, since it was read) are left for the next pass; which ones is not needed.
	done, err := j.commitGuarded(ctx, parts)
	for _, v := range victims {
		j.forgetWritten(v.rec.ID)
	}
	if err != nil {
		return err
	}
	for i, ok := range done {
		if ok {
			res.Records++
			res.Tombstones += tombstones[i]
		}
	}
	return nil
}

// expireTombstones drops the tombstones whose time has come: each pointer entry still holding
// one is deleted (guarded by its mod_revision), and its expiry entry.
func (j *Journal) expireTombstones(ctx context.Context, now time.Time, dryRun bool, res *markers.GCResult) error {
	from, end := j.key(markers.TombstoneFamily.Start), j.key(markers.TombstoneExpired(now))
	for {
		page, err := j.rangeOf(ctx, from, end, gcPage, false)
		if err != nil || len(page.Kvs) == 0 {
			return err
		}
		if !dryRun {
			reads := make([]clientv3.Op, len(page.Kvs))
			for i, kv := range page.Kvs {
				reads[i] = clientv3.OpGet(j.key(markers.TombstonePointer(kv.Key[len(j.prefix):])))
			}
			ptrs, err := j.readOps(ctx, reads)
			if err != nil {
				return err
			}
			parts := make([]guarded, 0, len(page.Kvs))
			for i, kv := range page.Kvs {
				g := guarded{ops: []clientv3.Op{clientv3.OpDelete(string(kv.Key))}, size: len(kv.Key)}
				if p := ptrs[i]; len(p) == 1 && markers.TombstoneOf(p[0].Value, string(kv.Value)) {
					g.cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(p[0].Key)), "=", p[0].ModRevision)}
					g.ops = append(g.ops, clientv3.OpDelete(string(p[0].Key)))
				}
				parts = append(parts, g)
			}
			if _, err := j.commitGuarded(ctx, parts); err != nil {
				return err
			}
		}
		res.TombstonesExpired += len(page.Kvs)
		if !page.More {
			return nil
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

// removeRuns removes the agent runs first seen before now - RunRetention with no execution
// of their own left: each is a transaction that compares the run's index range as empty, so
// a replica creating an execution of the run meanwhile keeps it.
func (j *Journal) removeRuns(ctx context.Context, now time.Time, dryRun bool, res *markers.GCResult) error {
	if j.opts.RunRetention <= 0 {
		return nil
	}
	from, end := j.key(markers.RunTimeFamily.Start), j.key(markers.RunTimeBound(now.Add(-j.opts.RunRetention)))
	for {
		page, err := j.rangeOf(ctx, from, end, gcPage, false)
		if err != nil || len(page.Kvs) == 0 {
			return err
		}
		parts := make([]guarded, 0, len(page.Kvs))
		reads := make([]clientv3.Op, 0, len(page.Kvs))
		for _, kv := range page.Kvs {
			actor, scope, err := markers.ParseRunKey(kv.Value)
			if err != nil {
				return err
			}
			f := markers.RunExecFamily(actor, scope)
			rk := j.key(kv.Value)
			reads = append(reads, clientv3.OpGet(j.key(f.Start), clientv3.WithRange(j.key(f.End)), clientv3.WithCountOnly()))
			parts = append(parts, guarded{
				cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(j.key(f.Start)), "=", 0).WithRange(j.key(f.End))},
				ops:  []clientv3.Op{clientv3.OpDelete(rk), clientv3.OpDelete(string(kv.Key))},
				size: len(rk) + len(kv.Key),
			})
		}
		if dryRun {
			counts, err := j.readCounts(ctx, reads)
			if err != nil {
				return err
			}
			for _, c := range counts {
				if c == 0 {
					res.Runs++
				}
			}
		} else {
			done, err := j.commitGuarded(ctx, parts)
			if err != nil {
				return err
			}
			res.Runs += count(done)
		}
		if !page.More {
			return nil
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

// readCounts is readRanges' count of each (count-only) op.
func (j *Journal) readCounts(ctx context.Context, ops []clientv3.Op) ([]int64, error) {
	ranges, err := j.readRanges(ctx, ops)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(ranges))
	for i, r := range ranges {
		out[i] = r.Count
	}
	return out, nil
}

// pruneChain prunes the chain's prefix up to the cut (markers.CutPoint): it scans the
// prefix for the records still held (markers.ScanPrefix), carries forward those before the
// event horizon (carry), then moves the base to the cut — compared on the base's
// mod_revision, so two passes do not both move it — and deletes the checkpoints before it
// and the events up to it in bounded ranges.
func (j *Journal) pruneChain(ctx context.Context, now time.Time, dryRun bool, res *markers.GCResult) error {
	bk := j.key(markers.BaseKey())
	kvs, err := j.readOps(ctx, []clientv3.Op{clientv3.OpGet(bk)})
	if err != nil {
		return err
	}
	var base markers.ChainPos
	var baseRev int64
	if b := kvs[0]; len(b) == 1 {
		if err := json.Unmarshal(b[0].Value, &base); err != nil {
			return fmt.Errorf("%w: base: %v", markers.ErrCorrupt, err)
		}
		baseRev = b[0].ModRevision
	}
	res.BaseSeq = base.Seq
	var cps []markers.LogEntry
	for e, err := range j.scan(markers.Family{Start: markers.CheckpointKey(base.Seq + 1), End: markers.CheckpointFamily.End}, 0) {
		if err != nil {
			return err
		}
		cps = append(cps, e)
	}
	var horizon time.Time
	if j.opts.EventRetention > 0 {
		horizon = now.Add(-j.opts.EventRetention)
	}
	horizonSeq, err := markers.SealedBefore(cps, horizon)
	if err != nil {
		return err
	}
	if len(cps) == 0 {
		return j.deleteBefore(ctx, base.Seq)
	}
	events := j.scan(markers.Family{Start: markers.EventKey(base.Seq + 1), End: markers.EventKey(cps[len(cps)-1].Seq + 1)}, 0)
	limit, held, err := markers.ScanPrefix(ctx, events, horizonSeq, j.held(ctx))
	if err != nil {
		return err
	}
	cut, ok, err := markers.CutPoint(cps, limit, horizon)
	if err != nil {
		return err
	}
	if ok {
		res.Events, res.BaseSeq, res.Carried = cut.Seq-base.Seq, cut.Seq, len(held)
	}
	if dryRun {
		return nil
	}
	if ok {
		for _, id := range held {
			if err := j.carry(ctx, id, cut.Seq, now); err != nil {
				return err
			}
		}
		pos, _ := json.Marshal(cut)
		tctx, cancel := context.WithTimeout(ctx, j.opTO)
		resp, err := j.kv.Txn(tctx).If(clientv3.Compare(clientv3.ModRevision(bk), "=", baseRev)).
			Then(clientv3.OpPut(bk, string(pos))).Commit()
		cancel()
		if err != nil {
			return j.wrap("gc: move the chain's base", err)
		}
		if !resp.Succeeded {
			res.Events, res.BaseSeq = 0, base.Seq // another pass moved it first
			return nil
		}
		base = cut
	}
	// Delete what lies before the base (this pass's cut, or an interrupted pass's).
	return j.deleteBefore(ctx, base.Seq)
}

// held reports which records are still held (keys only, in transactions of reads).
func (j *Journal) held(ctx context.Context) markers.HeldFunc {
	return func(ids []string) (map[string]bool, error) {
		ops := make([]clientv3.Op, len(ids))
		for i, id := range ids {
			ops[i] = clientv3.OpGet(j.key(markers.RecordKey(id)), clientv3.WithKeysOnly())
		}
		kvs, err := j.readOps(ctx, ops)
		if err != nil {
			return nil, err
		}
		held := make(map[string]bool, len(ids))
		for i, id := range ids {
			held[id] = len(kvs[i]) == 1
		}
		return held, nil
	}
}

// carry carries forward record id's events up to through (markers.PlanCarries), each
// carried event compared on the record's mod_revision so that it holds the record as it
// stands; a record another replica changed meanwhile is read again.
func (j *Journal) carry(ctx context.Context, id string, through uint64, now time.Time) error {
	rk := j.key(markers.RecordKey(id))
	f := markers.ExecEventFamily(id)
	for attempt := 0; ; attempt++ {
		kvs, err := j.readOps(ctx, []clientv3.Op{clientv3.OpGet(rk),
			clientv3.OpGet(j.key(f.Start), clientv3.WithRange(j.key(markers.ExecEventFamily(id).Start)+seqSuffix(through+1)), clientv3.WithKeysOnly())})
		if err != nil {
			return err
		}
		if len(kvs[0]) == 0 {
			return nil // removed since the scan
		}
		rec, err := markers.DecodeRecord(kvs[0][0].Value)
		if err != nil {
			return err
		}
		rev := kvs[0][0].ModRevision
		keys := make([]string, 0, len(kvs[1]))
		seqs := make([]uint64, 0, len(kvs[1]))
		for _, kv := range kvs[1] {
			seq, err := markers.ExecEventSeq(kv.Key[len(j.prefix):])
			if err != nil {
				return err
			}
			keys, seqs = append(keys, j.key(markers.EventKey(seq))), append(seqs, seq)
		}
		lines, err := j.getMany(keys)
		if err != nil {
			return err
		}
		var entries []markers.LogEntry
		for i, l := range lines {
			if l != nil {
				entries = append(entries, markers.LogEntry{Seq: seqs[i], Value: l})
			}
		}
		writes, err := markers.PlanCarries(rec, entries, now)
		if err != nil {
			return err
		}
		stale := false
		for _, w := range writes {
			err := j.commitQueued(&request{w: w, conds: []cond{{key: rk, rev: rev}}})
			if errors.Is(err, errStale) && attempt < 5 {
				stale = true
				break
			}
			if err != nil {
				return fmt.Errorf("etcdjournal: carry %s forward: %w", id, err)
			}
		}
		if !stale {
			return nil
		}
	}
}

// seqSuffix is the 8-byte big-endian suffix of an event index key for seq.
func seqSuffix(seq uint64) string { return string(markers.EventKey(seq)[1:]) }

// deleteBefore deletes the checkpoints before seq and the events up to it, in ranges of at
// most maxRangeDelete events, several per transaction.
func (j *Journal) deleteBefore(ctx context.Context, seq uint64) error {
	if seq == 0 {
		return nil
	}
	ops := []clientv3.Op{clientv3.OpDelete(j.key(markers.CheckpointFamily.Start), clientv3.WithRange(j.key(markers.CheckpointKey(seq))))}
	oldest, err := j.rangeOf(ctx, j.key(markers.EventFamily.Start), j.key(markers.EventKey(seq+1)), 1, true)
	if err != nil {
		return err
	}
	if len(oldest.Kvs) == 1 {
		for lo := seqOfKey(oldest.Kvs[0].Key); lo <= seq; lo += maxRangeDelete {
			hi := min(lo+maxRangeDelete, seq+1)
			ops = append(ops, clientv3.OpDelete(j.key(markers.EventKey(lo)), clientv3.WithRange(j.key(markers.EventKey(hi)))))
		}
	}
	return j.deleteRange(ctx, ops)
}

// deleteRange commits range deletes a few per transaction (each may delete up to
// maxRangeDelete keys: a transaction stays a bounded amount of work for the members).
func (j *Journal) deleteRange(ctx context.Context, ops []clientv3.Op) error {
	for chunk := range slices.Chunk(ops, 8) {
		tctx, cancel := context.WithTimeout(ctx, j.opTO)
		_, err := j.kv.Txn(tctx).Then(chunk...).Commit()
		cancel()
		if err != nil {
			return j.wrap("gc: delete the chain's pruned prefix", err)
		}
	}
	return nil
}

// Backend is the cluster's size and alarms: each member's database size (the file the quota
// counts) and its size in use (the rest is free space only a defragmentation returns), the
// configured quota, and the active alarms.
func (j *Journal) Backend(ctx context.Context) (markers.BackendStatus, error) {
	st := markers.BackendStatus{Backend: "etcd", QuotaBytes: j.quota}
	if err := j.readable(); err != nil {
		return st, err
	}
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	answered := 0
	for _, ep := range j.cli.Endpoints() {
		ms := markers.MemberStatus{Endpoint: ep}
		s, err := j.cli.Status(ctx, ep)
		if err != nil {
			ms.Error = err.Error()
		} else {
			answered++
			ms.Bytes, ms.InUseBytes = s.DbSize, s.DbSizeInUse
			st.Bytes, st.InUseBytes = max(st.Bytes, s.DbSize), max(st.InUseBytes, s.DbSizeInUse)
		}
		st.Members = append(st.Members, ms)
	}
	if answered == 0 {
		return st, j.wrap("status", errors.New("no member answered"))
	}
	alarms, err := j.cli.AlarmList(ctx)
	if err != nil {
		return st, j.wrap("alarms", err)
	}
	for _, a := range alarms.Alarms {
		if name := a.Alarm.String(); !slices.Contains(st.Alarms, name) {
			st.Alarms = append(st.Alarms, name)
		}
	}
	kvs, err := j.readOps(ctx, []clientv3.Op{clientv3.OpGet(j.key(markers.BaseKey())), clientv3.OpGet(j.key(markers.HeadKey()))})
	if err != nil {
		return st, err
	}
	for i, p := range []*uint64{&st.BaseSeq, &st.HeadSeq} {
		if len(kvs[i]) == 1 {
			var pos markers.ChainPos
			if err := json.Unmarshal(kvs[i][0].Value, &pos); err != nil {
				return st, fmt.Errorf("%w: %v", markers.ErrCorrupt, err)
			}
			*p = pos.Seq
		}
	}
	return st, nil
}
