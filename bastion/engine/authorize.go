package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// Authorization decides whether a caller may start an execution (bastion/policy), before it
// is accepted; the decision and the ladder's steps are journaled with the execution. The
// journal being unavailable is the ladder's first step: acceptance fails closed.

// policyActor resolves the caller to its configured actor: by token name for remote
// callers, by process (uid, executable) for local ones.
func (b *Engine) policyActor(c transport.Caller) (policy.Actor, bool) {
	if c.Local {
		return b.policy.LocalActor(c.UID, c.Exe)
	}
	return b.policy.Actor(strings.TrimPrefix(c.Actor, "token:"))
}

// decide runs the ladder for a new execution and checks the actor's limits (limits.go). A
// rejection by the ladder is journaled (the caller and an operator can see it and why);
// exceeding a limit is a plain error and journals nothing. The returned release must be
// called once the execution is accepted and its driver started: an actor with limits is
// admitted one call at a time, so concurrent calls cannot all pass the same count.
func (b *Engine) decide(c transport.Caller, cl *claim) (policy.Decision, func(), error) {
	actor, ok := b.policyActor(c)
	ask := cl.ask
	if ok {
		ask.Actor = actor.Name
		cl.record.PolicyActor = actor.Name
	}
	dec := b.policy.Decide(ask)
	cl.record.Class = dec.Class
	if cl.record.Class == "" {
		cl.record.Class = cl.defaultClass
	}
	cl.record.Decision = string(dec.Outcome)
	steps := append([]string(nil), dec.Steps...)
	steps = append(steps, fmt.Sprintf("policy: %s (%s)", dec.Outcome, dec.Rule))
	for _, s := range steps {
		cl.record.Evidence = appendBounded(cl.record.Evidence, s)
	}
	if dec.Outcome == policy.Rejected || !ok || !actor.Limited() {
		return dec, func() {}, nil
	}
	release := sync.OnceFunc(b.intake.Lock("a\x00" + actor.Name))
	if err := b.checkLimits(c, actor, cl.scope, dec.Outcome == policy.Authorized); err != nil {
		release()
		return dec, nil, err
	}
	return dec, release, nil
}

// applyDecision journals a decision other than authorized: the execution waits for an
// operator, or is rejected. Neither ever dispatches.
func (b *Engine) applyDecision(ctx context.Context, rec *markers.Record, dec policy.Decision) (*markers.Record, error) {
	to, note := markers.Rejected, fmt.Sprintf("rejected by policy: %s", dec.Rule)
	if dec.Outcome == policy.AwaitingApproval {
		to, note = markers.AwaitingApproval, fmt.Sprintf("approval required by policy: %s", dec.Rule)
	}
	next, err := b.records.decided(ctx, rec, to, note)
	if err != nil {
		return nil, journalError(err)
	}
	if to == markers.Rejected {
		b.metrics.finished.WithLabelValues(string(markers.Rejected)).Inc()
	}
	return next, nil
}

// finishDecision completes the journaling of a decision a crash interrupted: an execution
// accepted with a decision other than authorized never dispatches. It reports whether the
// driver must stop here.
func (d *driver) finishDecision() bool {
	rec := d.record()
	if rec.State != markers.Accepted || rec.Decision == "" || rec.Decision == string(policy.Authorized) {
		return false
	}
	next, err := d.e.applyDecision(d.ctx, rec, policy.Decision{Outcome: policy.Outcome(rec.Decision), Rule: "as decided when it was accepted"})
	if err != nil {
		d.journalFailed(d.log, "decision", err)
		return true
	}
	d.set(next)
	return true
}
