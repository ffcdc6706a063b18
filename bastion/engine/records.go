package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// records is the one owner of an execution's journal writes: every state an execution
// reaches, every note, call and delivery it gets, is written here, named for what it
// records. Each write is a compare-and-set on the state its caller saw (markers.ErrConflict
// when another writer moved the record first) and synced, except the two a crash may lose
// without harm, which say why (running, delivered).
//
// A caller acts on what it wrote only once the write returned; a failed write stops the
// execution where it is (fail closed).
type records struct {
	journal markers.JournalStore
	now     func() time.Time
	metrics *metrics
	// runs are the agent runs the journal already holds (calls.go).
	runs knownRuns
	// replica is this bastion's replica name ("" on a single node): the journal names it in
	// every call it writes and in the executions it drives (replicas.go).
	replica string
}

// drives names this replica in r as the one driving it (Record.Replica).
func (rs *records) drives(r *markers.Record) error {
	r.Replica = rs.replica
	return nil
}

// served names this replica in call as the one that served it (Call.Replica).
func (rs *records) served(call *markers.Call) *markers.Call {
	if call != nil && rs.replica != "" {
		call.Replica = rs.replica
	}
	return call
}

// create journals a new execution with the call that made it: accepted, and along path at
// once when the policy authorized it (docs/design.md, "Two synced writes per execution").
func (rs *records) create(ctx context.Context, r *markers.Record, path []markers.State, note string, call *markers.Call) (*markers.Record, error) {
	var rec *markers.Record
	var err error
	rs.drives(r)
	call = rs.served(call)
	if path == nil {
		rec, err = rs.journal.CreateFor(ctx, r, call)
	} else {
		rec, err = rs.journal.CreateAdvancedFor(ctx, r, path, note, call)
	}
	if err == nil {
		rs.recorded(r.Actor, call)
	}
	return rec, err
}

// joined journals a call answered by the existing execution id (a join, a replay, a
// refusal): a joined event, written after the intake lock is released.
func (rs *records) joined(ctx context.Context, c transport.Caller, scope, id string, match intent.Match) error {
	call := rs.served(rs.call(ctx, c, scope, match, match.Joins()))
	if err := rs.journal.Joined(context.WithoutCancel(ctx), id, call); err != nil {
		return err
	}
	rs.recorded(c.Actor, call)
	return nil
}

// policyDecision journals a policy decision other than authorized: the execution waits for
// an operator (awaiting_approval) or is rejected. Neither ever dispatches. Its note, also its
// latest evidence, is what the agent reads as the cause (policyRefusal).
func (rs *records) policyDecision(ctx context.Context, rec *markers.Record, dec policy.Decision) (*markers.Record, error) {
	to, note := markers.Rejected, policyRefusal(dec).Text()
	if dec.Outcome == policy.AwaitingApproval {
		to = markers.AwaitingApproval
	}
	next, err := rs.journal.Transition(ctx, rec.ID, rec.State, to, note, addEvidence(note))
	if err != nil {
		return nil, journalError(err)
	}
	if to == markers.Rejected {
		rs.metrics.finished.WithLabelValues(string(markers.Rejected)).Inc()
	}
	return next, nil
}

// authorized journals that an accepted execution may go ahead (an HTTP execution's driver
// resuming one a crash stopped before).
func (rs *records) authorized(ctx context.Context, rec *markers.Record) (*markers.Record, error) {
	return rs.journal.Transition(ctx, rec.ID, markers.Accepted, markers.Authorized, "authorized", nil)
}

// dispatching journals that the execution is being sent to host, along path (through
// authorized when it was accepted), before anything is sent.
func (rs *records) dispatching(ctx context.Context, rec *markers.Record, path []markers.State, host string) (*markers.Record, error) {
	return rs.journal.Advance(ctx, rec.ID, rec.State, path, "dispatching to "+host, rs.drives)
}

// requestSent journals that an HTTP request's bytes were handed to the OS: from here on its
// outcome may be unknown, never "not sent".
func (rs *records) requestSent(ctx context.Context, rec *markers.Record) (*markers.Record, error) {
	return rs.journal.Transition(ctx, rec.ID, rec.State, markers.Dispatched, "request bytes handed to the OS", rs.drives)
}

// running journals that the host started the command: its marker m exists and is live.
//
// It is written without an fsync (markers.NoSync): it is not one of an execution's two synced
// writes. Losing it is harmless: a crash that loses it leaves the execution dispatched, and
// Recover treats dispatched and running alike — it asks the host, whose marker decides
// (verdict.ReconcileOn never looks at which of the two the journal shows). The outcome's write
// is synced and the journal's log is synced in order, so running is durable before the
// outcome.
func (rs *records) running(ctx context.Context, rec *markers.Record, m *hostproto.Marker) (*markers.Record, error) {
	return rs.journal.TransitionWith(ctx, rec.ID, rec.State, markers.Running, "host marker "+string(m.State), markers.NoSync, func(r *markers.Record) error {
		r.PID, r.PIDStart = m.PID, m.PIDStart
		return nil
	})
}

// settled journals what the driver concluded: the execution moving along path with note as
// evidence, or, with no path, the note alone; result (the stored output or response) goes
// in the same write.
func (rs *records) settled(ctx context.Context, rec *markers.Record, path []markers.State, note string, result []byte, apply func(*markers.Record) error) (*markers.Record, error) {
	switch {
	case path == nil:
		return rs.journal.Update(ctx, rec.ID, note, apply)
	case result != nil:
		return rs.journal.AdvanceWithResult(ctx, rec.ID, rec.State, path, note, result, apply)
	}
	return rs.journal.Advance(ctx, rec.ID, rec.State, path, note, apply)
}

// queued journals that the execution waits for its actor's concurrency slot (why), and
// dequeued that it got one.
func (rs *records) queued(ctx context.Context, id, why string) (*markers.Record, error) {
	return rs.journal.Update(ctx, id, "queued", addEvidence("queued: "+why+"; it is dispatched when one ends"))
}

func (rs *records) dequeued(ctx context.Context, id string) (*markers.Record, error) {
	return rs.journal.Update(ctx, id, "dequeued", addEvidence("a concurrency slot is free: dispatching"))
}

// cancelledBeforeDispatch journals that actor cancelled an execution nothing was sent for
// yet.
func (rs *records) cancelledBeforeDispatch(ctx context.Context, rec *markers.Record, actor string) (*markers.Record, error) {
	path := []markers.State{markers.Cancelled}
	if rec.State == markers.Accepted {
		path = []markers.State{markers.Authorized, markers.Cancelled}
	}
	return rs.journal.Advance(ctx, rec.ID, rec.State, path, "cancelled by "+actor+" before dispatch", nil)
}

// rolloutStarted journals that a fleet run starts its hosts (along path, to running).
func (rs *records) rolloutStarted(ctx context.Context, run *markers.Record, path []markers.State, note string) (*markers.Record, error) {
	return rs.journal.Advance(ctx, run.ID, run.State, path, note, addEvidence(note))
}

// rolloutCancelled journals that who asked a running fleet run to stop: from this write on,
// no driver starts another of its hosts. Asking again changes nothing.
func (rs *records) rolloutCancelled(ctx context.Context, id, who string) (*markers.Record, error) {
	rec, err := rs.journal.Update(ctx, id, "cancel requested by "+who, func(r *markers.Record) error {
		if r.Fleet == nil || r.Fleet.CancelledBy != "" {
			return markers.ErrUnchanged
		}
		r.Fleet.CancelledBy = who
		r.Evidence = appendBounded(r.Evidence, "cancel requested by "+who+": no host starts any more; the running ones are asked to stop")
		return nil
	})
	if errors.Is(err, markers.ErrUnchanged) {
		return rec, nil
	}
	return rec, err
}

// rolloutEnded journals how a fleet run ended (completed, failed or cancelled), once none of
// its hosts runs and none will start.
func (rs *records) rolloutEnded(ctx context.Context, run *markers.Record, to markers.State, note string, isError bool) (*markers.Record, error) {
	return rs.journal.Transition(ctx, run.ID, run.State, to, note, func(r *markers.Record) error {
		r.IsError = isError
		r.Evidence = appendBounded(r.Evidence, note)
		return nil
	})
}

// approval journals a decision on an execution awaiting approval: authorized or rejected,
// with msg (who decided, and why) as evidence. api.ErrNotAwaitingApproval when it no longer
// awaits one.
func (rs *records) approval(ctx context.Context, id string, to markers.State, msg string) (*markers.Record, error) {
	rec, err := rs.journal.Transition(ctx, id, markers.AwaitingApproval, to, msg, func(r *markers.Record) error {
		r.Evidence = appendBounded(r.Evidence, msg)
		return rs.drives(r) // an approved execution is driven here next
	})
	switch {
	case errors.Is(err, markers.ErrConflict):
		return rec, fmt.Errorf("%w: %s is %s", api.ErrNotAwaitingApproval, id, rec.State)
	case errors.Is(err, markers.ErrNotFound):
		return nil, &api.ToolError{Code: api.CodeNotFound, Message: "no execution " + id}
	case err != nil:
		return nil, journalError(err)
	}
	rs.metrics.approvals.WithLabelValues(string(to)).Inc()
	return rec, nil
}

// reviewed journals what an operator verified about an execution in from: completed (it
// took effect) or failed (it did not).
func (rs *records) reviewed(ctx context.Context, id string, from, to markers.State, msg string) (*markers.Record, error) {
	return rs.journal.Transition(ctx, id, from, to, msg, func(r *markers.Record) error {
		r.Evidence = appendBounded(r.Evidence, msg)
		r.IsError = to == markers.Failed
		return nil
	})
}

// offered journals that the approval of execution id was asked of its caller's user (call),
// while it still awaits approval (else errNoOffer).
func (rs *records) offered(ctx context.Context, id string, call *markers.Call) (*markers.Record, error) {
	return rs.journal.UpdateFor(context.WithoutCancel(ctx), id, approvalOfferedNote, rs.served(call), markers.Sync, func(r *markers.Record) error {
		if r.State != markers.AwaitingApproval {
			return errNoOffer
		}
		r.Evidence = appendBounded(r.Evidence, approvalOfferedNote+"; an operator may still decide")
		return nil
	})
}

// delivered journals that the result of execution id reached the caller named by call.
//
// The mark is written without an fsync (markers.NoSync), off the critical path: losing it is
// harmless. A crash that loses it leaves the execution completed with its result not
// delivered, so a retry replays the stored result — never a second dispatch, and what the
// design prescribes whenever delivery is in doubt. Anything that acts on the mark (a new
// execution of the same intent, once it no longer matches) is itself a synced write, and the
// journal's log is synced in order, so the mark is durable before that write is. Its
// revocation (deliveryRevoked) stays synced: losing that would turn a retry into a new intent.
func (rs *records) delivered(ctx context.Context, id string, call *markers.Call) error {
	_, err := rs.journal.UpdateFor(context.WithoutCancel(ctx), id, deliveredNote, rs.served(call), markers.NoSync, func(r *markers.Record) error {
		if r.ResultDeliveredAt == nil && markers.JournalGraph.Terminal(r.State) {
			t := rs.now().UTC()
			r.ResultDeliveredAt = &t
		}
		return nil
	})
	return err
}

// notDelivered journals why the response to call, which carried the result of id, does not
// count as its delivery (api.NotDeliveredNote and why): evidence for the operator, for a
// result that ended and counts as not delivered (else nothing is written). Like the delivery
// mark it is written without an fsync: losing it loses an explanation, never a decision.
func (rs *records) notDelivered(ctx context.Context, id string, call *markers.Call, why string) error {
	_, err := rs.journal.UpdateFor(context.WithoutCancel(ctx), id, api.NotDeliveredNote+": "+why, rs.served(call), markers.NoSync, func(r *markers.Record) error {
		if r.ResultDeliveredAt != nil || !markers.JournalGraph.Terminal(r.State) {
			return errNothingToExplain
		}
		return nil
	})
	if errors.Is(err, errNothingToExplain) {
		return nil
	}
	return err
}

// errNothingToExplain: the result is delivered after all, or not ready: there is no failed
// delivery to explain.
var errNothingToExplain = errors.New("bastion: no undelivered result to explain")

// deliveryRevoked journals that the result of id was not delivered after all: the client
// cancelled the request that carried it.
func (rs *records) deliveryRevoked(ctx context.Context, id string) (bool, error) {
	_, revoked, err := rs.journal.RevokeDelivery(ctx, id, "the client cancelled the request that carried the result (notifications/cancelled)")
	return revoked, err
}

// recovered journals an execution the journal did not know, rebuilt from its host's marker by
// postern recover --from-hosts (r, from recoveredRecord): created unknown, review required,
// in one write, with note on its steps. Invariants: it is never driven — no driver starts for
// a record with RecoveredFrom (drivers.startOf), so it is never dispatched, attached to or
// reconciled — and it is matched only by a call with its fingerprint, which is answered
// with it (intent.RuleRecovered). Only an operator's review settles it.
func (rs *records) recovered(ctx context.Context, r *markers.Record, note string) (*markers.Record, error) {
	r.ReviewRequired = true
	r.Evidence = appendBounded(r.Evidence, note)
	return rs.journal.CreateAdvancedFor(ctx, r, []markers.State{markers.Authorized, markers.Dispatched, markers.Unknown}, note, nil)
}

// reviewRecovered journals what recovery from the hosts found about an execution the journal
// shows unfinished: its host ran it since (or, keeping no markers, may have), so it moves to
// unknown along the states that proves (verdict.RecoveryPath), review required, with note
// and the host's evidence. A start reconciles it with its host like any unknown outcome it
// may ask about, and never dispatches one whose host has its marker.
func (rs *records) reviewRecovered(ctx context.Context, rec *markers.Record, note string, evidence []string) (*markers.Record, error) {
	apply := func(r *markers.Record) error {
		for _, e := range append(evidence, note) {
			r.Evidence = appendBounded(r.Evidence, e)
		}
		r.ReviewRequired = true
		return nil
	}
	if path := verdict.RecoveryPath(rec.State); path != nil {
		return rs.journal.Advance(ctx, rec.ID, rec.State, path, note, apply)
	}
	return rs.journal.Update(ctx, rec.ID, note, apply)
}

// takenOver journals that this replica took execution rec over from the replica that drove
// it (rec.Replica), which stopped (handed is true: it handed its executions over as it
// stopped) or lost its lease (it died, or lost etcd for longer than its lease TTL); this
// replica drives it from here, asking its host first.
func (rs *records) takenOver(ctx context.Context, rec *markers.Record, handed bool) (*markers.Record, error) {
	why := rec.Replica + "'s lease expired: it died, or lost etcd for longer than its lease"
	if handed {
		why = rec.Replica + " handed it over as it stopped"
	}
	note := fmt.Sprintf("taken over by replica %s from %s (%s)", rs.replica, rec.Replica, why)
	return rs.journal.Update(ctx, rec.ID, note, func(r *markers.Record) error {
		r.Evidence = appendBounded(r.Evidence, note)
		return rs.drives(r)
	})
}

// journalError reports a failed journal read or write: the call fails closed.
func journalError(err error) error {
	var te *api.ToolError
	if errors.As(err, &te) {
		return err
	}
	return &api.ToolError{Code: api.CodeJournalUnavailable, Message: "the journal could not record this call, so nothing was dispatched: " + err.Error()}
}
