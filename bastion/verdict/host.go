// Package verdict decides what a target's answer means for the journal: a host's marker or
// exec outcome (host.go), a stock sshd's answer by guarantee level (agentless.go), an HTTP
// execution's unknown outcome by its class (unknown.go), and whether an operator may review
// one (review.go). Every decision is a pure function, tested from the tables in
// testdata/decisions that mirror docs/design.md; the engine's drivers carry them out.
//
// Invariant: no verdict moves the journal along an edge its graph lacks (JournalPath), and
// "did not run" (failed) is decided only on the host's proof.
package verdict

import (
	"errors"
	"fmt"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// What a host's answer means for the journal, as pure functions the SSH driver carries out
// (tested from testdata/outcomes and testdata/reconcile):
//
//	hostOutcomes   host marker state → journal state: the one table both read
//	ExecVerdict    how one exec ended (markers, exit status, transport error) → Verdict
//	ReconcileOn    the host's status answer (marker or none, its retention) → action
//	JournalPath    the legal way from the driver's journal state to a Verdict's state

// Verdict is what the journal concludes from a host's answer.
type Verdict struct {
	// To is the journal state the execution moves to (its current state: evidence only).
	To markers.State
	// Note is the evidence written with it.
	Note string
	// Review: the outcome is unknown and only an operator can settle it.
	Review bool
	// Again: the outcome is unknown because the answer was lost, not because the host said
	// so; asking the host again may settle it.
	Again bool
	// Outcome is the host marker whose outcome (exit code, signal, output, checkpoints) the
	// record takes (copyOutcome); nil if none.
	Outcome *hostproto.Marker
	// StartError is why the command provably did not start, if that is the verdict.
	StartError string
	// TakenBy is the execution holding the operation key the host refused this one for. It
	// goes to the record for operators, never into the evidence: the holder may be another
	// actor's.
	TakenBy string
}

// hostOutcome is what one host marker state means for the journal.
type hostOutcome struct {
	to     markers.State
	review bool
	// live: the command is starting or running; the driver attaches to it.
	live bool
}

// hostOutcomes maps every host marker state to the journal (docs/design.md, "Marker lifecycle (host)":
// marker lifecycle). A marker absent altogether is not here: what that proves depends on the
// execution's age (ReconcileOn).
var hostOutcomes = map[hostproto.MarkerState]hostOutcome{
	hostproto.MarkerStarted:     {to: markers.Running, live: true},
	hostproto.MarkerRunning:     {to: markers.Running, live: true},
	hostproto.MarkerExited:      {to: markers.Completed},
	hostproto.MarkerTimedOut:    {to: markers.TimedOut},
	hostproto.MarkerCancelled:   {to: markers.Cancelled},
	hostproto.MarkerStartFailed: {to: markers.Failed},
	hostproto.MarkerNotStarted:  {to: markers.Failed},
	hostproto.MarkerInterrupted: {to: markers.Unknown, review: true},
}

// MarkerVerdict is the journal's verdict on a host marker for the execution.
func MarkerVerdict(host string, m *hostproto.Marker) Verdict {
	o, ok := hostOutcomes[m.State]
	if !ok {
		return Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"host %s answered with a marker in state %q, which this bastion does not know; it is not sent again — review required", host, m.State)}
	}
	v := Verdict{To: o.to, Review: o.review}
	switch m.State {
	case hostproto.MarkerStarted, hostproto.MarkerRunning:
		v.Note = fmt.Sprintf("host marker on %s is %s: attaching", host, m.State)
	case hostproto.MarkerExited:
		v.Note, v.Outcome = OutcomeNote(m), m
	case hostproto.MarkerTimedOut:
		v.Note, v.Outcome = "the host killed it at its timeout", m
	case hostproto.MarkerCancelled:
		v.Note, v.Outcome = "cancelled on the host", m
	case hostproto.MarkerStartFailed:
		cause := m.StartError
		if cause == "" {
			cause = LastEvidence(m.Evidence)
		}
		v.StartError = cause
		v.Note = fmt.Sprintf("%s on host %s; the command did not run", cause, host)
	case hostproto.MarkerNotStarted:
		v.Note = fmt.Sprintf("host %s could not start it, the command did not run: %s", host, LastEvidence(m.Evidence))
	case hostproto.MarkerInterrupted:
		v.Note = fmt.Sprintf("host marker on %s is interrupted: the command started and its process vanished without an exit record; it is not run again — review required", host)
	}
	return v
}

// ExecAnswer is how one exec of the execution ended, as the SSH client saw it.
type ExecAnswer struct {
	// Err is the transport's error; hostproto.ErrRefused means the host refused the request
	// before anything ran.
	Err error
	// First and Final are the host's markers: at the start (or the one it found) and just
	// before the exit status.
	First, Final *hostproto.Marker
	ExitStatus   int
	ExitSignal   string
	// Stderr is the last line of the command's stderr (the host's reason when it refused).
	Stderr string
}

// ExecVerdict is the journal's verdict on one exec of execution id on host.
func ExecVerdict(id, host string, a ExecAnswer) Verdict {
	switch {
	case a.First != nil && a.First.ID != id:
		return Verdict{To: markers.Failed, TakenBy: a.First.ID, Note: fmt.Sprintf("operation key %s is taken by another execution on host %s; this execution was not started", a.First.OperationKey, host)}
	case a.Final != nil && a.Final.ID == id:
		// The host's final marker is its outcome, even if the exit status was lost after it.
		if hostOutcomes[a.Final.State].live {
			return Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf("host %s ended the exec with its marker still %s; asking the host again", host, a.Final.State)}
		}
		return MarkerVerdict(host, a.Final)
	case a.Err != nil && errors.Is(a.Err, hostproto.ErrRefused) && a.First == nil:
		return Verdict{To: markers.Failed, Note: fmt.Sprintf("host %s refused the request, nothing was started: %v", host, a.Err)}
	case a.Err != nil && a.First == nil:
		return Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf("connection to %s failed before the host confirmed the start (%v); asking the host", host, a.Err)}
	case a.Err != nil:
		return Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf("connection to %s lost after dispatch (%v); asking the host", host, a.Err)}
	case a.First == nil && a.ExitStatus == hostproto.ExitOperationTaken:
		// The key is held by an execution of another identity on the host: no marker, no id.
		return Verdict{To: markers.Failed, Note: fmt.Sprintf("operation key is taken by another execution on host %s; this execution was not started", host)}
	case a.First == nil && a.ExitStatus == hostproto.ExitRefused:
		return Verdict{To: markers.Failed, Note: fmt.Sprintf("host %s refused the command before writing a marker, nothing was started: %s", host, a.Stderr)}
	case a.First != nil && (a.First.State == hostproto.MarkerInterrupted || a.ExitStatus == hostproto.ExitUnknownOutcome):
		return MarkerVerdict(host, &hostproto.Marker{State: hostproto.MarkerInterrupted})
	}
	// An exit status without a final marker (a hostagent that sends none).
	code := a.ExitStatus
	m := &hostproto.Marker{State: hostproto.MarkerExited, ExitCode: &code, Signal: a.ExitSignal}
	if a.ExitSignal != "" {
		m.ExitCode = nil
	}
	v := MarkerVerdict(host, m)
	v.Note += " (the host sent no final marker)"
	return v
}

// Do is what a driver does after asking the host about an execution in flight.
type Do string

const (
	// Redispatch: send the execution again under its id; the host has no marker, so it
	// never started.
	Redispatch Do = "redispatch"
	// Attach: exec under the same id; the host attaches to the running command or replays
	// the finished one, and the outcome follows.
	Attach Do = "attach"
	// Settle: journal the verdict; nothing is sent.
	Settle Do = "settle"
)

// Action is ReconcileOn's decision.
type Action struct {
	Do      Do
	Verdict Verdict
}

// horizonMargin is taken off a host's marker retention before "no marker" counts as "never
// started": it covers clock skew between the bastion and the host.
const horizonMargin = 10 * time.Minute

// HostStatus is a host's answer to a status request about one execution.
type HostStatus struct {
	// Marker is the host's marker; nil when it has none.
	Marker *hostproto.Marker
	// Retention is how long the host keeps finished markers; 0 when it did not say.
	Retention time.Duration
}

// ReconcileOn decides what to do with an SSH execution in flight (dispatched, running or
// unknown) from its host's status answer (docs/design.md, "Action classes", remote_command: check
// the host marker; absent → re-dispatch the same execution id; present → attach; else stop for
// review). A missing marker proves "never started" only while the host still keeps markers of
// the execution's age: older executions are never re-dispatched. cancel: an operator or agent
// asked to cancel it, so one that never started is cancelled instead of sent again.
func ReconcileOn(rec *markers.Record, now time.Time, host string, st HostStatus, cancel bool) Action {
	if m := st.Marker; m != nil && m.State == hostproto.MarkerNotStarted {
		// The host proves it never ran (a crash before its supervisor recorded itself) and
		// runs it under the same marker when the same id comes again: send it, so that the
		// journal and the host agree on what happens to it. (A not_started marker answering
		// an exec — the host refused to start it, e.g. its spool is full — is final:
		// ExecVerdict.)
		if cancel {
			return Action{Do: Settle, Verdict: Verdict{To: markers.Cancelled, Note: fmt.Sprintf(
				"cancelled: host %s proves it never started; it is not sent", host)}}
		}
		return Action{Do: Redispatch, Verdict: Verdict{To: markers.Dispatched, Note: fmt.Sprintf(
			"host marker on %s is not_started: it never ran; dispatching the same execution id again (the host starts it under that marker)", host)}}
	}
	if m := st.Marker; m != nil {
		v := MarkerVerdict(host, m)
		if hostOutcomes[m.State].live || v.Outcome != nil {
			note := fmt.Sprintf("host marker on %s is %s: attaching", host, m.State)
			return Action{Do: Attach, Verdict: Verdict{To: liveOrStay(rec.State, v.To), Note: note}}
		}
		return Action{Do: Settle, Verdict: v}
	}
	age := now.Sub(rec.CreatedAt).Round(time.Second)
	horizon := st.Retention - horizonMargin
	switch {
	case st.Retention <= 0:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"host %s has no marker for it but did not say how long it keeps markers, so that does not prove it never started; it is not sent again — review required", host)}}
	case age >= horizon:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"host %s has no marker for it, but it keeps markers for %s and this execution is %s old, so that does not prove it never started; it is not sent again — review required", host, st.Retention, age)}}
	case cancel:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Cancelled, Note: fmt.Sprintf(
			"cancelled: host %s has no marker for it, so it never started; it is not sent", host)}}
	}
	return Action{Do: Redispatch, Verdict: Verdict{To: markers.Dispatched, Note: fmt.Sprintf(
		"host %s has no marker: the command never started; dispatching the same execution id again", host)}}
}

// liveOrStay is the journal state an attach starts from: running for a live marker; for a
// finished one the state stays as it is until the replayed outcome arrives.
func liveOrStay(from, to markers.State) markers.State {
	if to == markers.Running {
		return markers.Running
	}
	return from
}

// JournalPath is the way from the driver's journal state to a Verdict's state through the
// journal graph; nil when there is nothing to transition. confirmed: the host confirmed the
// start (a live marker) and the journal does not show it yet, so the path goes through
// running — except to failed, which the host's marker proves never ran.
func JournalPath(from, to markers.State, confirmed bool) []markers.State {
	switch {
	case from == to:
		return nil
	case to == markers.Dispatched && from == markers.Running:
		return []markers.State{markers.Unknown, markers.Dispatched}
	case confirmed && from != markers.Running && to != markers.Running && to != markers.Failed && to != markers.Dispatched:
		return []markers.State{markers.Running, to}
	}
	return []markers.State{to}
}

func LastEvidence(ev []string) string {
	if len(ev) == 0 {
		return "no reason recorded"
	}
	return ev[len(ev)-1]
}

func OutcomeNote(m *hostproto.Marker) string {
	if m.Signal != "" {
		return "killed by " + m.Signal
	}
	if m.ExitCode != nil {
		return fmt.Sprintf("exit status %d", *m.ExitCode)
	}
	return "exited"
}
