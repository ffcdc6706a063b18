package bastion

import (
	"time"

	"github.com/postern-dev/postern/bastion/config"

	"github.com/postern-dev/postern/markers"
)

// The matching rule (DESIGN.md, "Intent scope and the matching rule"): whether an incoming
// call belongs to an execution that already exists, and what the bastion does with it. It is
// one pure function for every tool that starts work (ssh_exec, http_request), so both
// channels answer a retry the same way.

// matchOutcome is what the matching rule decides for one call.
type matchOutcome string

const (
	// matchNew: no prior execution matches; accept a new one.
	matchNew matchOutcome = "new"
	// matchNewAttempt: the call's idempotency_key names an execution that ended failed
	// (provably no effect) and the request is the same: accept a new execution linked to it
	// (previous_attempt).
	matchNewAttempt matchOutcome = "new_attempt"
	// matchKeyReused: the idempotency_key names an execution of another request; refuse,
	// nothing is dispatched.
	matchKeyReused matchOutcome = "idempotency_key_reused"

	// recover_or_attach, by the prior execution's state.

	// matchContinue: accepted or authorized, not dispatched: continue the same execution.
	matchContinue matchOutcome = "continue"
	// matchPending: awaiting_approval: return the pending record, never a second approval.
	matchPending matchOutcome = "pending"
	// matchRejection: rejected: return the same rejection.
	matchRejection matchOutcome = "rejection"
	// matchAttach: dispatched or running: attach and wait up to wait_s.
	matchAttach matchOutcome = "attach"
	// matchReconcile: unknown: reconcile with the host (or the endpoint's class) first.
	matchReconcile matchOutcome = "reconcile"
	// matchReplay: it ended: return the stored result, no new dispatch.
	matchReplay matchOutcome = "replay"
)

// joins reports whether the outcome answers the call with the prior execution.
func (o matchOutcome) joins() bool {
	switch o {
	case matchContinue, matchPending, matchRejection, matchAttach, matchReconcile, matchReplay:
		return true
	}
	return false
}

// callFacts are what the rule knows of an incoming call.
type callFacts struct {
	Actor, Scope, Fingerprint, IdempotencyKey string
	// SameRequest (keyed calls): the prior execution was made for this same request — its
	// fingerprint equals this call's action fingerprinted in the prior's intent scope, since
	// a key is matched across scopes.
	SameRequest bool
}

// matchRule decides what a call does given prior, the execution its lookup found (nil:
// none) — by (actor, idempotency_key) for a keyed call, by (actor, scope, fingerprint)
// otherwise — at now, with class the prior execution's action class.
//
// A keyed call is matched by its key alone, across scopes, for the class's retention: same
// request → the prior execution (a new attempt if it ended failed), another request →
// idempotency_key_reused. An unkeyed call joins a prior execution of the same intent (same
// actor, scope and fingerprint, no key) that is still live or whose result was not delivered,
// within the class's attach window.
func matchRule(prior *markers.Record, in callFacts, now time.Time, class config.Class) matchOutcome {
	if in.IdempotencyKey != "" {
		switch {
		case prior == nil || prior.Actor != in.Actor || prior.IdempotencyKey != in.IdempotencyKey:
			return matchNew
		case markers.JournalGraph.Terminal(prior.State) && now.Sub(finishedAt(prior)) > class.Retention:
			return matchNew // the key's retention has passed: it is free again
		case !in.SameRequest:
			return matchKeyReused
		case prior.State == markers.Failed:
			return matchNewAttempt
		}
		return recoverOrAttach(prior)
	}
	switch {
	case prior == nil || prior.Actor != in.Actor || prior.IntentScope != in.Scope ||
		prior.Fingerprint != in.Fingerprint || prior.IdempotencyKey != "":
		return matchNew
	case now.Sub(prior.CreatedAt) > class.AttachWindow:
		return matchNew
	}
	switch prior.State {
	case markers.Failed, markers.Cancelled, markers.TimedOut:
		return matchNew
	case markers.Completed:
		if prior.ResultDeliveredAt != nil {
			return matchNew
		}
	}
	return recoverOrAttach(prior)
}

// recoverOrAttach is DESIGN.md's recover_or_attach table: what a call that matched prior
// gets, by prior's state. It never returns a blind success.
func recoverOrAttach(prior *markers.Record) matchOutcome {
	switch prior.State {
	case markers.Accepted, markers.Authorized:
		return matchContinue
	case markers.AwaitingApproval:
		return matchPending
	case markers.Rejected:
		return matchRejection
	case markers.Dispatched, markers.Running:
		return matchAttach
	case markers.Unknown:
		return matchReconcile
	}
	return matchReplay
}

// finishedAt is when an execution reached its terminal state — when its outcome was
// observed — not when its record last changed (a delivery write changes that). Zero for an
// execution that has not ended.
func finishedAt(rec *markers.Record) time.Time {
	if !markers.JournalGraph.Terminal(rec.State) {
		return time.Time{}
	}
	if t, ok := rec.StateTimes[rec.State]; ok {
		return t
	}
	return rec.UpdatedAt
}
