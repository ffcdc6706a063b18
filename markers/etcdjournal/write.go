package etcdjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/internal/groupcommit"
)

// errStale: a compare of the request failed (another replica wrote the record or an index
// entry first); its writer reads again.
var errStale = errors.New("etcdjournal: stale read")

// request is one write waiting for the group commit.
type request struct {
	groupcommit.Waiter
	w *markers.Write // nil for a checkpoint-only request
	// conds are the mod_revisions the write was planned on (0: absent).
	conds []cond
	// owner: put the owner key with this replica's lease (lease != 0) or delete it.
	owner ownerOp
	seal  bool
	// refresh reads the chain head before committing (a seal of what other replicas wrote).
	refresh bool
}

type cond struct {
	key string
	rev int64
}

type ownerOp struct {
	put, del bool
	lease    clientv3.LeaseID
}

// commitQueued commits req through the group-commit queue (a lone writer commits on its own
// goroutine) and returns its answer.
func (j *Journal) commitQueued(req *request) error {
	if j.opts.ReadOnly {
		return markers.ErrReadOnly
	}
	return j.writes.Commit(req)
}

// cost estimates a request's operations and bytes in a transaction.
func (r *request) cost() (ops, size int) {
	if r.w == nil {
		return 0, 0
	}
	puts, dels := r.w.Mutations()
	ops = 2*r.w.Events() + 1 + len(puts) + len(dels) + len(r.w.DeleteRanges()) + len(r.conds) + 3 // first event, run, owner
	for _, kv := range puts {
		size += len(kv.Key) + len(kv.Value)
	}
	return ops, size + r.w.Events()*(2*len(r.w.Record().ID)+4096) + r.w.CarriedBytes()
}

// commitGroup commits group in one transaction guarded by the head, retrying with a fresh
// head while the head was moved by another replica. A request whose own compares fail is
// answered errStale; an etcd error answers every request with it.
func (j *Journal) commitGroup(group []*request) {
	if j.closed.Load() {
		for _, r := range group {
			r.Answer(markers.ErrClosed)
		}
		return
	}
	for _, r := range group {
		if r.refresh {
			j.headRev = -1
		}
	}
	for len(group) > 0 {
		if j.headRev < 0 {
			ctx, cancel := j.opCtx()
			err := j.readHead(ctx)
			cancel()
			if err != nil {
				j.failAll(group, err)
				return
			}
		}
		j.awaitTurn(group)
		group = append(group, j.writes.More(group)...)
		retry, err := j.tryCommit(group)
		if err != nil {
			j.headRev = -1 // the outcome is unknown: read the head again next time
			j.failAll(group, j.wrap("commit", err))
			return
		}
		if len(retry) == 0 {
			return
		}
		// Another replica appended first: try again on the new head at this replica's next
		// turn, with the writes queued meanwhile.
		j.lostAt = time.Now()
		group = retry
	}
}

// fitOneTxn says how many of pending (a prefix) fit one transaction with group.
func fitOneTxn(group, pending []*request) int {
	ops, size := 3, 0 // the head, a checkpoint, the turn
	for _, r := range group {
		o, b := r.cost()
		ops, size = ops+o, size+b
	}
	n := 0
	for n < len(pending) {
		o, b := pending[n].cost()
		if ops+o > MaxTxnOps || size+b > MaxTxnBytes {
			break
		}
		ops, size, n = ops+o, size+b, n+1
	}
	return n
}

func (j *Journal) failAll(group []*request, err error) {
	for _, r := range group {
		r.Answer(err)
	}
}

// tryCommit makes one attempt; it returns the requests to try again (the head moved).
func (j *Journal) tryCommit(group []*request) ([]*request, error) {
	headKey := j.key(markers.HeadKey())
	headRevSent := j.headRev
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(headKey), "=", headRevSent)}
	var ops []clientv3.Op
	elseOps := []clientv3.Op{clientv3.OpGet(headKey)}
	head := j.head
	staged := uint64(0)
	forceSeal := false
	var committed []*request
	putKeys := map[string]bool{}
	for _, r := range group {
		committed = append(committed, r)
		if r.seal {
			forceSeal = true
			continue
		}
		events, next, err := r.w.Chain(head)
		if err != nil {
			committed = committed[:len(committed)-1]
			r.Answer(err)
			continue
		}
		for _, c := range r.conds {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.key), "=", c.rev))
			elseOps = append(elseOps, clientv3.OpGet(c.key, clientv3.WithKeysOnly()))
		}
		id := r.w.Record().ID
		for _, kv := range r.w.ChainKeys(events) {
			ops = append(ops, clientv3.OpPut(j.key(kv.Key), string(kv.Value)))
		}
		puts, dels := r.w.Mutations()
		for _, k := range dels {
			ops = append(ops, clientv3.OpDelete(j.key(k)))
		}
		for _, f := range r.w.DeleteRanges() {
			ops = append(ops, clientv3.OpDelete(j.key(f.Start), clientv3.WithRange(j.key(f.End))))
		}
		for _, kv := range puts {
			k := j.key(kv.Key)
			putKeys[k] = true
			ops = append(ops, clientv3.OpPut(k, string(kv.Value)))
		}
		if run := r.w.NewRun(); run != nil {
			rk := j.key(markers.RunKey(run.Actor, run.Scope))
			if !putKeys[rk] { // two writes of one group name the same new run: the first records it
				putKeys[rk] = true
				v, _ := json.Marshal(run)
				ops = append(ops, clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rk), "=", 0)},
					[]clientv3.Op{clientv3.OpPut(rk, string(v)), clientv3.OpPut(j.key(markers.RunTimeKey(run)), string(markers.RunKey(run.Actor, run.Scope)))},
					nil))
			}
		}
		switch ok := j.ownerKey(id); {
		case r.owner.put:
			ops = append(ops, clientv3.OpPut(ok, j.name, clientv3.WithLease(r.owner.lease)))
		case r.owner.del:
			ops = append(ops, clientv3.OpDelete(ok))
		}
		head = next
		staged += uint64(r.w.Events())
	}
	sealing := head.Seq > j.sealedSeq && (forceSeal || head.Seq-j.sealedSeq >= uint64(j.opts.CheckpointEvery))
	if sealing {
		signed, err := markers.SignCheckpoint(&j.opts, head, j.opts.Now())
		if err != nil {
			j.failAll(committed, fmt.Errorf("etcdjournal: sign checkpoint %d: %w", head.Seq, err))
			return nil, nil
		}
		ops = append(ops, clientv3.OpPut(j.key(markers.CheckpointKey(head.Seq)), string(signed)))
	}
	if staged == 0 && !sealing {
		j.failAll(committed, nil)
		return nil, nil
	}
	pos, _ := json.Marshal(head)
	turn, _ := json.Marshal(turnValue{Writer: j.name, Head: head})
	ops = append(ops, clientv3.OpPut(headKey, string(pos)), clientv3.OpPut(j.turnKey(), string(turn)))
	ctx, cancel := j.opCtx()
	sent := time.Now()
	resp, err := j.kv.Txn(ctx).If(cmps...).Then(ops...).Else(elseOps...).Commit()
	cancel()
	j.txns.Add(1)
	if err != nil {
		return nil, err
	}
	if resp.Succeeded {
		j.head, j.headRev = head, resp.Header.Revision
		j.headSeq.Store(head.Seq)
		if sealing {
			j.sealedSeq = head.Seq
		}
		j.commits.Add(1)
		j.events.Add(staged)
		j.committedTurn(resp.Header.Revision, time.Since(sent))
		for _, r := range committed {
			if r.w != nil && r.w.Prev() != r.w.Record() { // not a joined event: the record was put
				j.wrote(r.w.Record(), resp.Header.Revision)
			}
		}
		j.failAll(committed, nil)
		return nil, nil
	}
	// Which compares failed: the head's (someone else appended: try again after it), or a
	// request's own (answer it errStale).
	if err := j.setHead(resp.Responses[0].GetResponseRange().Kvs); err != nil {
		return nil, err
	}
	if j.headRev != headRevSent {
		j.lostHead.Add(1)
	}
	var retry []*request
	i := 1
	for _, r := range committed {
		fresh := true
		for _, c := range r.conds {
			if modRev(resp.Responses[i].GetResponseRange().Kvs) != c.rev {
				fresh = false
			}
			i++
		}
		switch {
		case !fresh:
			r.Answer(errStale)
		default:
			retry = append(retry, r)
		}
	}
	return retry, nil
}

func modRev(kvs []*mvccpb.KeyValue) int64 {
	if len(kvs) == 0 {
		return 0
	}
	return kvs[0].ModRevision
}

// sealPeriodically seals the chain every CheckpointInterval while there are unsealed events.
func (j *Journal) sealPeriodically() {
	t := time.NewTicker(j.opts.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-j.ctx.Done():
			return
		case <-t.C:
			if err := j.commitQueued(&request{seal: true}); err != nil && !errors.Is(err, markers.ErrClosed) {
				j.log.Error("periodic checkpoint failed", "err", err)
			}
		}
	}
}

// writable refuses writes once closed or read-only.
func (j *Journal) writable(ctx context.Context) error {
	switch {
	case j.closed.Load():
		return markers.ErrClosed
	case j.opts.ReadOnly:
		return markers.ErrReadOnly
	}
	return ctx.Err()
}

// Create stores r as a new execution (see markers.Store.Create).
func (j *Journal) Create(ctx context.Context, r *markers.Record) (*markers.Record, error) {
	return j.create(ctx, r, nil, "", nil)
}

// CreateFor is Create with the call that asked for it on its create event.
func (j *Journal) CreateFor(ctx context.Context, r *markers.Record, call *markers.Call) (*markers.Record, error) {
	return j.create(ctx, r, nil, "", call)
}

// CreateAdvancedFor is CreateFor followed by path, in one transaction.
func (j *Journal) CreateAdvancedFor(ctx context.Context, r *markers.Record, path []markers.State, note string, call *markers.Call) (*markers.Record, error) {
	if len(path) == 0 {
		return nil, fmt.Errorf("%w: empty path", markers.ErrIllegalTransition)
	}
	return j.create(ctx, r, path, note, call)
}

// create is create-if-absent on the id and compare-and-set on the index entries the record
// takes over: each must be as this journal last looked it up (the bastion matched the call
// on what it saw), or another replica accepted an execution of the same intent meanwhile
// (ErrRaced). The entry a call is matched on (its idempotency key, else its fingerprint) is
// compared as absent if this journal never looked it up.
func (j *Journal) create(ctx context.Context, r *markers.Record, path []markers.State, note string, call *markers.Call) (*markers.Record, error) {
	if err := j.writable(ctx); err != nil {
		return nil, err
	}
	w, err := markers.JournalGraph.PlanCreate(r, path, note, call, j.now())
	if err != nil {
		return nil, err
	}
	rec := w.Record()
	unlock := j.locks.Lock(rec.ID)
	defer unlock()
	req := &request{w: w, conds: []cond{{key: j.key(markers.RecordKey(rec.ID)), rev: 0}}}
	matched := matchKey(rec)
	for _, k := range markers.PointerKeys(rec) {
		rev, ok := j.seenRev(string(k))
		if !ok && string(k) == string(matched) {
			// The entry the call is matched on is always compared: one this journal did not
			// look up (or no longer remembers) must be absent, as the caller acted as if it
			// were — a create overwriting another replica's entry unseen would accept a
			// second execution of one intent. (An operation key is the host's to enforce.)
			ok = true
		}
		if ok {
			req.conds = append(req.conds, cond{key: j.key(k), rev: rev})
		}
	}
	if driven(rec.State) {
		lease, err := j.lease()
		if err != nil {
			return nil, err
		}
		req.owner = ownerOp{put: true, lease: lease}
	}
	err = j.commitQueued(req)
	if errors.Is(err, errStale) {
		if existing, gerr := j.Get(rec.ID); gerr == nil {
			return existing, fmt.Errorf("%w: %s is %s", markers.ErrExists, rec.ID, existing.State)
		}
		return nil, markers.ErrRaced
	}
	if err != nil {
		return nil, err
	}
	j.forget(markers.PointerKeys(rec))
	return rec.Clone(), nil
}

// matchKey is the index entry a call of r is matched on (see the bastion's matchCall): its
// idempotency key, else its intent's fingerprint; nil for neither.
func matchKey(r *markers.Record) []byte {
	switch {
	case r.IdempotencyKey != "":
		return markers.IdempotencyKeyKey(markers.KeySpace(r), r.IdempotencyKey)
	case r.Fingerprint != "":
		return markers.FingerprintKey(r.Actor, r.IntentScope, r.Fingerprint)
	}
	return nil
}

// driven: states an execution has a driver in (it has an owner while in them).
func driven(s markers.State) bool {
	switch s {
	case markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running, markers.Unknown:
		return true
	}
	return false
}

// Transition moves id from → to (see markers.Store.Transition).
func (j *Journal) Transition(ctx context.Context, id string, from, to markers.State, note string, mutate func(*markers.Record) error) (*markers.Record, error) {
	return j.Advance(ctx, id, from, []markers.State{to}, note, mutate)
}

// TransitionWith is Transition; every etcd write is durable on a quorum, so d changes nothing.
func (j *Journal) TransitionWith(ctx context.Context, id string, from, to markers.State, note string, _ markers.Durability, mutate func(*markers.Record) error) (*markers.Record, error) {
	return j.Advance(ctx, id, from, []markers.State{to}, note, mutate)
}

// Advance moves id along path in one transaction (see markers.Store.Advance).
func (j *Journal) Advance(ctx context.Context, id string, from markers.State, path []markers.State, note string, mutate func(*markers.Record) error) (*markers.Record, error) {
	if err := markers.JournalGraph.CheckPath(from, path); err != nil {
		return nil, err
	}
	return j.change(ctx, id, markers.KindTransition, from, path, note, nil, nil, mutate)
}

// AdvanceWithResult is Advance storing result in the same transaction.
func (j *Journal) AdvanceWithResult(ctx context.Context, id string, from markers.State, path []markers.State, note string, result []byte, mutate func(*markers.Record) error) (*markers.Record, error) {
	if len(result) > markers.MaxResultBytes {
		return nil, fmt.Errorf("etcdjournal: result of %s is %d bytes, more than %d", id, len(result), markers.MaxResultBytes)
	}
	if result == nil {
		result = []byte{}
	}
	if err := markers.JournalGraph.CheckPath(from, path); err != nil {
		return nil, err
	}
	return j.change(ctx, id, markers.KindTransition, from, path, note, result, nil, mutate)
}

// Update applies mutate to id without changing its state.
func (j *Journal) Update(ctx context.Context, id, note string, mutate func(*markers.Record) error) (*markers.Record, error) {
	return j.change(ctx, id, markers.KindUpdate, "", nil, note, nil, nil, mutate)
}

// UpdateFor is Update for a tool call.
func (j *Journal) UpdateFor(ctx context.Context, id, note string, call *markers.Call, _ markers.Durability, mutate func(*markers.Record) error) (*markers.Record, error) {
	return j.change(ctx, id, markers.KindUpdate, "", nil, note, nil, call, mutate)
}

// RevokeDelivery clears id's result delivery time (see markers.Store.RevokeDelivery).
func (j *Journal) RevokeDelivery(ctx context.Context, id, note string) (*markers.Record, bool, error) {
	rec, err := j.change(ctx, id, markers.KindDeliveryRevoked, "", nil, note, nil, nil, func(r *markers.Record) error {
		if r.ResultDeliveredAt == nil {
			return markers.ErrUnchanged
		}
		r.ResultDeliveredAt = nil
		return nil
	})
	if errors.Is(err, markers.ErrUnchanged) {
		return rec, false, nil
	}
	return rec, err == nil, err
}

// change is a compare-and-set on the record's mod_revision; a lost race reads the record
// again and plans the change anew (so the conflict and idempotence rules apply to the
// record another replica left).
func (j *Journal) change(ctx context.Context, id string, kind markers.EventKind, from markers.State, path []markers.State, note string, result []byte, call *markers.Call, mutate func(*markers.Record) error) (*markers.Record, error) {
	if err := j.writable(ctx); err != nil {
		return nil, err
	}
	unlock := j.locks.Lock(id)
	defer unlock()
	dispatch := false
	for _, s := range path {
		dispatch = dispatch || s == markers.Dispatched
	}
	for {
		// Optimistic: a record this replica wrote last is planned on as written (the
		// compare on its mod_revision catches any later write, and the change is planned
		// again on a fresh read). A dispatch reads the owner key too, so it always reads.
		cur, rev, ok := j.lastWritten(id)
		var owner *mvccpb.KeyValue
		if !ok || dispatch {
			var err error
			if cur, rev, owner, err = j.getOwned(id); err != nil {
				return nil, err
			}
		}
		w, answer, err := markers.PlanChange(cur, kind, from, path, note, result, call, j.now(), mutate)
		if w == nil && ok && !dispatch {
			// An answer without a write (a conflict, an idempotent repeat) is only given on
			// a fresh read: the record as written may have changed since.
			j.forgetWritten(id)
			continue
		}
		if w == nil {
			return answer, err
		}
		req := &request{w: w, conds: []cond{{key: j.key(markers.RecordKey(id)), rev: rev}}}
		if err := j.ownerChange(req, cur, w.Record(), path, owner); err != nil {
			return nil, err
		}
		err = j.commitQueued(req)
		if errors.Is(err, errStale) {
			j.forgetWritten(id)
			continue
		}
		if err != nil {
			j.forgetWritten(id)
			return nil, err
		}
		return w.Record().Clone(), nil
	}
}

// writtenRecord is a record as this replica committed it, at its mod_revision.
type writtenRecord struct {
	rec *markers.Record // not to be changed: plans clone it
	rev int64
}

// maxWritten bounds the written records kept; past it one is dropped (and read again when
// changed).
const maxWritten = 4096

func (j *Journal) wrote(rec *markers.Record, rev int64) {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	if len(j.written) >= maxWritten {
		for k := range j.written {
			delete(j.written, k)
			break
		}
	}
	j.written[rec.ID] = writtenRecord{rec, rev}
}

func (j *Journal) lastWritten(id string) (*markers.Record, int64, bool) {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	w, ok := j.written[id]
	return w.rec, w.rev, ok
}

func (j *Journal) forgetWritten(id string) {
	j.wmu.Lock()
	defer j.wmu.Unlock()
	delete(j.written, id)
}

// ownerChange adds the owner key's part to a change: a dispatch takes the execution (it must
// have no owner or be this replica's, as read), an end gives it up.
func (j *Journal) ownerChange(req *request, cur, next *markers.Record, path []markers.State, owner *mvccpb.KeyValue) error {
	if cur.State == next.State {
		return nil
	}
	dispatch := false
	for _, s := range path {
		dispatch = dispatch || s == markers.Dispatched
	}
	switch {
	case dispatch:
		lease, err := j.lease()
		if err != nil {
			return err
		}
		if owner != nil && clientv3.LeaseID(owner.Lease) != lease {
			return fmt.Errorf("%w: %s is driven by %s", markers.ErrNotOwner, cur.ID, owner.Value)
		}
		req.conds = append(req.conds, cond{key: j.ownerKey(cur.ID), rev: modRev(kvs(owner))})
		req.owner = ownerOp{put: true, lease: lease}
	case !driven(next.State):
		req.owner = ownerOp{del: true}
	}
	return nil
}

func kvs(kv *mvccpb.KeyValue) []*mvccpb.KeyValue {
	if kv == nil {
		return nil
	}
	return []*mvccpb.KeyValue{kv}
}

// Joined journals a call that touched id without changing it.
func (j *Journal) Joined(ctx context.Context, id string, call *markers.Call) error {
	if err := j.writable(ctx); err != nil {
		return err
	}
	unlock := j.locks.Lock(id)
	defer unlock()
	cur, _, _, err := j.getOwned(id)
	if err != nil {
		return err
	}
	w, err := markers.PlanJoined(cur, nil, call, j.now())
	if err != nil {
		return err
	}
	return j.commitQueued(&request{w: w})
}

// seenRev is the mod_revision pointer key k had when this journal last looked it up.
func (j *Journal) seenRev(k string) (int64, bool) {
	j.seenMu.Lock()
	defer j.seenMu.Unlock()
	e, ok := j.seen[k]
	return e.rev, ok
}

func (j *Journal) saw(k string, rev int64) {
	j.seenMu.Lock()
	defer j.seenMu.Unlock()
	if len(j.seen) >= maxSeen {
		cut := time.Now().Add(-seenTTL)
		for k, e := range j.seen {
			if e.at.Before(cut) {
				delete(j.seen, k)
			}
		}
		if len(j.seen) >= maxSeen { // all recent: drop any (its create is then compared as absent: ErrRaced, matched again)
			for k := range j.seen {
				delete(j.seen, k)
				break
			}
		}
	}
	j.seen[k] = seenEntry{rev: rev, at: time.Now()}
}

func (j *Journal) forget(keys [][]byte) {
	j.seenMu.Lock()
	defer j.seenMu.Unlock()
	for _, k := range keys {
		delete(j.seen, string(k))
	}
}
