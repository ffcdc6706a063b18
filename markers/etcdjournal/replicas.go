package etcdjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/postern-dev/postern/internal/ctxtime"
	"github.com/postern-dev/postern/markers"
)

// currentSession returns this replica's live session (its lease, kept alive by the client),
// starting a new one if the last expired (etcd was unreachable longer than the TTL: every
// execution it owned may have been taken over since).
func (j *Journal) currentSession() (*concurrency.Session, error) {
	j.smu.Lock()
	defer j.smu.Unlock()
	if j.session != nil {
		select {
		case <-j.session.Done():
			j.log.Warn("replica lease expired; starting a new one", "lease", fmt.Sprintf("%x", j.session.Lease()))
			j.session = nil
		default:
			return j.session, nil
		}
	}
	// The grant is bounded (no quorum: fail now); the keep-alive lasts until Close.
	ctx, cancel := j.opCtx()
	grant, err := j.cli.Grant(ctx, int64(j.ttl/time.Second))
	cancel()
	if err != nil {
		return nil, j.wrap("start replica lease", err)
	}
	s, err := concurrency.NewSession(j.cli, concurrency.WithLease(grant.ID), concurrency.WithContext(j.ctx))
	if err != nil {
		return nil, j.wrap("start replica lease", err)
	}
	j.session = s
	return s, nil
}

func (j *Journal) lease() (clientv3.LeaseID, error) {
	s, err := j.currentSession()
	if err != nil {
		return 0, err
	}
	return s.Lease(), nil
}

// Claim makes this replica the owner of id if it has none; it reports whether this replica
// owns it now.
func (j *Journal) Claim(ctx context.Context, id string) (bool, error) {
	lease, err := j.lease()
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	ok := j.ownerKey(id)
	resp, err := j.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(ok), "=", 0)).
		Then(clientv3.OpPut(ok, j.name, clientv3.WithLease(lease))).Else(clientv3.OpGet(ok)).Commit()
	if err != nil {
		return false, j.wrap("claim "+id, err)
	}
	if resp.Succeeded {
		return true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	return len(kvs) == 1 && clientv3.LeaseID(kvs[0].Lease) == lease, nil
}

// Release deletes id's owner key if it is this replica's.
func (j *Journal) Release(id string) {
	lease, err := j.lease()
	if err != nil {
		return
	}
	ctx, cancel := j.opCtx()
	defer cancel()
	ok := j.ownerKey(id)
	if _, err := j.kv.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(ok), "=", lease)).Then(clientv3.OpDelete(ok)).Commit(); err != nil && j.ctx.Err() == nil {
		j.log.Warn("release execution", "execution_id", id, "err", err)
	}
}

// Follow watches id's record and owner key: update gets every new version of the record;
// it returns false once the record is terminal, true once the owner key is gone.
func (j *Journal) Follow(ctx context.Context, id string, update func(*markers.Record)) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rk, ok := j.key(markers.RecordKey(id)), j.ownerKey(id)
	rctx, rcancel := j.opCtx()
	resp, err := j.kv.Txn(rctx).Then(clientv3.OpGet(rk), clientv3.OpGet(ok)).Commit()
	rcancel()
	if err != nil {
		return false, j.wrap("follow "+id, err)
	}
	recs := resp.Responses[0].GetResponseRange().Kvs
	if len(recs) == 0 {
		return false, fmt.Errorf("%w: %s", markers.ErrNotFound, id)
	}
	if done, err := j.followed(recs[0], update); done || err != nil {
		return false, err
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
		return true, nil
	}
	// Both keys, from the revision read on: nothing in between is missed.
	wc := j.cli.Watch(clientv3.WithRequireLeader(ctx), rk, clientv3.WithRev(resp.Header.Revision+1))
	oc := j.cli.Watch(clientv3.WithRequireLeader(ctx), ok, clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case w, open := <-wc:
			if !open || w.Err() != nil {
				return false, j.wrap("watch "+id, errors.Join(w.Err(), ctx.Err(), errWatchEnded))
			}
			for _, ev := range w.Events {
				if ev.Type != mvccpb.PUT {
					continue
				}
				if done, err := j.followed(ev.Kv, update); done || err != nil {
					return false, err
				}
			}
		case w, open := <-oc:
			if !open || w.Err() != nil {
				return false, j.wrap("watch owner of "+id, errors.Join(w.Err(), ctx.Err(), errWatchEnded))
			}
			for _, ev := range w.Events {
				if ev.Type == mvccpb.DELETE {
					// The write that ends an execution deletes its owner key too, and the
					// record's watch may not have told yet: gone only if it did not end.
					return j.ownerGone(id, update)
				}
			}
		}
	}
}

var errWatchEnded = errors.New("watch ended")

// ownerGone reads id's record after its owner key went: true if the execution is still
// driven (its owner died or gave it up), false if it ended (update hears of it).
func (j *Journal) ownerGone(id string, update func(*markers.Record)) (bool, error) {
	ctx, cancel := j.opCtx()
	defer cancel()
	resp, err := j.kv.Get(ctx, j.key(markers.RecordKey(id)))
	if err != nil {
		return false, j.wrap("follow "+id, err)
	}
	if len(resp.Kvs) == 0 {
		return false, fmt.Errorf("%w: %s", markers.ErrNotFound, id)
	}
	ended, err := j.followed(resp.Kvs[0], update)
	return !ended, err
}

func (j *Journal) followed(kv *mvccpb.KeyValue, update func(*markers.Record)) (terminal bool, _ error) {
	rec, err := markers.DecodeRecord(kv.Value)
	if err != nil {
		return false, err
	}
	update(rec)
	return markers.JournalGraph.Terminal(rec.State) || !driven(rec.State), nil
}

// cancelKey is the one key every published cancel is a put of: a cancel is an event (the
// watch delivers each revision), not a state, so one key serves them all and etcd's
// compaction clears their history.
func (j *Journal) cancelKey() string { return j.prefix + "Ccancels" }

// maxCancelKey bounds a published cancel's key (the request's actor, scope and JSON-RPC id).
const maxCancelKey = 4096

// PublishCancel puts a cancel of request key for the other replicas to watch.
func (j *Journal) PublishCancel(ctx context.Context, key []byte) error {
	if err := j.writable(ctx); err != nil {
		return err
	}
	if len(key) > maxCancelKey {
		return fmt.Errorf("etcdjournal: cancel key of %d bytes, more than %d", len(key), maxCancelKey)
	}
	v, err := json.Marshal(publishedCancel{From: j.name, Key: key})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	if _, err := j.kv.Put(ctx, j.cancelKey(), string(v)); err != nil {
		return j.wrap("publish cancel", err)
	}
	return nil
}

type publishedCancel struct {
	From string `json:"from"` // the replica that received it (it applied it itself)
	Key  []byte `json:"key"`
}

// WatchCancels watches the cancels other replicas publish, from the current revision on,
// until ctx ends.
func (j *Journal) WatchCancels(ctx context.Context, cancelled func(key []byte)) {
	j.watchPuts(ctx, j.cancelKey(), func(v []byte) {
		var c publishedCancel
		if json.Unmarshal(v, &c) == nil && c.From != j.name {
			cancelled(c.Key)
		}
	})
}

// watchPuts calls put with the value of every put of key from the current revision on, until
// ctx ends: the replicas' published events (cancels, handovers), one key each. A watch that
// fails (no leader, a member down) is resumed after the last revision it delivered, so no
// event in between is missed — unless etcd compacted it away meanwhile, which is logged.
func (j *Journal) watchPuts(ctx context.Context, key string, put func(value []byte)) {
	j.watchKVs(ctx, key, func(kv *mvccpb.KeyValue) { put(kv.Value) })
}

// watchKVs is watchPuts with each put's key-value (its mod_revision with its value).
func (j *Journal) watchKVs(ctx context.Context, key string, put func(kv *mvccpb.KeyValue)) {
	var next int64 // 0: from now
	for ctx.Err() == nil {
		err := j.watchFrom(ctx, key, &next, put)
		if ctx.Err() != nil {
			break
		}
		j.log.Warn("watch ended; resuming", "key", key, "err", err)
		if errors.Is(err, rpctypes.ErrCompacted) {
			next = 0
		}
		if !ctxtime.Sleep(ctx, time.Second) {
			break
		}
	}
}

func (j *Journal) watchFrom(ctx context.Context, key string, next *int64, put func(kv *mvccpb.KeyValue)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var opts []clientv3.OpOption
	if *next > 0 {
		opts = append(opts, clientv3.WithRev(*next))
	}
	wc := j.cli.Watch(clientv3.WithRequireLeader(ctx), key, opts...)
	for w := range wc {
		if err := w.Err(); err != nil {
			return err
		}
		for _, ev := range w.Events {
			*next = ev.Kv.ModRevision + 1
			if ev.Type == mvccpb.PUT {
				put(ev.Kv)
			}
		}
	}
	return errWatchEnded
}

// Leading reports whether this replica won the election for the reconcile loop.
func (j *Journal) Leading() bool { return j.leading.Load() }

// LeaseTTL is the TTL of this replica's lease.
func (j *Journal) LeaseTTL() time.Duration { return j.ttl }

// campaign runs for leadership of the reconcile loop, and again whenever this replica's
// session ends, until Close.
func (j *Journal) campaign() {
	for j.ctx.Err() == nil {
		s, err := j.currentSession()
		if err != nil {
			if !ctxtime.Sleep(j.ctx, time.Second) {
				return
			}
			continue
		}
		e := concurrency.NewElection(s, j.prefix+"Eleader")
		if err := e.Campaign(j.ctx, j.name); err != nil {
			if !ctxtime.Sleep(j.ctx, time.Second) {
				return
			}
			continue
		}
		j.leading.Store(true)
		j.log.Info("elected to run the reconcile loop", "replica", j.name)
		select {
		case <-j.ctx.Done():
		case <-s.Done():
		}
		j.leading.Store(false)
	}
}

// Elected names the replica that holds the election (the one running the reconcile loop
// and the retention pass), "" when none does: no replica serves the journal. It works on a
// journal opened read-only.
func (j *Journal) Elected(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	resp, err := j.kv.Get(ctx, j.prefix+"Eleader/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return "", j.wrap("election", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// sharedKeysKey holds the digest of the keys the replicas share (AgreeKeys).
func (j *Journal) sharedKeysKey() string { return j.prefix + "Mkeys" }

// AgreeKeys records digest as the replicas' shared keys if none is, else compares it.
func (j *Journal) AgreeKeys(ctx context.Context, digest string) error {
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	k := j.sharedKeysKey()
	resp, err := j.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, digest)).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return j.wrap("agree on the shared keys", err)
	}
	if resp.Succeeded {
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && string(kvs[0].Value) != digest {
		return fmt.Errorf("%w (%s holds keys %s, this replica's are %s)", markers.ErrSharedKeys, j.prefix, kvs[0].Value, digest)
	}
	return nil
}
