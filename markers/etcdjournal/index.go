package etcdjournal

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/markers"
)

// buildIndexes adds the index entries of markers.IndexVersion to a journal an older release
// wrote (see markers.IndexVersion): for every record, in transactions within etcd's limits,
// then the version. Replicas opening at once each build them (the same keys: harmless);
// records written meanwhile carry theirs already. A journal opened read-only only looks:
// until the version is there, List by actor scans the time index.
func (j *Journal) buildIndexes() error {
	vk := j.key(markers.IndexVersionKey())
	vals, err := j.getMany([]string{vk})
	if err != nil {
		return err
	}
	if string(vals[0]) == markers.IndexVersion {
		j.indexed.Store(true)
		return nil
	}
	if j.opts.ReadOnly {
		return nil
	}
	n := 0
	var puts []clientv3.Op
	flush := func() error {
		for len(puts) > 0 {
			k := min(len(puts), MaxTxnOps)
			ctx, cancel := j.opCtx()
			_, err := j.kv.Txn(ctx).Then(puts[:k]...).Commit()
			cancel()
			if err != nil {
				return j.wrap("build indexes", err)
			}
			puts = puts[k:]
		}
		return nil
	}
	from, end := j.key([]byte{'r'}), j.key([]byte{'r' + 1})
	for {
		ctx, cancel := j.opCtx()
		resp, err := j.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(MaxTxnOps))
		cancel()
		if err != nil {
			return j.wrap("build indexes", err)
		}
		for _, kv := range resp.Kvs {
			rec, err := markers.DecodeRecord(kv.Value)
			if err != nil {
				return err
			}
			for _, k := range markers.IndexEntriesOf(rec) {
				puts = append(puts, clientv3.OpPut(j.key(k), ""))
			}
			n++
		}
		if err := flush(); err != nil {
			return err
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	ctx, cancel := j.opCtx()
	_, err = j.kv.Put(ctx, vk, markers.IndexVersion)
	cancel()
	if err != nil {
		return j.wrap("build indexes", err)
	}
	if n > 0 {
		j.log.Info("built the actor and run indexes of an older journal", "records", n)
	}
	j.indexed.Store(true)
	return nil
}
