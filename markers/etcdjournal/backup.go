package etcdjournal

import (
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/markers"
)

// What `postern journal backup`, `restore` and `recover` need of the etcd journal beyond
// reading it (Raw) and importing a copy (Import): whether a replica serves the prefix, and
// clearing a prefix a restore replaces. A backup reads the journal through the client at one
// revision (Raw): a snapshot of this prefix only — an etcd snapshot (etcdctl snapshot save)
// is the whole cluster's, other prefixes and leases included, and restores only as a new
// cluster.

// electionPrefix is where the replicas campaign for the reconcile loop (campaign): every live
// replica has a key under it, bound to its lease, whose value is its name.
func (j *Journal) electionPrefix() string { return j.prefix + "Eleader" }

// LiveReplicas names the replicas serving the prefix now: those whose lease is alive (each
// campaigns for the reconcile loop from the moment it opens the journal until it closes or
// its lease expires). This journal itself is one, unless opened ReadOnly.
func (j *Journal) LiveReplicas(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	resp, err := j.kv.Get(ctx, j.electionPrefix()+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, j.wrap("list replicas", err)
	}
	var names []string
	for _, kv := range resp.Kvs {
		names = append(names, string(kv.Value))
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Clear deletes every key under the prefix — the journal, and what dead replicas left of
// their coordination — for a restore that replaces it; it refuses while a replica serves the
// prefix. It returns how many keys it deleted.
func (j *Journal) Clear(ctx context.Context) (int64, error) {
	live, err := j.LiveReplicas(ctx)
	if err != nil {
		return 0, err
	}
	if len(live) > 0 {
		return 0, fmt.Errorf("etcdjournal: replicas %v serve %s: stop every replica first", live, j.prefix)
	}
	ctx, cancel := context.WithTimeout(ctx, j.opTO)
	defer cancel()
	resp, err := j.kv.Delete(ctx, j.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, j.wrap("clear", err)
	}
	j.head, j.headRev, j.sealedSeq = markers.ChainPos{Hash: markers.GenesisHash()}, 0, 0
	return resp.Deleted, nil
}

// Empty reports whether the prefix holds no journal (no chain head).
func (j *Journal) Empty() bool { return j.headRev == 0 }
