package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// views turns the journal's records (and a live driver's output) into what the surfaces
// return: an execution's view, its stored result, its output from offsets, its state for a
// task. Reading never changes anything.
type views struct {
	*core
	drivers *drivers
}

// view builds the result from a record, without output.
func (v *views) view(rec *markers.Record) *api.Execution {
	if rec.IsFleetRun() {
		return v.fleetView(rec)
	}
	x := &api.Execution{
		ExecutionID:     rec.ID,
		State:           string(rec.State),
		ResultDelivered: rec.ResultDeliveredAt != nil,
		Host:            rec.Host,
		Command:         commandLine(rec),
		Class:           rec.Class,
		HTTPStatus:      rec.HTTPStatus,
		Signal:          rec.Signal,
		IsError:         rec.IsError,
		StdoutBytes:     rec.Output.StdoutBytes,
		StderrBytes:     rec.Output.StderrBytes,
		OutputSHA256:    rec.Output.StdoutSHA256,
		AcceptedAt:      rec.CreatedAt,
		Evidence:        rec.Evidence,
		PreviousAttempt: rec.PreviousAttempt,
		ReviewRequired:  rec.ReviewRequired,
		FleetRun:        rec.FleetRun,
	}
	if rec.ExitCode != nil {
		code := *rec.ExitCode
		x.ExitCode = &code
	}
	if t, ok := rec.StateTimes[markers.Dispatched]; ok {
		x.DispatchedAt = &t
	}
	if t := intent.FinishedAt(rec); !t.IsZero() {
		x.FinishedAt = &t
	}
	holder := v.ownHolder(rec)
	switch rec.State {
	case markers.Failed, markers.Unknown, markers.Rejected:
		x.Cause = cause(rec, holder)
	case markers.AwaitingApproval:
		x.Cause = approvalCause(rec)
	}
	x.Next = nextStep(rec, holder)
	if rec.State == markers.Authorized && v.drivers.queued(rec.ID) {
		x.Queued = true
		x.Next = fmt.Sprintf("Authorized and queued: its actor is at its max_concurrent limit, and it is dispatched when one of the actor's executions ends. Wait with execution_status {execution_id: %q}; do not call ssh_exec again for this.", rec.ID)
	}
	return x
}

// ownHolder returns the execution the host named as holding rec's operation key when it
// refused rec, if it is rec's actor's own: an agent never learns another actor's execution
// ids (the bastion reaches every host with one SSH identity, so the host names it to us).
func (v *views) ownHolder(rec *markers.Record) *markers.Record {
	if rec.OperationTakenBy == "" {
		return nil
	}
	h, err := v.journal.Get(rec.OperationTakenBy)
	if err != nil || h.Actor != rec.Actor {
		return nil
	}
	return h
}

// stored returns a finished (or not live) execution's view with its stored output.
func (v *views) stored(rec *markers.Record) *api.Execution {
	x := v.view(rec)
	if rec.IsFleetRun() {
		return x // a run keeps no output: its hosts do
	}
	raw, err := v.journal.Result(rec.ID)
	if err != nil {
		return x
	}
	if rec.Channel == "http" {
		var r storedResponse
		if json.Unmarshal(raw, &r) == nil {
			x.HTTPStatus, x.ResponseHeader, x.ResponseBody = r.Status, r.Header, string(r.Body)
			x.ResponseBytes, x.ResponseTruncated, x.IdempotentReplayed = r.BodyBytes, r.BodyTruncated, r.IdempotentReplayed
		}
		return x
	}
	var r storedResult
	if json.Unmarshal(raw, &r) == nil {
		x.Stdout, x.StdoutOffset = string(r.Stdout), r.StdoutOffset
		x.Stderr, x.StderrOffset = string(r.Stderr), r.StderrOffset
	}
	return x
}

// await waits up to wait for the driver to end (or the caller to go away) and returns the
// execution as it stands: finished, or still running with its output so far — never a
// timeout error. progress, if set, hears about the execution every progressEvery.
func (v *views) await(ctx context.Context, d *driver, wait time.Duration, joined bool, progress func(*api.Execution)) *api.Execution {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var tick <-chan time.Time
	if progress != nil {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		tick = t.C
	}
wait:
	for {
		select {
		case <-d.done:
			break wait
		case <-timer.C:
			break wait
		case <-ctx.Done():
			break wait
		case <-tick:
			progress(v.live(d))
		}
	}
	x := v.live(d)
	x.Replayed = joined
	return x
}

// own returns execution id if caller may see it: actors see only their own executions and
// those of their principal's other actors (one of which a shared idempotency_key may hand
// them).
func (v *views) own(c transport.Caller, id string) (*markers.Record, error) {
	notFound := &api.ToolError{Code: api.CodeNotFound, Message: "no execution " + id + " of yours"}
	if !markers.ValidJournalID(id) {
		return nil, notFound
	}
	rec, err := v.journal.Get(id)
	if errors.Is(err, markers.ErrNotFound) {
		return nil, notFound
	}
	if err != nil {
		return nil, journalError(err)
	}
	if rec.Actor != c.Actor && (rec.Principal == "" || rec.Principal != v.principalOf(c)) {
		return nil, notFound
	}
	return rec, nil
}

// output is Output for a record the caller may read.
func (v *views) output(ctx context.Context, rec *markers.Record, a api.OutputArgs) (*api.Execution, error) {
	if a.StdoutOffset < 0 || a.StderrOffset < 0 {
		return nil, api.Invalid("offsets must not be negative")
	}
	if maxWait := v.current().cfg.MaxWait; a.WaitS != nil && (*a.WaitS < 0 || time.Duration(*a.WaitS)*time.Second > maxWait) {
		return nil, api.Invalid("wait_s must be in 0..%d", int(maxWait/time.Second))
	}
	wait := v.waitFor(a.WaitS)
	if rec.IsFleetRun() {
		return v.fleetOutput(ctx, rec, wait), nil
	}
	d := v.drivers.live(a.ExecutionID)
	if d == nil && !markers.JournalGraph.Terminal(rec.State) && rec.State != markers.AwaitingApproval && rec.State != markers.Rejected {
		d = v.drivers.start(rec) // attach: reconcile with the host and follow it
	}
	if d != nil {
		deadline := time.NewTimer(wait)
		defer deadline.Stop()
		for d.stdout.size() <= a.StdoutOffset && d.stderr.size() <= a.StderrOffset {
			select {
			case <-d.changes():
				continue
			case <-d.done:
			case <-deadline.C:
			case <-ctx.Done():
			}
			break
		}
		if !markers.JournalGraph.Terminal(d.record().State) {
			x := v.view(d.record())
			limit := v.cfg.OutputTailBytes
			out, outFrom := d.stdout.read(a.StdoutOffset, limit)
			errb, errFrom := d.stderr.read(a.StderrOffset, limit)
			x.Stdout, x.StdoutOffset, x.StdoutBytes = string(out), outFrom, d.stdout.size()
			x.Stderr, x.StderrOffset, x.StderrBytes = string(errb), errFrom, d.stderr.size()
			return x, nil
		}
		rec = d.record()
	}
	return v.storedFrom(ctx, rec, a.StdoutOffset, a.StderrOffset), nil
}

// storedFrom returns a finished execution's output from the given offsets: from the stored
// tail when it covers them, else from the host's spool.
func (v *views) storedFrom(ctx context.Context, rec *markers.Record, outOff, errOff int64) *api.Execution {
	x := v.stored(rec)
	limit := v.cfg.OutputTailBytes
	window := func(s string, from, off int64) (string, int64) {
		if off < from {
			return s, from
		}
		skip := min(off-from, int64(len(s)))
		s = s[skip:]
		return s[:min(len(s), limit)], from + skip
	}
	if outOff < x.StdoutOffset || errOff < x.StderrOffset {
		if out, errb, ok := v.hosts.spool(ctx, rec, outOff, errOff, limit); ok {
			x.Stdout, x.StdoutOffset, x.Stderr, x.StderrOffset = out, outOff, errb, errOff
			return x
		}
	}
	x.Stdout, x.StdoutOffset = window(x.Stdout, x.StdoutOffset, outOff)
	x.Stderr, x.StderrOffset = window(x.Stderr, x.StderrOffset, errOff)
	return x
}

// stateOf is rec's state without its output.
func (v *views) stateOf(rec *markers.Record) *api.ExecutionState {
	return &api.ExecutionState{
		ExecutionID: rec.ID, State: string(rec.State), IsError: rec.IsError, ReviewRequired: rec.ReviewRequired,
		Queued:     rec.State == markers.Authorized && v.drivers.queued(rec.ID),
		AcceptedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt,
		Retention: v.current().classes.Get(rec.Class).Retention,
	}
}

func (v *views) waitFor(waitS *int) time.Duration {
	if waitS == nil {
		return v.current().cfg.DefaultWait
	}
	return time.Duration(*waitS) * time.Second
}

// live returns a driven execution's view with the last output it holds.
func (v *views) live(d *driver) *api.Execution {
	rec := d.record()
	if markers.JournalGraph.Terminal(rec.State) || rec.IsFleetRun() {
		return v.stored(rec)
	}
	x := v.view(rec)
	out, outFrom := d.stdout.last(v.cfg.OutputTailBytes)
	errb, errFrom := d.stderr.last(v.cfg.OutputTailBytes)
	x.Stdout, x.StdoutOffset, x.StdoutBytes = string(out), outFrom, d.stdout.size()
	x.Stderr, x.StderrOffset, x.StderrBytes = string(errb), errFrom, d.stderr.size()
	return x
}

// maxCauseBytes bounds the cause line of a result.
const maxCauseBytes = 512

// cause is why a failed or unknown execution is so: an operation key held by another
// execution (named only if holder, the caller's own, is given), else the latest evidence,
// its first line.
func cause(rec *markers.Record, holder *markers.Record) string {
	switch {
	case rec.OperationTakenBy != "" && holder != nil:
		return fmt.Sprintf("operation key %s already ran as %s (%s); the host did not start this execution", rec.OperationKey, holder.ID, holder.State)
	case rec.OperationTakenBy != "":
		return fmt.Sprintf("operation key %s is taken by another execution on %s; the host did not start this one", rec.OperationKey, rec.Host)
	case len(rec.Evidence) == 0:
		return "no reason was recorded"
	}
	line, _, _ := strings.Cut(rec.Evidence[len(rec.Evidence)-1], "\n")
	if len(line) > maxCauseBytes {
		line = strings.ToValidUTF8(line[:maxCauseBytes], "") + "…"
	}
	return line
}

// approvalCause is why an execution awaits approval: the refusal journaled when policy held
// it (policyRefusal), whatever was journaled since (an offer to the user).
func approvalCause(rec *markers.Record) string {
	for _, e := range slices.Backward(rec.Evidence) {
		if strings.HasPrefix(e, codeApprovalRequired+": ") {
			return e
		}
	}
	return "policy requires a person's approval before this runs"
}

// nextStep tells the agent what is safe to do, by state. holder is the execution that holds
// rec's operation key, if the host refused rec for it and it is the caller's own.
func nextStep(rec *markers.Record, holder *markers.Record) string {
	switch rec.State {
	case markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running:
		return fmt.Sprintf("Still in progress. Wait with execution_output {execution_id: %q} or execution_status; do not call ssh_exec again for this — a retry joins this execution anyway.", rec.ID)
	case markers.Unknown:
		if rec.ReviewRequired {
			return fmt.Sprintf("The outcome is NOT known, and Postern will not send it again: an operator must review it (postern review %s). Do not run it as a new request unless you have verified it did not take effect; the evidence says why it is unresolved.", rec.ID)
		}
		if rec.Channel == "http" {
			return fmt.Sprintf("The outcome is NOT known: the request may or may not have taken effect at %s. What Postern does depends on the endpoint's class (%s): read_only and idempotent_write are sent again with the same Idempotency-Key, conditional_write is checked first, irreversible is never re-sent and needs an operator's review. Check execution_status {execution_id: %q}; do not send it as a new request unless you verified it did not take effect.", rec.Host, rec.Class, rec.ID)
		}
		return fmt.Sprintf("The outcome is NOT known: the command may or may not have run. Postern keeps asking the host; check execution_status {execution_id: %q} later. Do not re-run it as a new command unless you have verified on the host that it did not take effect.", rec.ID)
	case markers.Completed:
		return "Finished; the outcome above is final."
	case markers.Failed:
		switch {
		case rec.OperationTakenBy != "" && holder != nil:
			return fmt.Sprintf("The operation already ran as %s: do not run it again (the host refuses operation key %s to every other execution). Read its outcome with execution_status {execution_id: %q}.", holder.ID, rec.OperationKey, holder.ID)
		case rec.OperationTakenBy != "":
			return fmt.Sprintf("Do not retry: the host refuses operation key %s to every execution but the one holding it. If the operation must run again, ask an operator.", rec.OperationKey)
		case rec.StartError != "":
			return fmt.Sprintf("It did not run: %s on host %s. It is safe to fix that and call again (with the same idempotency_key, a new attempt linked to this one).", rec.StartError, rec.Host)
		case rec.IdempotencyKey != "":
			return "Nothing ran: it provably did not take effect. Fix the cause, then call again — the same idempotency_key with the same request starts a new attempt linked to this one (previous_attempt); another request needs a new key."
		}
		return "Nothing ran: it provably did not take effect. Fix the cause, then call again."
	case markers.Cancelled:
		return "Cancelled; see the output for how far it got."
	case markers.TimedOut:
		return "Killed at its timeout; see the output for how far it got."
	case markers.Rejected:
		return "Rejected; it was not run, and a retry of this same call returns this same rejection. Change the call as the cause says: another command or request is a new call."
	case markers.AwaitingApproval:
		return fmt.Sprintf("Not run yet: it waits for a person's approval (an operator's, or your user's if your client asks them). Wait with execution_status {execution_id: %q}; calling again returns this same pending execution and never asks twice.", rec.ID)
	}
	return ""
}
