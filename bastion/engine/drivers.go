package engine

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/markers"
)

// drivers are the drivers of the executions this engine carries, at most one per execution,
// and what they share: the concurrency slots of each actor and the stop requests of
// execution_cancel. Drivers start on a call, a retry, an approval, Recover, or the reconcile
// loop; each removes itself when it ends.
//
// Lock order: drivers.mu before driver.mu (inFlightLocked reads each driver's record under
// it).
type drivers struct {
	*core

	mu sync.Mutex // guards m, each driver's queued, stops, slotFreed and closed
	m  map[string]*driver
	// stops are the executions execution_cancel asked to stop (requestStop).
	stops map[string]bool
	// slotFreed is closed and replaced when a concurrency slot may have freed (limits.go).
	slotFreed chan struct{}
	closed    bool
}

func newDrivers(c *core) *drivers {
	return &drivers{core: c, m: map[string]*driver{}, stops: map[string]bool{}, slotFreed: make(chan struct{})}
}

// start returns the driver of rec's execution, starting one if there is none. It returns nil
// once the engine is closing, and for an execution rebuilt from a host's marker (recovered
// from the hosts), which no driver ever carries: it waits for an operator's review.
func (ds *drivers) start(rec *markers.Record) *driver { return ds.startOf(rec, false, false) }

// startDispatched starts the driver of an execution accept just journaled as dispatched: it
// sends it to its host without asking the host first.
func (ds *drivers) startDispatched(rec *markers.Record) *driver { return ds.startOf(rec, true, false) }

// startHandedOver starts the driver of an execution another replica handed over as it stopped
// (replicas.go).
func (ds *drivers) startHandedOver(rec *markers.Record) *driver { return ds.startOf(rec, false, true) }

func (ds *drivers) startOf(rec *markers.Record, dispatched, handedOver bool) *driver {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.closed || rec.RecoveredFrom != "" {
		return nil
	}
	if d := ds.m[rec.ID]; d != nil {
		if handedOver {
			d.handedOver.Store(true) // it follows the replica that handed it over
		}
		return d
	}
	d := &driver{
		core: ds.core, all: ds,
		id: rec.ID, rec: rec, changed: make(chan struct{}),
		stdout: newTail(liveTailBytes), stderr: newTail(liveTailBytes),
		asked: make(chan struct{}), done: make(chan struct{}),
		dispatched: dispatched && rec.State == markers.Dispatched,
	}
	d.handedOver.Store(handedOver)
	ds.m[rec.ID] = d
	ds.wg.Go(func() {
		defer func() {
			ds.mu.Lock()
			delete(ds.m, d.id)
			ds.slotsChangedLocked()
			ds.mu.Unlock()
			close(d.done)
		}()
		var once sync.Once
		asked := func() { once.Do(func() { close(d.asked) }) }
		defer asked()
		if !d.drives(asked) {
			return
		}
		defer d.release()
		if rec.IsFleetRun() {
			d.driveFleet(asked) // drive_fleet.go: it takes no slot, its hosts do
			return
		}
		if !d.awaitSlot(asked) {
			return
		}
		if rec.Channel == "http" {
			d.driveHTTP(asked)
			return
		}
		d.drive(asked)
	})
	return d
}

// live is execution id's driver here, nil if none.
func (ds *drivers) live(id string) *driver {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.m[id]
}

// close stops new drivers from starting.
func (ds *drivers) close() {
	ds.mu.Lock()
	ds.closed = true
	ds.mu.Unlock()
}

// requestStop notes that execution_cancel asked to stop id. Until it ends, its drivers
// cancel it on the host as soon as the host confirms a start, and cancel it in the journal
// instead of re-dispatching it if the host never started it. The note lives as long as this
// process (a restart forgets it; the host's marker still decides).
func (ds *drivers) requestStop(id string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.stops[id] = true
}

// stopRequested reports whether execution_cancel asked to stop id.
func (ds *drivers) stopRequested(id string) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.stops[id]
}

// forgetStop drops id's stop request once it ended.
func (ds *drivers) forgetStop(id string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	delete(ds.stops, id)
}

// inFlightLocked counts the live drivers of actor, and of those the ones in scope, leaving
// out except and, if activeOnly, the queued ones. Call it with ds.mu held.
func (ds *drivers) inFlightLocked(actor, scope string, except *driver, activeOnly bool) (all, run int) {
	for _, d := range ds.m {
		if d == except || (activeOnly && d.queued) {
			continue
		}
		if r := d.record(); r.PolicyActor == actor && !r.IsFleetRun() {
			all++
			if r.IntentScope == scope {
				run++
			}
		}
	}
	return all, run
}

// inFlight counts the live drivers of actor, and of those the ones in scope.
func (ds *drivers) inFlight(actor, scope string) (all, run int) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.inFlightLocked(actor, scope, nil, false)
}

// slotsChanged wakes the executions waiting for a slot (slotsChangedLocked).
func (ds *drivers) slotsChanged() {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.slotsChangedLocked()
}

// slotsChangedLocked wakes the executions waiting for a slot (awaitSlot): a driver ended, or
// a queued execution was cancelled. Call it with ds.mu held.
func (ds *drivers) slotsChangedLocked() {
	close(ds.slotFreed)
	ds.slotFreed = make(chan struct{})
}

// ended is closed once one of the drivers here ends (or a queued execution lets go of its
// place): the driver of a fleet run waits on it for its hosts' executions.
func (ds *drivers) ended() <-chan struct{} {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.slotFreed
}

// queued reports whether execution id waits for a concurrency slot.
func (ds *drivers) queued(id string) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	d := ds.m[id]
	return d != nil && d.queued
}

// reconcileLoop asks the hosts again about SSH executions whose outcome is unknown (their
// host was unreachable), until the bastion closes.
func (ds *drivers) reconcileLoop() {
	t := time.NewTicker(ds.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ds.ctx.Done():
			return
		case <-t.C:
		}
		if r := ds.replicas(); r != nil {
			ds.followInFlight(r)
			if !r.Leading() {
				continue
			}
		}
		ds.expireApprovals()
		ds.reconcileUnknown()
	}
}

// reconcileUnknown asks the hosts again about every SSH execution whose outcome is unknown
// because its host could not be asked. Unknowns that require review — asking cannot change
// them: the host's marker says the process vanished, the execution is older than the host's
// marker retention, or an HTTP class decided — wait for an operator (or an agent's retry)
// instead of being asked about on every tick.
func (ds *drivers) reconcileUnknown() {
	cursor := ""
	for {
		recs, next, err := ds.journal.List(markers.Query{State: markers.Unknown, Limit: 500, Cursor: cursor})
		if err != nil {
			ds.log.Error("list unknown executions", "err", err)
			return
		}
		for _, r := range recs {
			if r.Channel != "http" && !r.ReviewRequired {
				ds.start(r)
			}
		}
		if next == "" || ds.ctx.Err() != nil {
			return
		}
		cursor = next
	}
}

// followInFlight starts a driver — following, or driving once no replica owns it — for every
// execution in flight that has none here and has not changed for a lease TTL: a younger one
// was just written by its owner, whose lease (were it dead) would not have expired yet, and
// following every execution on every replica would cost each of its writes a watch event
// per replica.
func (ds *drivers) followInFlight(r markers.Replicated) {
	settled := ds.now().Add(-r.LeaseTTL())
	// The executions on their hosts first, as in Recover: their drivers hold concurrency
	// slots that one about to be dispatched must count.
	for _, st := range []markers.State{markers.Dispatched, markers.Running, markers.Accepted, markers.Authorized} {
		cursor := ""
		for {
			recs, next, err := ds.journal.List(markers.Query{State: st, Limit: 500, Cursor: cursor})
			if err != nil {
				ds.log.Error("list executions in flight", "state", st, "err", err)
				return
			}
			for _, rec := range recs {
				if rec.UpdatedAt.Before(settled) {
					ds.start(rec)
				}
			}
			if next == "" || ds.ctx.Err() != nil {
				break
			}
			cursor = next
		}
	}
}

// expireApprovals rejects executions that waited longer than the approval timeout.
func (ds *drivers) expireApprovals() {
	timeout := ds.current().cfg.ApprovalTimeout
	if timeout <= 0 {
		return
	}
	recs, _, err := ds.journal.List(markers.Query{State: markers.AwaitingApproval, Limit: 500})
	if err != nil {
		ds.log.Error("list pending approvals", "err", err)
		return
	}
	now := ds.now()
	for _, r := range recs {
		since, ok := r.StateTimes[markers.AwaitingApproval]
		if !ok || now.Sub(since) < timeout {
			continue
		}
		msg := fmt.Sprintf("rejected: no decision within the approval timeout (%s)", timeout.Round(time.Second))
		if _, err := ds.records.approval(ds.ctx, r.ID, markers.Rejected, msg); err != nil && !errors.Is(err, api.ErrNotAwaitingApproval) {
			ds.log.Error("expire approval", "execution_id", r.ID, "err", err)
		}
	}
}
