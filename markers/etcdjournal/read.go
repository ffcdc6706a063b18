package etcdjournal

import (
	"encoding/hex"
	"encoding/json"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/markers"
)

// Every read is linearizable (the client's default): it sees every write committed before it.

func (j *Journal) readable() error {
	if j.closed.Load() {
		return markers.ErrClosed
	}
	return nil
}

// Get returns the record of execution id, or ErrNotFound.
func (j *Journal) Get(id string) (*markers.Record, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	ctx, cancel := j.opCtx()
	defer cancel()
	resp, err := j.kv.Get(ctx, j.key(markers.RecordKey(id)))
	if err != nil {
		return nil, j.wrap("get "+id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s", markers.ErrNotFound, id)
	}
	return markers.DecodeRecord(resp.Kvs[0].Value)
}

// getOwned reads id's record, its mod_revision and its owner key (nil if none) at one revision.
func (j *Journal) getOwned(id string) (*markers.Record, int64, *mvccpb.KeyValue, error) {
	if err := j.readable(); err != nil {
		return nil, 0, nil, err
	}
	ctx, cancel := j.opCtx()
	defer cancel()
	resp, err := j.kv.Txn(ctx).Then(clientv3.OpGet(j.key(markers.RecordKey(id))), clientv3.OpGet(j.ownerKey(id))).Commit()
	if err != nil {
		return nil, 0, nil, j.wrap("get "+id, err)
	}
	recs, owner := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(recs) == 0 {
		return nil, 0, nil, fmt.Errorf("%w: %s", markers.ErrNotFound, id)
	}
	rec, err := markers.DecodeRecord(recs[0].Value)
	if err != nil {
		return nil, 0, nil, err
	}
	var o *mvccpb.KeyValue
	if len(owner) == 1 {
		o = owner[0]
	}
	return rec, recs[0].ModRevision, o, nil
}

// Result returns the result stored with id, or ErrNotFound.
func (j *Journal) Result(id string) ([]byte, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	ctx, cancel := j.opCtx()
	defer cancel()
	resp, err := j.kv.Get(ctx, j.key(markers.ResultKey(id)))
	if err != nil {
		return nil, j.wrap("result "+id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: no result for %s", markers.ErrNotFound, id)
	}
	return resp.Kvs[0].Value, nil
}

// FindByFingerprint returns the newest unkeyed execution of the intent, or ErrNotFound.
func (j *Journal) FindByFingerprint(actor, scope, fingerprint string) (*markers.Record, error) {
	return j.follow(markers.FingerprintKey(actor, scope, fingerprint))
}

// FindByIdempotencyKey returns the newest execution with key in key space space
// (markers.KeySpace), or ErrNotFound.
func (j *Journal) FindByIdempotencyKey(space, key string) (*markers.Record, error) {
	return j.follow(markers.IdempotencyKeyKey(space, key))
}

// follow reads a pointer index entry, notes its mod_revision for the create it may decide,
// and returns the record it names.
func (j *Journal) follow(k []byte) (*markers.Record, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	ctx, cancel := j.opCtx()
	resp, err := j.kv.Get(ctx, j.key(k))
	cancel()
	if err != nil {
		return nil, j.wrap("index lookup", err)
	}
	j.saw(string(k), modRev(resp.Kvs))
	if len(resp.Kvs) == 0 {
		return nil, markers.ErrNotFound
	}
	id, err := markers.LookupAnswer(resp.Kvs[0].Value)
	if err != nil {
		return nil, err
	}
	return j.Get(id)
}

// getMany reads the values of keys in transactions of at most MaxTxnOps reads; a missing key
// has a nil value.
func (j *Journal) getMany(keys []string) ([][]byte, error) {
	out := make([][]byte, 0, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), MaxTxnOps)
		ops := make([]clientv3.Op, n)
		for i, k := range keys[:n] {
			ops[i] = clientv3.OpGet(k)
		}
		ctx, cancel := j.opCtx()
		resp, err := j.kv.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, j.wrap("read", err)
		}
		for _, r := range resp.Responses {
			var v []byte
			if kvs := r.GetResponseRange().Kvs; len(kvs) == 1 {
				v = kvs[0].Value
			}
			out = append(out, v)
		}
		keys = keys[n:]
	}
	return out, nil
}

// List returns one page of records matching q (see markers.Store.List; the cursors are the
// same).
func (j *Journal) List(q markers.Query) ([]*markers.Record, string, error) {
	if err := j.readable(); err != nil {
		return nil, "", err
	}
	limit := q.PageSize()
	r, err := markers.ListBounds(q, j.indexed.Load())
	if err != nil {
		return nil, "", err
	}
	lower, upper := r.Lower, r.Upper
	var out []*markers.Record
	var lastKey []byte
	for {
		order := clientv3.SortAscend
		if q.Newest {
			order = clientv3.SortDescend
		}
		ctx, cancel := j.opCtx()
		resp, err := j.kv.Get(ctx, j.key(lower), clientv3.WithRange(j.key(upper)), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, order), clientv3.WithLimit(int64(limit+1)))
		cancel()
		if err != nil {
			return nil, "", j.wrap("list", err)
		}
		keys := make([]string, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			id := r.ID(kv.Key[len(j.prefix):])
			keys = append(keys, j.key(markers.RecordKey(id)))
		}
		vals, err := j.getMany(keys)
		if err != nil {
			return nil, "", err
		}
		for i, v := range vals {
			if len(out) == limit {
				return out, hex.EncodeToString(lastKey), nil
			}
			lastKey = resp.Kvs[i].Key[len(j.prefix):]
			if v == nil {
				continue // removed after the scan
			}
			rec, err := markers.DecodeRecord(v)
			if err != nil {
				return nil, "", err
			}
			if q.Selects(rec) {
				out = append(out, rec)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, "", nil
		}
		// Filtered records left room: continue after the last key scanned.
		last := resp.Kvs[len(resp.Kvs)-1].Key[len(j.prefix):]
		if q.Newest {
			upper = append([]byte(nil), last...)
		} else {
			lower = append(append([]byte(nil), last...), 0)
		}
	}
}

// Events returns the events of execution id in order.
func (j *Journal) Events(id string) ([]markers.Event, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	f := markers.ExecEventFamily(id)
	ctx, cancel := j.opCtx()
	resp, err := j.kv.Get(ctx, j.key(f.Start), clientv3.WithRange(j.key(f.End)), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		return nil, j.wrap("events of "+id, err)
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		seq, err := markers.ExecEventSeq(kv.Key)
		if err != nil {
			return nil, err
		}
		keys = append(keys, j.key(markers.EventKey(seq)))
	}
	vals, err := j.getMany(keys)
	if err != nil {
		return nil, err
	}
	var out []markers.Event
	for _, v := range vals {
		if v == nil {
			continue // pruned
		}
		var ev markers.Event
		if err := json.Unmarshal(v, &ev); err != nil {
			return nil, fmt.Errorf("%w: event: %v", markers.ErrCorrupt, err)
		}
		out = append(out, ev)
	}
	return markers.StoryOf(out)
}

// Run returns the record of actor's run scope, or ErrNotFound.
func (j *Journal) Run(actor, scope string) (*markers.Run, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	vals, err := j.getMany([]string{j.key(markers.RunKey(actor, scope))})
	if err != nil {
		return nil, err
	}
	if vals[0] == nil {
		return nil, fmt.Errorf("%w: no run %s of %s", markers.ErrNotFound, scope, actor)
	}
	var r markers.Run
	if err := json.Unmarshal(vals[0], &r); err != nil {
		return nil, fmt.Errorf("%w: run: %v", markers.ErrCorrupt, err)
	}
	return &r, nil
}

// Runs lists agent runs, newest first seen first.
func (j *Journal) Runs(q markers.RunQuery) ([]*markers.Run, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	limit := q.PageSize()
	f := markers.RunTimeFamily
	ctx, cancel := j.opCtx()
	resp, err := j.kv.Get(ctx, j.key(f.Start), clientv3.WithRange(j.key(f.End)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(markers.MaxPage)))
	cancel()
	if err != nil {
		return nil, j.wrap("runs", err)
	}
	var keys []string
	seen := map[string]bool{} // two writes in one transaction may both have indexed a new run
	for _, kv := range resp.Kvs {
		if !seen[string(kv.Value)] {
			seen[string(kv.Value)] = true
			keys = append(keys, j.key(kv.Value))
		}
	}
	vals, err := j.getMany(keys)
	if err != nil {
		return nil, err
	}
	var out []*markers.Run
	for _, v := range vals {
		if v == nil || len(out) == limit {
			continue
		}
		var r markers.Run
		if err := json.Unmarshal(v, &r); err != nil {
			return nil, fmt.Errorf("%w: run: %v", markers.ErrCorrupt, err)
		}
		if q.Actor == "" || r.Actor == q.Actor {
			out = append(out, &r)
		}
	}
	return out, nil
}

// SiblingIDs returns the ids of the executions of one intent, oldest first, at most limit.
func (j *Journal) SiblingIDs(actor, scope, fingerprint string, limit int) ([]string, error) {
	if err := j.readable(); err != nil {
		return nil, err
	}
	f := markers.SiblingFamily(actor, scope, fingerprint)
	ctx, cancel := j.opCtx()
	resp, err := j.kv.Get(ctx, j.key(f.Start), clientv3.WithRange(j.key(f.End)), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(int64(limit)))
	cancel()
	if err != nil {
		return nil, j.wrap("siblings", err)
	}
	ids := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		ids = append(ids, string(kv.Key[len(j.prefix)+len(f.Start):]))
	}
	return ids, nil
}
