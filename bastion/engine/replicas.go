package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/markers"
)

// Replicas: with a journal shared by several bastions (markers.Replicated, on etcd), at most
// one of them drives an execution — the owner of its owner key. The others follow it through
// the journal (a watch) and take it over when its owner is gone — at once when the owner
// stopped cleanly and handed its executions over (WatchHandovers), else once its lease
// expired — then reconcile it with its host by the same rules as Recover: a driver that
// takes over never dispatches without asking the host first. A take-over is journaled,
// naming both replicas (records.takenOver). The background reconcile loop runs on the
// elected replica; every replica follows the executions in flight, so one of them notices a
// dead owner.

// replicas is the journal's coordination of replicas, nil on a single node.
func (c *core) replicas() markers.Replicated {
	r, _ := c.journal.(markers.Replicated)
	return r
}

// drives reports whether this replica is to drive d's execution: on a single node always; with
// replicas once it owns it — at once for an execution it just dispatched (accept's write took
// the owner key), else by claiming it, following it while another replica owns it. It
// returns false when the execution ended (or stopped being driven) under another replica,
// or the bastion is closing.
func (d *driver) drives(asked func()) bool {
	r := d.replicas()
	if r == nil || d.dispatched {
		return true
	}
	for {
		ok, err := r.Claim(d.ctx, d.id)
		if err != nil {
			if d.ctx.Err() == nil {
				d.log.Error("claim execution", "execution_id", d.id, "err", err)
			}
			return false
		}
		if ok {
			// What the record is now, not what it was when the driver started.
			cur, err := d.journal.Get(d.id)
			if err != nil {
				d.journalFailed(d.log, "claim", err)
				return false
			}
			d.set(cur)
			if markers.JournalGraph.Terminal(cur.State) || cur.State == markers.AwaitingApproval {
				r.Release(d.id) // it ended (or waits for an operator) before the claim
				return false
			}
			if cur.Replica != "" && cur.Replica != d.records.replica {
				next, err := d.records.takenOver(d.ctx, cur, d.handedOver.Load())
				if err != nil {
					d.journalFailed(d.log, "take over", err)
					r.Release(d.id)
					return false
				}
				d.set(next)
			}
			return true
		}
		asked() // its owner asked
		gone, err := r.Follow(d.ctx, d.id, d.set)
		if err != nil && d.ctx.Err() == nil {
			d.log.Warn("follow execution", "execution_id", d.id, "err", err)
		}
		if !gone {
			return false
		}
		d.log.Info("the replica driving an execution is gone; taking it over", "execution_id", d.id)
	}
}

// release gives up this replica's ownership of an execution whose driver ended before it
// did (unknown, journal failed, closing), so that another replica may take it up. An ended
// execution's owner key went with the write that ended it.
func (d *driver) release() {
	r := d.replicas()
	if r == nil || markers.JournalGraph.Terminal(d.record().State) || d.ctx.Err() != nil {
		return
	}
	r.Release(d.id)
}

// watchHandovers takes over, at once, the executions other replicas hand over as they stop
// (markers.Replicated.WatchHandovers), until the engine closes: each replica starts a driver
// for each, which claims it — one replica wins, the others follow it — and reconciles it
// with its host.
func (ds *drivers) watchHandovers(r markers.Replicated) {
	r.WatchHandovers(ds.ctx, func(from string, ids []string) {
		ds.log.Info("a replica stopped and handed its executions over", "replica", from, "count", len(ids))
		for _, id := range ids {
			rec, err := ds.journal.Get(id)
			if err != nil {
				ds.log.Warn("read a handed-over execution", "execution_id", id, "err", err)
				continue
			}
			if !markers.JournalGraph.Terminal(rec.State) && rec.State != markers.AwaitingApproval {
				ds.startHandedOver(rec)
			}
		}
	})
}

// agreeKeys checks, with replicas, that this replica holds the keys its journal's replicas
// share — the fingerprint key (without it no retry on this replica matches another's
// execution) and the audit key (one chain, one verifier) — or, on the first replica to open
// the journal, records them (markers.Replicated.AgreeKeys). Only a digest leaves the replica:
// the fingerprint key's HMAC of a fixed record, and the audit verifier key.
func agreeKeys(jl markers.JournalStore, fp *intent.Fingerprinter, verifier string) error {
	r, ok := jl.(markers.Replicated)
	if !ok {
		return nil
	}
	probe, err := fp.Fingerprint(intent.ActionRecord{Tool: "postern replicas share this key"})
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(probe + "\n" + verifier))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.AgreeKeys(ctx, hex.EncodeToString(sum[:16])); err != nil {
		if errors.Is(err, markers.ErrSharedKeys) {
			return fmt.Errorf("bastion: %w: copy fingerprint.key, audit.key and audit.key.pub from a serving replica's state dir into this one's (docs/replicas.md, \"Configuration\")", err)
		}
		return fmt.Errorf("bastion: %w", err)
	}
	return nil
}
