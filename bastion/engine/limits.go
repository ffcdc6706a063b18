package engine

import (
	"fmt"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/markers"
)

// Limits: an actor's max_concurrent and daily_quota, for the actor as a whole and for each of
// its agent runs (run_max_concurrent, run_daily_quota; a run is an intent scope). They count
// by the configured actor (Record.PolicyActor), not the transport's caller string, which
// every local agent of one user shares.
//
//   - A new call over a limit is refused (concurrency_limit, quota_exceeded) and journals
//     nothing; a call that needs approval is not refused for concurrency, as it runs later.
//   - max_concurrent counts the executions the bastion is carrying for the actor (its live
//     drivers, queued ones included). An execution about to be dispatched that was not
//     admitted by that check — approved by an operator, or recovered after a restart —
//     waits for a slot instead: it stays authorized, queued (evidence, api.Execution.Queued),
//     and is dispatched when the executions in flight drop below the limit.
//   - daily_quota counts the executions accepted since 00:00 UTC that dispatched or may
//     still (countsTowardQuota): rejected ones, and ones cancelled or failed before dispatch,
//     do not count.

// concurrencyExceeded says which concurrency limit all (the actor's executions in flight)
// and run (its run's) reach, or "".
func concurrencyExceeded(actor policy.Actor, all, run int) string {
	switch {
	case actor.MaxConcurrent > 0 && all >= actor.MaxConcurrent:
		return fmt.Sprintf("actor %s has %d executions in flight, its limit (max_concurrent)", actor.Name, all)
	case actor.RunMaxConcurrent > 0 && run >= actor.RunMaxConcurrent:
		return fmt.Sprintf("this agent run of actor %s has %d executions in flight, its limit (run_max_concurrent)", actor.Name, run)
	}
	return ""
}

// countsTowardQuota reports whether an execution uses its actor's quota: it was dispatched,
// or it still may be (accepted to run, authorized, awaiting approval). Rejected executions
// and ones cancelled or failed before dispatch never ran, so they do not count.
func countsTowardQuota(r *markers.Record) bool {
	if r.IsFleetRun() {
		return false // its hosts' executions count, each for itself
	}
	if _, dispatched := r.StateTimes[markers.Dispatched]; dispatched {
		return true
	}
	switch r.State {
	case markers.Accepted:
		return r.Decision != string(policy.Rejected)
	case markers.Authorized, markers.AwaitingApproval:
		return true
	}
	return false
}

// awaitSlot holds an execution that is about to be dispatched until its actor (and its run)
// has a max_concurrent slot; a new call was admitted by checkLimits and finds one at once.
// While it waits it is queued: journaled as evidence, and asked() is called (there is no
// host to ask, so Recover does not wait for it). It returns false when the driver must stop:
// the bastion is closing, the execution left authorized meanwhile (cancelled), or a journal
// write failed.
func (d *driver) awaitSlot(asked func()) bool {
	rec := d.record()
	toDispatch := rec.State == markers.Authorized || (rec.State == markers.Accepted && rec.Decision == string(policy.Authorized))
	if !toDispatch || rec.PolicyActor == "" {
		return true
	}
	actor, ok := d.current().policy.Actor(rec.PolicyActor)
	if !ok || (actor.MaxConcurrent == 0 && actor.RunMaxConcurrent == 0) {
		return true
	}
	queued := false
	for {
		d.all.mu.Lock()
		all, run := d.all.inFlightLocked(actor.Name, rec.IntentScope, d, true)
		why := concurrencyExceeded(actor, all, run)
		d.queued = why != ""
		freed := d.all.slotFreed
		d.all.mu.Unlock()
		if why == "" {
			if !queued {
				return true
			}
			next, err := d.records.dequeued(d.ctx, rec.ID)
			if err != nil {
				d.journalFailed(d.log, "dequeue", err)
				return false
			}
			d.set(next)
			return true
		}
		if !queued {
			queued = true
			next, err := d.records.queued(d.ctx, rec.ID, why)
			if err != nil {
				d.journalFailed(d.log, "queue", err)
				return false
			}
			d.set(next)
			d.metrics.queued.Inc()
			asked()
		}
		select {
		case <-freed:
		case <-d.ctx.Done():
			return false
		}
		cur, err := d.journal.Get(rec.ID)
		if err != nil {
			d.journalFailed(d.log, "queue", err)
			return false
		}
		if cur.State != rec.State {
			d.set(cur)
			return false
		}
	}
}
