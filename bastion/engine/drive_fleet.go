package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/rollout"
	"github.com/postern-dev/postern/markers"
)

// The driver of a fleet run is a driver like an execution's — one per run, claimed like an
// execution on replicas (drives), started by a call, an approval, Recover or a replica's
// takeover — that carries no command itself: it starts its hosts' executions under the
// run's brakes and ends the run when they ended. Everything it decides it reads from the
// journal (the run's record and its hosts' executions) through rollout.Next, so a driver
// started after a crash or a failover goes on exactly where the last one stopped: a host
// with an execution is reconciled by that execution's own driver, never started again; a
// host without one is started under the same brakes.

// fleetPoll bounds how long a run's driver waits before it looks at its hosts again: an
// execution driven by another replica, or by the reconcile loop, ends without waking it.
const fleetPoll = time.Second

// Asking again about a host whose outcome is unknown (its host could not be asked): the
// first time after fleetAskAgainMin, then twice as long each time, up to fleetAskAgainMax.
const (
	fleetAskAgainMin = time.Second
	fleetAskAgainMax = 30 * time.Second
)

// transportFleet is how the create event of a host's execution names its call: the run's
// driver made it, for the run's call.
const transportFleet = "fleet_run"

// fleetDriver is what a run's driver keeps between its looks at the journal.
type fleetDriver struct {
	d        *driver
	log      *slog.Logger
	children []fleetChild
	// stopAsked are the executions asked to stop since the run was cancelled.
	stopAsked map[string]bool
	// askAgain is, per execution whose outcome is unknown, when to ask its host again and
	// the wait after that.
	askAgain map[string]askAgain
	// counts is the progress last told to waiters (views.await, execution_output).
	counts string
}

type askAgain struct {
	at   time.Time
	wait time.Duration
}

// driveFleet carries a fleet run to its end.
func (d *driver) driveFleet(asked func()) {
	if d.finishDecision() {
		return
	}
	fr := &fleetDriver{d: d, log: d.log.With("fleet_run", d.id), stopAsked: map[string]bool{}, askAgain: map[string]askAgain{}}
	if !fr.begin() {
		return
	}
	poll := time.NewTicker(fleetPoll)
	defer poll.Stop()
	for {
		ended := d.all.ended()
		run, ok := fr.look()
		if !ok {
			return
		}
		p, concurrency, tolerated := fleetProgress(run, fr.children)
		fr.tend(run)
		asked()
		step := rollout.Next(p, concurrency, tolerated)
		if step.Done {
			fr.end(run, p, step)
			return
		}
		if step.Start > 0 {
			if !fr.start(run, step.Start) {
				return
			}
			continue
		}
		if c := api.CountsText(countsOf(fr.children)); c != fr.counts {
			fr.counts = c
			d.notify()
		}
		select {
		case <-ended:
		case <-d.changes():
		case <-poll.C:
		case <-d.ctx.Done():
			return
		}
	}
}

// begin journals that the rollout starts (authorized → dispatched → running) unless it
// has. It returns false when the run is not to be driven: it ended, awaits approval, or the
// journal failed.
func (fr *fleetDriver) begin() bool {
	d := fr.d
	for {
		rec := d.record()
		var path []markers.State
		switch rec.State {
		case markers.Running:
			return true
		case markers.Dispatched:
			path = []markers.State{markers.Running}
		case markers.Authorized:
			path = []markers.State{markers.Dispatched, markers.Running}
		case markers.Accepted:
			if rec.Decision != string(policy.Authorized) {
				return false
			}
			path = []markers.State{markers.Authorized, markers.Dispatched, markers.Running}
		default:
			return false
		}
		_, concurrency, tolerated := fleetProgress(rec, make([]fleetChild, len(rec.Fleet.Hosts)))
		note := fmt.Sprintf("rollout started: %d hosts, max_concurrency %s (%d at once), max_errors %s (%d tolerated)",
			len(rec.Fleet.Hosts), rec.Fleet.MaxConcurrency, concurrency, rec.Fleet.MaxErrors, tolerated)
		next, err := d.records.rolloutStarted(d.ctx, rec, path, note)
		if errors.Is(err, markers.ErrConflict) {
			d.journalFailed(fr.log, "rollout start", err) // re-reads it: cancelled meanwhile?
			continue
		}
		if err != nil {
			d.journalFailed(fr.log, "rollout start", err)
			return false
		}
		d.set(next)
		d.metrics.dispatched.Inc()
		return true
	}
}

// look reads the run and its hosts' executions from the journal. An execution that ended
// for good is not read again. It returns false when the run is no longer this driver's to
// carry (it ended, or the journal failed).
func (fr *fleetDriver) look() (*markers.Record, bool) {
	d := fr.d
	run, err := d.journal.Get(d.id)
	if err != nil {
		d.journalFailed(fr.log, "read run", err)
		return nil, false
	}
	if prev := d.record(); prev.State != run.State || !prev.UpdatedAt.Equal(run.UpdatedAt) {
		d.set(run)
	}
	if run.State != markers.Running {
		return nil, false
	}
	if fr.children == nil {
		fr.children = make([]fleetChild, len(run.Fleet.Hosts))
		for i, h := range run.Fleet.Hosts {
			fr.children[i].host = h
		}
	}
	for i := range fr.children {
		ch := &fr.children[i]
		switch {
		case ch.rec == nil:
			err = d.findChild(run, ch)
		case !markers.JournalGraph.Terminal(ch.rec.State):
			var cur *markers.Record
			if cur, err = d.journal.Get(ch.rec.ID); err == nil {
				ch.rec = cur
			}
		}
		if err != nil {
			d.journalFailed(fr.log, "read host executions", err)
			return nil, false
		}
	}
	return run, true
}

// countsOf is the per-state count of a run's hosts.
func countsOf(children []fleetChild) map[string]int {
	c := map[string]int{}
	for _, ch := range children {
		if ch.rec == nil {
			c[api.NotStarted]++
		} else {
			c[string(ch.rec.State)]++
		}
	}
	return c
}

// tend keeps every started host carried: an execution in flight without a driver here
// (after a restart, or a takeover) gets one, which reconciles it with its host; one whose
// outcome is unknown because its host could not be asked is asked again, backing off; once
// the run is cancelled, every execution not ended is asked to stop.
func (fr *fleetDriver) tend(run *markers.Record) {
	d := fr.d
	now := d.now()
	for _, ch := range fr.children {
		rec := ch.rec
		if rec == nil || markers.JournalGraph.Terminal(rec.State) {
			continue
		}
		if run.Fleet.CancelledBy != "" && !fr.stopAsked[rec.ID] {
			fr.stopAsked[rec.ID] = true
			fr.stop(rec, run.Fleet.CancelledBy)
			continue
		}
		if d.all.live(rec.ID) != nil {
			continue
		}
		switch {
		case rec.State == markers.Unknown && rec.ReviewRequired:
			// Only an operator's review settles it.
		case rec.State == markers.Unknown:
			a, ok := fr.askAgain[rec.ID]
			if ok && now.Before(a.at) {
				continue
			}
			a.wait = min(max(2*a.wait, fleetAskAgainMin), fleetAskAgainMax)
			a.at = now.Add(a.wait)
			fr.askAgain[rec.ID] = a
			d.all.start(rec)
		default:
			d.all.start(rec)
		}
	}
}

// stop asks a host's execution to stop because its run was cancelled (by who): one not
// dispatched yet is cancelled in the journal; one on its host is cancelled there, and its
// driver cancels it instead of sending it again should the host turn out never to have
// started it.
func (fr *fleetDriver) stop(rec *markers.Record, who string) {
	d := fr.d
	if rec.State == markers.Accepted || rec.State == markers.Authorized {
		next, err := d.records.cancelledBeforeDispatch(d.ctx, rec, who+" (its fleet run "+d.id+")")
		if err == nil {
			d.all.slotsChanged()
			return
		}
		if !errors.Is(err, markers.ErrConflict) {
			fr.log.Error("cancel a host's execution", "execution_id", rec.ID, "err", err)
			return
		}
		rec = next // dispatched meanwhile: cancel it on its host
	}
	host, err := hostOf(d.inv, rec)
	if err != nil {
		fr.log.Warn("cancel a host's execution", "execution_id", rec.ID, "err", err)
		return
	}
	d.all.requestStop(rec.ID)
	id := rec.ID
	d.wg.Go(func() {
		if err := d.hosts.cancel(d.ctx, host, id); err != nil && d.ctx.Err() == nil {
			fr.log.Warn("cancel a host's execution", "execution_id", id, "host", host.Name, "err", err)
		}
	})
}

// start starts up to n hosts that have no execution yet, in the run's order: it journals
// each host's execution (together: they share the journal's fsyncs) and hands each to a
// driver. It returns false when the journal failed.
func (fr *fleetDriver) start(run *markers.Record, n int) bool {
	var next []int
	for i := range fr.children {
		if len(next) == n {
			break
		}
		if fr.children[i].rec == nil {
			next = append(next, i)
		}
	}
	limited := false
	if actor, ok := fr.d.current().policy.Actor(run.PolicyActor); ok {
		limited = actor.MaxConcurrent > 0 || actor.RunMaxConcurrent > 0
	}
	var wg sync.WaitGroup
	errs := make([]error, len(next))
	for k, i := range next {
		wg.Go(func() { errs[k] = fr.startHost(run, i, limited) })
	}
	wg.Wait()
	ok := true
	for _, err := range errs {
		if err != nil {
			fr.d.journalFailed(fr.log, "start a host", err)
			ok = false
		}
	}
	return ok
}

// startHost journals the execution of host i and hands it to a driver — or finds the one
// a crashed driver made. The execution is what ssh_exec would make of the run's command on
// the host, decided as the run was: rejected with the policy's refusal for a host the
// policy rejects; failed, with nothing sent, for a host no longer enrolled as it was when the
// run was accepted; else authorized (the run's approval stands for hosts that needed one),
// and dispatched at once when the host's connection is up and no max_concurrent of its
// actor has to be waited for (limited: its driver then waits for a slot, as an approved
// execution does).
func (fr *fleetDriver) startHost(run *markers.Record, i int, limited bool) error {
	d := fr.d
	ch := &fr.children[i]
	if err := d.findChild(run, ch); err != nil || ch.rec != nil {
		return err
	}
	h := ch.host
	id, err := markers.NewExecutionID(d.now())
	if err != nil {
		return err
	}
	r := &markers.Record{
		ID: id, Actor: run.Actor, PolicyActor: run.PolicyActor, IntentScope: run.IntentScope, Fingerprint: ch.fp,
		Reason: run.Reason, Tool: "ssh_exec", Channel: "ssh", Target: h.Target, Account: h.Account,
		Command: run.Command, Cwd: run.Cwd, Host: h.Name, Env: run.Env, TimeoutSeconds: run.TimeoutSeconds,
		Class: h.Class, Decision: h.Decision, Rule: h.Rule, FleetRun: run.ID,
		Evidence: []string{fmt.Sprintf("host %d of %d of fleet run %s", i+1, len(fr.children), run.ID)},
	}
	if r.Class == "" {
		r.Class = run.Class
	}
	var path []markers.State
	var note string
	switch policy.Outcome(h.Decision) {
	case policy.Rejected:
		path, note = []markers.State{markers.Rejected}, "rejected by policy: "+h.Rule
		r.Evidence = append(r.Evidence, fmt.Sprintf("policy: %s (%s), decided with its fleet run", h.Decision, h.Rule))
	case policy.AwaitingApproval:
		r.Decision = string(policy.Authorized)
		r.Evidence = append(r.Evidence, fmt.Sprintf("policy: approval required (%s); approved with its fleet run %s: one approval stands for the run's hosts", h.Rule, run.ID))
	default:
		r.Evidence = append(r.Evidence, fmt.Sprintf("policy: %s (%s), decided with its fleet run", h.Decision, h.Rule))
	}
	if path == nil {
		host, err := d.inv.Host(h.Name)
		switch {
		case err != nil:
			note = fmt.Sprintf("host %s is no longer in the inventory (%v); nothing was sent", h.Name, err)
		case intent.SSHTarget(host.Name, host.HostKey.Type(), host.Fingerprint()) != h.Target || host.Account != h.Account:
			note = fmt.Sprintf("host %s was enrolled again (another host key or account) since the run was accepted; nothing was sent", h.Name)
		}
		if note != "" {
			path = []markers.State{markers.Authorized, markers.Failed}
			r.IsError = true
			r.Evidence = append(r.Evidence, note)
		} else {
			if r.Cwd == "" {
				r.Cwd = host.Cwd
			}
			path, note = []markers.State{markers.Authorized}, "authorized with its fleet run"
			if !limited && d.pool.Connected(h.Name) {
				path, note = append(path, markers.Dispatched), "dispatching to "+h.Name
			}
		}
	}
	call := &markers.Call{Transport: transportFleet, Run: run.IntentScope, Match: string(intent.NewExecution)}
	rec, err := d.records.create(d.ctx, r, path, note, call)
	if errors.Is(err, markers.ErrRaced) {
		// Another replica's driver made it first (it drove the run until its lease ran out).
		return d.findChild(run, ch)
	}
	if err != nil {
		return err
	}
	ch.rec = rec
	d.metrics.accepted.Inc()
	switch rec.State {
	case markers.Dispatched:
		d.metrics.dispatched.Inc()
		d.all.startDispatched(rec)
	case markers.Authorized:
		d.all.start(rec)
	default:
		d.metrics.finished.WithLabelValues(string(rec.State)).Inc()
	}
	return nil
}

// end journals how the run ended, once nothing runs and nothing more starts: cancelled;
// failed when no host's command ran at all (every execution failed before it started, or
// was rejected), so it provably had no effect; else completed, an error when a host failed
// or the brakes stopped it.
func (fr *fleetDriver) end(run *markers.Record, p rollout.Progress, step rollout.Step) {
	d := fr.d
	counts := countsOf(fr.children)
	to, isError := markers.Completed, p.Failed > 0 || step.Outcome == rollout.Stopped
	note := fmt.Sprintf("rollout %s: %s", step.Outcome, api.CountsText(counts))
	switch {
	case step.Outcome == rollout.Cancelled:
		to, note = markers.Cancelled, fmt.Sprintf("rollout cancelled by %s: %s", run.Fleet.CancelledBy, api.CountsText(counts))
	case counts[string(markers.Failed)]+counts[string(markers.Rejected)] == p.Started:
		to = markers.Failed
	}
	if step.Outcome == rollout.Stopped {
		note += fmt.Sprintf("; more hosts failed than max_errors %s tolerates, so %d never started", run.Fleet.MaxErrors, p.Total-p.Started)
	}
	next, err := d.records.rolloutEnded(d.ctx, run, to, note, isError)
	if err != nil {
		d.journalFailed(fr.log, "rollout end", err)
		return
	}
	d.set(next)
	d.metrics.finished.WithLabelValues(string(to)).Inc()
	fr.log.Info("fleet run ended", "state", to, "outcome", step.Outcome, "hosts", api.CountsText(counts))
}

// cancelFleet stops a fleet run for who: one not started yet is cancelled at once; a
// running one is marked cancelled in the journal — no host starts any more, whichever
// driver carries it, after any restart — and its driver asks the running hosts to stop. It
// waits up to cancelWait for the run to end.
func (b *Engine) cancelFleet(ctx context.Context, who string, run *markers.Record) (*api.Execution, error) {
	switch run.State {
	case markers.AwaitingApproval:
		x := b.views.fleetView(run)
		x.Next = "It awaits an operator's approval and has not run on any host; it cannot be cancelled, and it runs only if approved. An operator denies it (postern deny), or approval_timeout rejects it."
		return x, nil
	case markers.Accepted, markers.Authorized:
		next, err := b.records.cancelledBeforeDispatch(ctx, run, who)
		if err == nil {
			return b.views.fleetView(next), nil
		}
		if !errors.Is(err, markers.ErrConflict) {
			return nil, journalError(err)
		}
		run = next // its driver started the rollout meanwhile
	}
	if run.State != markers.Dispatched && run.State != markers.Running {
		x := b.views.fleetView(run)
		x.Next = "It had already ended (" + string(run.State) + "); nothing to cancel."
		return x, nil
	}
	if b.held {
		return nil, errHeld("cancelling " + run.ID + " means asking its hosts to stop")
	}
	next, err := b.records.rolloutCancelled(ctx, run.ID, who)
	if err != nil {
		return nil, journalError(err)
	}
	d := b.drivers.start(next)
	if d == nil {
		return b.views.fleetView(next), nil
	}
	d.set(next) // wake it, if it was driving the run already
	return b.views.await(ctx, d, cancelWait, false, nil), nil
}

// CancelFleetRun is `postern fleet cancel`: an operator stops a fleet run, whoever's it is.
func (b *Engine) CancelFleetRun(ctx context.Context, op api.Operator, id string) (*api.Execution, error) {
	if b.readOnly {
		return nil, errReadOnly
	}
	if !markers.ValidFleetRunID(id) {
		return nil, api.Invalid("%q is not a fleet run id (fr_ and a 26-character ULID)", id)
	}
	run, err := b.journal.Get(id)
	switch {
	case errors.Is(err, markers.ErrNotFound):
		return nil, &api.ToolError{Code: api.CodeNotFound, Message: "no fleet run " + id}
	case err != nil:
		return nil, journalError(err)
	}
	return b.cancelFleet(ctx, op.Name, run)
}
