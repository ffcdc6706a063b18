package etcdjournal

import (
	"errors"
	"fmt"
	"iter"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/markers"
)

// isLayoutKey: the markers key layout uses lower-case families; owner keys and the election
// (upper case) are this replica set's coordination, not journal data, and are not copied.
func isLayoutKey(k []byte) bool { return len(k) > 0 && (k[0] < 'A' || k[0] > 'Z') }

// Raw yields every journal key under the prefix (without it) and its value, in key order,
// at one revision.
func (j *Journal) Raw() iter.Seq2[markers.KV, error] {
	return func(yield func(markers.KV, error) bool) {
		from, end := j.prefix, clientv3.GetPrefixRangeEnd(j.prefix)
		var rev int64
		for {
			ctx, cancel := j.opCtx()
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(500)}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			resp, err := j.kv.Get(ctx, from, opts...)
			cancel()
			if err != nil {
				yield(markers.KV{}, j.wrap("raw", err))
				return
			}
			rev = resp.Header.Revision
			for _, kv := range resp.Kvs {
				k := kv.Key[len(j.prefix):]
				if isLayoutKey(k) && !yield(markers.KV{Key: k, Value: kv.Value}, nil) {
					return
				}
			}
			if !resp.More || len(resp.Kvs) == 0 {
				return
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
}

// Import writes kvs (another journal's Raw keys) under the prefix, which must hold no
// journal yet (no chain head), in transactions within etcd's limits. It is a raw copy (the
// checkpoints come signed), so it works on a journal opened ReadOnly; no bastion may serve
// the prefix meanwhile. It returns how many keys it wrote.
func (j *Journal) Import(kvs iter.Seq2[markers.KV, error]) (int, error) {
	if j.headRev != 0 {
		return 0, fmt.Errorf("etcdjournal: import: %s already holds a journal (its chain is at %d)", j.prefix, j.head.Seq)
	}
	n := 0
	var ops []clientv3.Op
	size := 0
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		ctx, cancel := j.opCtx()
		defer cancel()
		_, err := j.kv.Txn(ctx).Then(ops...).Commit()
		ops, size = ops[:0], 0
		return err
	}
	for kv, err := range kvs {
		if err != nil {
			return n, err
		}
		if !isLayoutKey(kv.Key) {
			return n, errors.New("etcdjournal: import: a key outside the journal layout")
		}
		if string(kv.Key) == "mgraph" && string(kv.Value) != string(markers.JournalGraph) {
			return n, fmt.Errorf("etcdjournal: import: the source holds %s records, not journal ones", kv.Value)
		}
		if len(ops) == MaxTxnOps || size+len(kv.Key)+len(kv.Value) > MaxTxnBytes {
			if err := flush(); err != nil {
				return n, j.wrap("import", err)
			}
		}
		ops = append(ops, clientv3.OpPut(j.key(kv.Key), string(kv.Value)))
		size += len(kv.Key) + len(kv.Value)
		n++
	}
	if err := flush(); err != nil {
		return n, j.wrap("import", err)
	}
	return n, nil
}
