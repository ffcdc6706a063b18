package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	if rec.State == markers.Failed || rec.State == markers.Unknown {
		x.Cause = cause(rec, holder)
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

// own returns execution id if caller may see it: actors see only their own executions.
func (v *views) own(c transport.Caller, id string) (*markers.Record, error) {
	notFound := &api.ToolError{Code: api.CodeNotFound, Message: "no execution " + id + " of yours"}
	if !markers.ValidExecutionID(id) {
		return nil, notFound
	}
	rec, err := v.journal.Get(id)
	if errors.Is(err, markers.ErrNotFound) {
		return nil, notFound
	}
	if err != nil {
		return nil, journalError(err)
	}
	if rec.Actor != c.Actor {
		return nil, notFound
	}
	return rec, nil
}

// output is Output for a record the caller may read.
func (v *views) output(ctx context.Context, rec *markers.Record, a api.OutputArgs) (*api.Execution, error) {
	if a.Offset < 0 || a.StderrOffset < 0 {
		return nil, api.Invalid("offsets must not be negative")
	}
	if a.WaitS != nil && (*a.WaitS < 0 || time.Duration(*a.WaitS)*time.Second > v.cfg.MaxWait) {
		return nil, api.Invalid("wait_s must be in 0..%d", int(v.cfg.MaxWait/time.Second))
	}
	wait := v.waitFor(a.WaitS)
	d := v.drivers.live(a.ExecutionID)
	if d == nil && !markers.JournalGraph.Terminal(rec.State) && rec.State != markers.AwaitingApproval && rec.State != markers.Rejected {
		d = v.drivers.start(rec) // attach: reconcile with the host and follow it
	}
	if d != nil {
		deadline := time.NewTimer(wait)
		defer deadline.Stop()
		for d.stdout.size() <= a.Offset && d.stderr.size() <= a.StderrOffset {
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
			out, outFrom := d.stdout.read(a.Offset, limit)
			errb, errFrom := d.stderr.read(a.StderrOffset, limit)
			x.Stdout, x.StdoutOffset, x.StdoutBytes = string(out), outFrom, d.stdout.size()
			x.Stderr, x.StderrOffset, x.StderrBytes = string(errb), errFrom, d.stderr.size()
			return x, nil
		}
		rec = d.record()
	}
	return v.storedFrom(ctx, rec, a.Offset, a.StderrOffset), nil
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
		Retention: v.classes.Get(rec.Class).Retention,
	}
}

func (v *views) waitFor(waitS *int) time.Duration {
	if waitS == nil {
		return v.cfg.DefaultWait
	}
	return time.Duration(*waitS) * time.Second
}

// live returns a driven execution's view with the last output it holds.
func (v *views) live(d *driver) *api.Execution {
	rec := d.record()
	if markers.JournalGraph.Terminal(rec.State) {
		return v.stored(rec)
	}
	x := v.view(rec)
	out, outFrom := d.stdout.last(v.cfg.OutputTailBytes)
	errb, errFrom := d.stderr.last(v.cfg.OutputTailBytes)
	x.Stdout, x.StdoutOffset, x.StdoutBytes = string(out), outFrom, d.stdout.size()
	x.Stderr, x.StderrOffset, x.StderrBytes = string(errb), errFrom, d.stderr.size()
	return x
}
