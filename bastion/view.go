package bastion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// Execution is what every execution tool returns: the journal's record of one execution,
// its output (or a window of it), and what the caller may do next.
type Execution struct {
	ExecutionID string `json:"execution_id"`
	// State is the journal state; a completed execution whose result was never delivered
	// shows as completed with result_delivered false.
	State           string `json:"state"`
	ResultDelivered bool   `json:"result_delivered"`
	// Replayed: this call did not dispatch anything; it joined or replayed an execution
	// that already existed (a retry, a duplicate, an idempotency key).
	Replayed bool   `json:"replayed"`
	Host     string `json:"host,omitempty"`
	Command  string `json:"command,omitempty"`
	Class    string `json:"class,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	IsError  bool   `json:"is_error"`
	// Stdout and Stderr are the returned window of each stream; *Offset is the stream offset
	// of its first byte and *Bytes the stream's total size so far. Pass stdout_offset +
	// len(stdout) to execution_output to read on.
	Stdout       string `json:"stdout"`
	StdoutOffset int64  `json:"stdout_offset"`
	StdoutBytes  int64  `json:"stdout_bytes"`
	Stderr       string `json:"stderr"`
	StderrOffset int64  `json:"stderr_offset"`
	StderrBytes  int64  `json:"stderr_bytes"`
	// OutputSHA256 is the host's digest of the whole stdout, when the execution ended.
	OutputSHA256 string `json:"stdout_sha256,omitempty"`
	// HTTP executions: the response (status, kept headers, body up to the endpoint's cap).
	HTTPStatus         int                 `json:"http_status,omitempty"`
	ResponseHeader     map[string][]string `json:"response_headers,omitempty"`
	ResponseBody       string              `json:"response_body,omitempty"`
	ResponseBytes      int64               `json:"response_bytes,omitempty"`
	ResponseTruncated  bool                `json:"response_truncated,omitempty"`
	IdempotentReplayed bool                `json:"idempotent_replayed,omitempty"`
	AcceptedAt         time.Time           `json:"accepted_at"`
	DispatchedAt       *time.Time          `json:"dispatched_at,omitempty"`
	// FinishedAt is when the outcome was observed (the execution's terminal state was
	// journaled), not when its record last changed.
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Evidence   []string   `json:"evidence,omitempty"`
	// Cause says why a failed or unknown execution is so (its latest evidence, one line).
	Cause string `json:"cause,omitempty"`
	// PreviousAttempt is the failed execution this one retries: a call with the same
	// idempotency_key and the same request after that one provably did not take effect.
	PreviousAttempt string `json:"previous_attempt,omitempty"`
	// ReviewRequired: the outcome is unknown and Postern will neither ask nor send again;
	// only an operator's review (`postern review`) settles it.
	ReviewRequired bool `json:"review_required,omitempty"`
	// Queued: authorized, and waiting for its actor's max_concurrent slot before dispatch.
	Queued bool `json:"queued,omitempty"`
	// Next says what is safe to do now.
	Next string `json:"next"`
}

// Summary is the text form of a result (the MCP text content): what happened, why (for a
// failed or unknown execution), what to do next, then the output.
func (x *Execution) Summary() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s on %s: %s", x.ExecutionID, x.Host, x.State)
	if x.ExitCode != nil {
		fmt.Fprintf(&sb, " (exit %d)", *x.ExitCode)
	}
	if x.Signal != "" {
		fmt.Fprintf(&sb, " (%s)", x.Signal)
	}
	if x.HTTPStatus != 0 {
		fmt.Fprintf(&sb, " (HTTP %d)", x.HTTPStatus)
	}
	if x.ReviewRequired {
		sb.WriteString(" [review required]")
	}
	if x.Replayed {
		sb.WriteString(" [replayed: no new dispatch]")
	}
	sb.WriteString(".")
	if x.PreviousAttempt != "" {
		fmt.Fprintf(&sb, " New attempt after %s, which failed without effect.", x.PreviousAttempt)
	}
	if x.Cause != "" {
		fmt.Fprintf(&sb, "\nCause: %s", x.Cause)
	}
	sb.WriteString("\nNext: ")
	sb.WriteString(x.Next)
	if x.Stdout != "" {
		fmt.Fprintf(&sb, "\n--- stdout (from byte %d of %d) ---\n%s", x.StdoutOffset, x.StdoutBytes, x.Stdout)
	}
	if x.Stderr != "" {
		fmt.Fprintf(&sb, "\n--- stderr (from byte %d of %d) ---\n%s", x.StderrOffset, x.StderrBytes, x.Stderr)
	}
	if x.ResponseBody != "" {
		truncated := ""
		if x.ResponseTruncated {
			truncated = fmt.Sprintf(", truncated from %d bytes", x.ResponseBytes)
		}
		fmt.Fprintf(&sb, "\n--- response body%s ---\n%s", truncated, x.ResponseBody)
	}
	return sb.String()
}

// callFailed reports whether a call that started (or joined) this execution failed: the
// command or request failed (non-zero exit, signal, HTTP error status), was refused, did not
// take effect, was killed at its timeout or cancelled, or its outcome cannot be proven. A
// running or pending execution has not failed.
func (x *Execution) callFailed() bool {
	switch markers.State(x.State) {
	case markers.Failed, markers.Rejected, markers.Unknown, markers.TimedOut, markers.Cancelled:
		return true
	}
	return x.IsError
}

// view builds the result from a record, without output.
func (b *Bastion) view(rec *markers.Record) *Execution {
	x := &Execution{
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
	if t := finishedAt(rec); !t.IsZero() {
		x.FinishedAt = &t
	}
	holder := b.ownHolder(rec)
	if rec.State == markers.Failed || rec.State == markers.Unknown {
		x.Cause = cause(rec, holder)
	}
	x.Next = nextStep(rec, holder)
	if rec.State == markers.Authorized && b.isQueued(rec.ID) {
		x.Queued = true
		x.Next = fmt.Sprintf("Authorized and queued: its actor is at its max_concurrent limit, and it is dispatched when one of the actor's executions ends. Wait with execution_status {execution_id: %q}; do not call ssh_exec again for this.", rec.ID)
	}
	return x
}

// ownHolder returns the execution the host named as holding rec's operation key when it
// refused rec, if it is rec's actor's own: an agent never learns another actor's execution
// ids (the bastion reaches every host with one SSH identity, so the host names it to us).
func (b *Bastion) ownHolder(rec *markers.Record) *markers.Record {
	if rec.OperationTakenBy == "" {
		return nil
	}
	h, err := b.journal.Get(rec.OperationTakenBy)
	if err != nil || h.Actor != rec.Actor {
		return nil
	}
	return h
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
		return "Rejected; it was not run. A retry returns this same rejection."
	case markers.AwaitingApproval:
		return "Waiting for an operator's approval; wait with execution_status."
	}
	return ""
}

// stored returns a finished (or not live) execution's view with its stored output.
func (b *Bastion) stored(rec *markers.Record) *Execution {
	x := b.view(rec)
	raw, err := b.journal.Result(rec.ID)
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

// live returns a driven execution's view with the last output it holds.
func (b *Bastion) live(d *driver) *Execution {
	rec := d.record()
	if markers.JournalGraph.Terminal(rec.State) {
		return b.stored(rec)
	}
	x := b.view(rec)
	out, outFrom := d.stdout.last(b.cfg.OutputTailBytes)
	errb, errFrom := d.stderr.last(b.cfg.OutputTailBytes)
	x.Stdout, x.StdoutOffset, x.StdoutBytes = string(out), outFrom, d.stdout.size()
	x.Stderr, x.StderrOffset, x.StderrBytes = string(errb), errFrom, d.stderr.size()
	return x
}

// progressEvery is how often a waiting call reports progress.
const progressEvery = time.Second

// await waits up to wait for the driver to end (or the caller to go away) and returns the
// execution as it stands: finished, or still running with its output so far — never a
// timeout error. progress, if set, hears about the execution every progressEvery.
func (b *Bastion) await(ctx context.Context, d *driver, wait time.Duration, joined bool, progress func(*Execution)) *Execution {
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
			progress(b.live(d))
		}
	}
	x := b.live(d)
	x.Replayed = joined
	return x
}

// deliveredNote is the note of the update event that records a delivery.
const deliveredNote = "result delivered"

// Delivered records that the result of execution id reached the caller's transport, so a
// later identical call is a new intent. Only completed executions are marked.
//
// The update event names the call that was handed the result, when ctx carries it (the
// transport's caller and the request's JSON-RPC id).
//
// The mark is written without an fsync (markers.NoSync), off the critical path: losing it is
// harmless. A crash that loses it leaves the execution completed with its result not
// delivered, so a retry replays the stored result — never a second dispatch, and what the
// design prescribes whenever delivery is in doubt. Anything that acts on the mark (a new
// execution of the same intent, once it no longer matches) is itself a synced write, and the
// journal's log is synced in order, so the mark is durable before that write is. Its
// revocation (RevokeDelivery) stays synced: losing that would turn a retry into a new intent.
func (b *Bastion) Delivered(ctx context.Context, id string) error {
	var call *markers.Call
	if c, ok := transport.CallerFromContext(ctx); ok {
		call = &markers.Call{Transport: transportOf(c), RequestID: requestIDFrom(ctx), Match: "delivered"}
		if c.Local {
			call.Run = c.Scope
		} else if c.RunID != "" {
			call.Run = "run:" + c.RunID
		}
	}
	_, err := b.journal.UpdateFor(context.WithoutCancel(ctx), id, deliveredNote, call, markers.NoSync, func(r *markers.Record) error {
		if r.ResultDeliveredAt == nil && markers.JournalGraph.Terminal(r.State) {
			t := b.now().UTC()
			r.ResultDeliveredAt = &t
		}
		return nil
	})
	return err
}

// own returns execution id if caller may see it: actors see only their own executions.
func (b *Bastion) own(c transport.Caller, id string) (*markers.Record, error) {
	notFound := &ToolError{Code: CodeNotFound, Message: "no execution " + id + " of yours"}
	if !markers.ValidExecutionID(id) {
		return nil, notFound
	}
	rec, err := b.journal.Get(id)
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

// Status returns an execution's record and last output. For one whose outcome is unknown it
// asks the host again first (waiting up to wait).
func (b *Bastion) Status(ctx context.Context, c transport.Caller, id string, wait time.Duration) (*Execution, error) {
	rec, err := b.own(c, id)
	if err != nil {
		return nil, err
	}
	if d := b.liveDriver(id); d != nil {
		return b.await(ctx, d, 0, false, nil), nil
	}
	if rec.State == markers.Unknown {
		if d := b.startDriver(rec); d != nil {
			return b.await(ctx, d, wait, false, nil), nil
		}
	}
	return b.stored(rec), nil
}

// OutputArgs are the arguments of execution_output.
type OutputArgs struct {
	ExecutionID  string `json:"execution_id"`
	Offset       int64  `json:"offset,omitempty" jsonschema:"stdout offset to read from (default 0)"`
	StderrOffset int64  `json:"stderr_offset,omitempty" jsonschema:"stderr offset to read from (default 0)"`
	WaitS        *int   `json:"wait_s,omitempty" jsonschema:"wait up to this many seconds for new output or the end (default 30)"`
}

// Output returns output from the given offsets, waiting up to wait_s for more output or the
// end when there is nothing new yet. Output older than what the bastion keeps is read from
// the host's spool.
func (b *Bastion) Output(ctx context.Context, c transport.Caller, a OutputArgs) (*Execution, error) {
	rec, err := b.own(c, a.ExecutionID)
	if err != nil {
		return nil, err
	}
	return b.output(ctx, rec, a)
}

// output is Output for a record the caller may read.
func (b *Bastion) output(ctx context.Context, rec *markers.Record, a OutputArgs) (*Execution, error) {
	if a.Offset < 0 || a.StderrOffset < 0 {
		return nil, invalid("offsets must not be negative")
	}
	if a.WaitS != nil && (*a.WaitS < 0 || time.Duration(*a.WaitS)*time.Second > b.cfg.MaxWait) {
		return nil, invalid("wait_s must be in 0..%d", int(b.cfg.MaxWait/time.Second))
	}
	wait := b.waitFor(a.WaitS)
	d := b.liveDriver(a.ExecutionID)
	if d == nil && !markers.JournalGraph.Terminal(rec.State) && rec.State != markers.AwaitingApproval && rec.State != markers.Rejected {
		d = b.startDriver(rec) // attach: reconcile with the host and follow it
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
			x := b.view(d.record())
			limit := b.cfg.OutputTailBytes
			out, outFrom := d.stdout.read(a.Offset, limit)
			errb, errFrom := d.stderr.read(a.StderrOffset, limit)
			x.Stdout, x.StdoutOffset, x.StdoutBytes = string(out), outFrom, d.stdout.size()
			x.Stderr, x.StderrOffset, x.StderrBytes = string(errb), errFrom, d.stderr.size()
			return x, nil
		}
		rec = d.record()
	}
	return b.storedFrom(ctx, rec, a.Offset, a.StderrOffset), nil
}

// storedFrom returns a finished execution's output from the given offsets: from the stored
// tail when it covers them, else from the host's spool.
func (b *Bastion) storedFrom(ctx context.Context, rec *markers.Record, outOff, errOff int64) *Execution {
	x := b.stored(rec)
	limit := b.cfg.OutputTailBytes
	window := func(s string, from, off int64) (string, int64) {
		if off < from {
			return s, from
		}
		skip := min(off-from, int64(len(s)))
		s = s[skip:]
		return s[:min(len(s), limit)], from + skip
	}
	if outOff < x.StdoutOffset || errOff < x.StderrOffset {
		if out, errb, ok := b.fromSpool(ctx, rec, outOff, errOff, limit); ok {
			x.Stdout, x.StdoutOffset, x.Stderr, x.StderrOffset = out, outOff, errb, errOff
			return x
		}
	}
	x.Stdout, x.StdoutOffset = window(x.Stdout, x.StdoutOffset, outOff)
	x.Stderr, x.StderrOffset = window(x.Stderr, x.StderrOffset, errOff)
	return x
}

// fromSpool reads output older than the stored tail from the host (its spool keeps the
// whole capped output until the marker's retention).
func (b *Bastion) fromSpool(ctx context.Context, rec *markers.Record, outOff, errOff int64, limit int) (string, string, bool) {
	host, err := b.inv.Host(rec.Host)
	if err != nil || host.Level() != GuaranteeHostagent {
		return "", "", false // only the hostagent spools output
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := b.pool.Conn(ctx, host)
	if err != nil {
		return "", "", false
	}
	cc, err := hostproto.DialControl(conn)
	if err != nil {
		return "", "", false
	}
	defer cc.Close()
	var out, errb []byte
	errEnough := errors.New("enough output")
	_, err = cc.Attach(ctx, rec.ID, outOff, errOff, func(stream string, _ int64, data []byte) error {
		switch stream {
		case "stdout":
			out = append(out, data[:min(len(data), limit-len(out))]...)
		case "stderr":
			errb = append(errb, data[:min(len(data), limit-len(errb))]...)
		}
		if len(out) >= limit && len(errb) >= limit {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return "", "", false
	}
	return string(out), string(errb), true
}
