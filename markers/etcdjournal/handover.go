package etcdjournal

import (
	"context"
	"encoding/json"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A replica that stops cleanly hands its executions in flight over: it revokes its lease —
// its owner keys go with it — and publishes their ids, so that the other replicas claim them
// at once, instead of when a call for one arrives or when their reconcile tick finds one
// unchanged for a lease TTL (which is all a replica that dies without closing gets).

// handoverKey is the one key every handover is a put of (as cancelKey for cancels).
func (j *Journal) handoverKey() string { return j.prefix + "Chandover" }

// publishedHandover is the value of a handover: who stopped and what it owned.
type publishedHandover struct {
	From string   `json:"from"`
	IDs  []string `json:"ids"`
}

// maxHandoverIDs bounds the ids of one put (about 40 bytes each: well under etcd's request
// size); more are published in several.
const maxHandoverIDs = 10000

// Name is this replica's name.
func (j *Journal) Name() string { return j.name }

// handOver revokes lease — this replica's, once nothing drives its executions here — and
// publishes the executions it owned. Errors are logged: the executions are then taken over
// once the lease expires, as after a crash.
func (j *Journal) handOver(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), j.opTO)
	defer cancel()
	var ids []string
	ttl, err := j.cli.TimeToLive(ctx, lease, clientv3.WithAttachedKeys())
	if err != nil {
		j.log.Warn("list this replica's executions before handing them over; they are taken over once its lease expires", "err", err)
	} else {
		owner := j.ownerKey("")
		for _, k := range ttl.Keys {
			if id, ok := strings.CutPrefix(string(k), owner); ok {
				ids = append(ids, id)
			}
		}
	}
	if _, err := j.cli.Revoke(ctx, lease); err != nil {
		j.log.Warn("revoke replica lease; its executions are taken over once it expires", "err", err)
		return
	}
	for len(ids) > 0 {
		n := min(len(ids), maxHandoverIDs)
		v, _ := json.Marshal(publishedHandover{From: j.name, IDs: ids[:n]})
		if _, err := j.kv.Put(ctx, j.handoverKey(), string(v)); err != nil {
			j.log.Warn("publish the handover; the executions are taken over when a call or a reconcile tick finds them", "err", err)
			return
		}
		j.log.Info("handed executions over", "count", n)
		ids = ids[n:]
	}
}

// WatchHandovers watches the handovers of other replicas, from the current revision on, until
// ctx ends.
func (j *Journal) WatchHandovers(ctx context.Context, handedOver func(from string, ids []string)) {
	j.watchPuts(ctx, j.handoverKey(), func(v []byte) {
		var h publishedHandover
		if json.Unmarshal(v, &h) == nil && h.From != j.name {
			handedOver(h.From, h.IDs)
		}
	})
}
