package intent

import (
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// The matching rule (docs/design.md, "Intent scope and the matching rule"): whether an incoming
// call belongs to an execution that already exists, and what the bastion does with it. It is
// one pure function for every tool that starts work (ssh_exec, http_request), so both
// channels answer a retry the same way.

// Match is what the matching rule decides for one call.
type Match string

const (
	// NewExecution: no prior execution matches; accept a new one.
	NewExecution Match = "new"
	// NewAttempt: the call's idempotency_key names an execution that ended failed
	// (provably no effect) and the request is the same: accept a new execution linked to it
	// (previous_attempt).
	NewAttempt Match = "new_attempt"
	// KeyReused: the idempotency_key names an execution of another request; refuse,
	// nothing is dispatched.
	KeyReused Match = "idempotency_key_reused"
	// KeyHeld: the idempotency_key names an execution of another principal; refuse without
	// naming it, nothing is dispatched (never a second run of what may be the same request).
	KeyHeld Match = "idempotency_key_held"

	// recover_or_attach, by the prior execution's state.

	// Continue: accepted or authorized, not dispatched: continue the same execution.
	Continue Match = "continue"
	// Pending: awaiting_approval: return the pending record, never a second approval.
	Pending Match = "pending"
	// Rejection: rejected: return the same rejection.
	Rejection Match = "rejection"
	// Attach: dispatched or running: attach and wait up to wait_s.
	Attach Match = "attach"
	// Reconcile: unknown: reconcile with the host (or the endpoint's class) first.
	Reconcile Match = "reconcile"
	// Replay: it ended: return the stored result, no new dispatch.
	Replay Match = "replay"
)

// Joins reports whether the outcome answers the call with the prior execution.
func (o Match) Joins() bool {
	switch o {
	case Continue, Pending, Rejection, Attach, Reconcile, Replay, Recovered:
		return true
	}
	return false
}

// Facts are what the rule knows of an incoming call.
type Facts struct {
	Actor, Scope, Fingerprint, IdempotencyKey string
	// Principal holds the caller's keys (markers.Record.Principal): its configured principal,
	// or the actor itself.
	Principal string
	// SameRequest (keyed calls): the prior execution was made for this same request — its
	// fingerprint equals this call's action fingerprinted in the prior's intent scope, since
	// a key is matched across scopes.
	SameRequest bool
}

// Rule decides what a call does given prior, the execution its lookup found (nil:
// none) — by idempotency_key for a keyed call (any principal's), by (actor, scope,
// fingerprint) otherwise — at now, with class the prior execution's action class.
//
// A keyed call is matched by its key alone, across scopes and across the actors of its
// principal, for the class's retention: same request → the prior execution (a new attempt if
// it ended failed), another request → idempotency_key_reused, a key another principal holds
// → idempotency_key_held. An unkeyed call joins a prior execution of the same intent (same
// actor, scope and fingerprint, no key) that is still live or whose result was not delivered,
// within the class's attach window.
func Rule(prior *markers.Record, in Facts, now time.Time, class config.Class) Match {
	if in.IdempotencyKey != "" {
		switch {
		case prior == nil || prior.IdempotencyKey != in.IdempotencyKey:
			return NewExecution
		case markers.JournalGraph.Terminal(prior.State) && now.Sub(FinishedAt(prior)) > class.Retention:
			return NewExecution // the key's retention has passed: it is free again
		case !HoldsKey(prior, in):
			return KeyHeld
		case !in.SameRequest:
			return KeyReused
		case prior.State == markers.Failed:
			return NewAttempt
		}
		return RecoverOrAttach(prior)
	}
	switch {
	case prior == nil || prior.Actor != in.Actor || prior.IntentScope != in.Scope ||
		prior.Fingerprint != in.Fingerprint || prior.IdempotencyKey != "":
		return NewExecution
	case now.Sub(prior.CreatedAt) > class.AttachWindow:
		return NewExecution
	}
	switch prior.State {
	case markers.Failed, markers.Cancelled, markers.TimedOut:
		return NewExecution
	case markers.Completed:
		if prior.ResultDeliveredAt != nil {
			return NewExecution
		}
	}
	return RecoverOrAttach(prior)
}

// HoldsKey reports whether the caller of in holds prior's idempotency key: prior is of its
// principal, or — made before principals — of its actor.
func HoldsKey(prior *markers.Record, in Facts) bool {
	if prior.Principal == "" {
		return prior.Actor == in.Actor
	}
	return prior.Principal == in.Principal
}

// RecoverOrAttach is the recover_or_attach table of docs/design.md: what a call that matched prior
// gets, by prior's state. It never returns a blind success.
func RecoverOrAttach(prior *markers.Record) Match {
	switch prior.State {
	case markers.Accepted, markers.Authorized:
		return Continue
	case markers.AwaitingApproval:
		return Pending
	case markers.Rejected:
		return Rejection
	case markers.Dispatched, markers.Running:
		return Attach
	case markers.Unknown:
		return Reconcile
	}
	return Replay
}

// FinishedAt is when an execution reached its terminal state — when its outcome was
// observed — not when its record last changed (a delivery write changes that). Zero for an
// execution that has not ended.
func FinishedAt(rec *markers.Record) time.Time {
	if !markers.JournalGraph.Terminal(rec.State) {
		return time.Time{}
	}
	if t, ok := rec.StateTimes[rec.State]; ok {
		return t
	}
	return rec.UpdatedAt
}

// Scope is the intent scope of a call (docs/design.md, "Intent scope and the matching
// rule"): the kernel-derived agent run for local callers; run_id (the tool argument, "" when
// the call has none) or the Postern-Run header for remote ones; otherwise the attach window
// of the OAuth subject behind the call ("window:" + sub — people mapped to one actor must not
// join each other's executions), or of the actor ("window"), which the matching rule bounds
// by time. It is the one derivation of a scope: the journal's records and calls, the cancel
// registry and the approval offers all use it.
func Scope(c transport.Caller, runID string) string {
	switch {
	case c.Local && c.Scope != "":
		return c.Scope
	case runID != "":
		return "run:" + runID
	case c.RunID != "":
		return "run:" + c.RunID
	case c.Subject != "":
		return "window:" + c.Subject
	}
	return "window"
}

// SameRequest reports whether prior was made for the same request as action (fingerprinted
// fingerprint in its own scope), whatever the scope and whichever actor of the principal
// made it: an idempotency key is matched across scopes and across a principal's actors, so
// the comparison recomputes the fingerprint with prior's scope and actor.
func (f *Fingerprinter) SameRequest(prior *markers.Record, action ActionRecord, fingerprint string) (bool, error) {
	if prior.IntentScope == action.IntentScope && prior.Actor == action.Actor {
		return prior.Fingerprint == fingerprint, nil
	}
	action.IntentScope, action.Actor = prior.IntentScope, prior.Actor
	fp, err := f.Fingerprint(action)
	return fp == prior.Fingerprint, err
}

// LockKey is the intake lock of one unkeyed intent: calls of it are matched and
// accepted one at a time.
func LockKey(actor, scope, fingerprint string) string {
	return "f\x00" + actor + "\x00" + scope + "\x00" + fingerprint
}

// KeyLockKey is the intake lock of one idempotency key. Keys are matched across principals
// (a key another principal holds is refused), so the lock is the key's alone: two calls
// with one key, from any actors, are matched and accepted one at a time.
func KeyLockKey(key string) string { return "k\x00" + key }
