package hostagent

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// The host's decisions about a marker, as pure functions that the executor (execution.go,
// recover.go) carries out; tested from testdata/decisions, which mirrors the marker lifecycle
// (docs/design.md, "The hostagent"):
//
//	started → running → exited | timed_out | cancelled | interrupted
//	started → not_started (provably never ran; may start again) | start_failed (final)
//
//	recoveryStep    a marker left started or running, and what its spool shows → the move
//	startFailure    a command that did not start, and why → the move
//	outcomeMove     how a started command ended → the move, through running when needed
//	exitStatus      a marker → the SSH exit status that reports it
//	duplicateAnswer a marker found for a new request → what the request gets
//	operationFree   an operation key's holder → whether another execution may take the key
//
// Boot rule: the supervisor's spool records are page-cache writes, so they prove what
// happened on this boot only. A started marker of this boot with no supervisor record
// provably never ran — the only case where the host itself says "not run"; of an earlier
// boot it is interrupted, review required, never run again.

// hostMove is a decided marker transition.
type hostMove struct {
	// To is the state the marker moves to; "" when it does not move.
	To markers.State
	// Note is the event's note and, where the move is about evidence, its Evidence line.
	Note string
	// Evidence: Note is also appended to the marker's evidence.
	Evidence bool
	// StartError is why the command provably did not start (start_failed).
	StartError string
}

// bootOf is how a marker's boot relates to this one.
type bootOf string

const (
	thisBoot    bootOf = "this"
	earlierBoot bootOf = "earlier"
	// unrecordedBoot: a marker of an older release, which synced its spool records, so they
	// count as this boot's.
	unrecordedBoot bootOf = "unrecorded"
)

// markerBoot is the relation of a marker's boot id to this boot's.
func markerBoot(markerBootID, current string) bootOf {
	switch markerBootID {
	case "":
		return unrecordedBoot
	case current:
		return thisBoot
	}
	return earlierBoot
}

// spoolFinding is what recovery reads of an execution from its spool directory.
type spoolFinding string

const (
	// foundLive: a supervisor answers for the execution, or it ended with a status other
	// than start_failed: it is adopted and watched to its end.
	foundLive spoolFinding = "live"
	// foundStartFailed: the status says the command could not start.
	foundStartFailed spoolFinding = "start_failed"
	// foundNeverStarted: no supervisor record (supervisor.ErrNeverStarted).
	foundNeverStarted spoolFinding = "never_started"
	// foundFenced: recovery fenced the directory: no supervisor ran there, and none will.
	foundFenced spoolFinding = "fenced"
	// foundVanished: a supervisor recorded itself and is gone without a status.
	foundVanished spoolFinding = "vanished"
	// foundMissing: there is no spool directory.
	foundMissing spoolFinding = "missing"
	// foundUnreadable: the spool could not be read.
	foundUnreadable spoolFinding = "unreadable"
)

// recoveryDo is what recovery does next about one marker.
type recoveryDo string

const (
	// recoverMove: write Move; the marker is settled.
	recoverMove recoveryDo = "move"
	// recoverFence: fence the spool directory, then decide again on what that found
	// (foundFenced, or what a supervisor that recorded itself first left).
	recoverFence recoveryDo = "fence"
	// recoverAdopt: adopt the command and watch it to its end; Move (to running) first if
	// the marker still says started.
	recoverAdopt recoveryDo = "adopt"
	// recoverFail: the spool cannot be read on this boot; the agent does not start (an
	// operator looks), rather than guess.
	recoverFail recoveryDo = "fail"
)

// recovery is recoveryStep's decision.
type recovery struct {
	Do   recoveryDo
	Move hostMove
}

// recoveryStep decides about a marker a previous process left in state (started or running)
// from what its spool shows (cause: the start error a start_failed status records).
func recoveryStep(state markers.State, boot bootOf, found spoolFinding, cause string) recovery {
	interrupted := func(note string) recovery {
		return recovery{Do: recoverMove, Move: hostMove{To: markers.Interrupted, Note: note, Evidence: true}}
	}
	switch {
	case found == foundLive && state == markers.Started:
		return recovery{Do: recoverAdopt, Move: hostMove{To: markers.Running, Note: "recovered: command started"}}
	case found == foundLive:
		return recovery{Do: recoverAdopt}
	case found == foundStartFailed && state == markers.Started:
		note := "recovered: command did not start: " + cause
		return recovery{Do: recoverMove, Move: hostMove{To: markers.StartFailed, Note: note, Evidence: true, StartError: cause}}
	case found == foundStartFailed:
		// Running was written after the command started: the status is not this run's to
		// contradict; watching it records what the status says.
		return recovery{Do: recoverAdopt}
	case boot == earlierBoot:
		// The spool's records may be lost with the page cache: no record proves nothing.
		return interrupted("recovered after the machine restarted: whether the command ran is unknown")
	case found == foundNeverStarted && state == markers.Started:
		// No supervisor record yet: fence the directory so a supervisor still on its way
		// cannot start the command later, and only then call it never started.
		return recovery{Do: recoverFence}
	case found == foundFenced && state == markers.Started:
		return recovery{Do: recoverMove, Move: hostMove{To: markers.NotStarted, Note: "recovered: no supervisor record, the command never ran", Evidence: true}}
	case found == foundUnreadable:
		return recovery{Do: recoverFail}
	}
	// Running with no supervisor record, a supervisor gone without a status, no spool at all.
	return interrupted("recovered: the supervisor is gone without an exit record")
}

// startFailureKind is why a freshly marked command did not start.
type startFailureKind string

const (
	// cannotStart: the supervisor could not start the command (supervisor.StartError): it
	// provably did not run, and the same request would fail the same way.
	cannotStart startFailureKind = "cannot_start"
	// refusedBeforeSupervisor: refused before a supervisor was asked (the spool is full).
	refusedBeforeSupervisor startFailureKind = "refused"
	// supervisorFailed: the supervisor failed, or the start was abandoned, before it reported
	// a start: whether it recorded itself (and so may have run the command) is for the fence
	// to settle.
	supervisorFailed startFailureKind = "supervisor_failed"
)

// fenceResult is how fencing a spool directory went.
type fenceResult string

const (
	// notFenced: not tried (yet).
	notFenced fenceResult = ""
	// fenced: the directory is fenced: no supervisor recorded itself, and none will.
	fenced fenceResult = "fenced"
	// fenceLost: a supervisor recorded itself first (or the fence could not be written): it
	// may have started the command.
	fenceLost fenceResult = "lost"
)

// startFailure decides the marker move of a command that did not start (why: the error's
// text; cause: a cannot_start's one-line cause). A supervisorFailed with notFenced decides
// nothing yet: needFence says to fence and ask again.
func startFailure(kind startFailureKind, why, cause string, fence fenceResult) (move hostMove, needFence bool) {
	switch {
	case kind == cannotStart:
		return hostMove{To: markers.StartFailed, Note: "command did not start: " + cause, Evidence: true, StartError: cause}, false
	case kind == refusedBeforeSupervisor:
		return hostMove{To: markers.NotStarted, Note: "command did not start: " + why, Evidence: true}, false
	case fence == notFenced:
		return hostMove{}, true
	case fence == fenced:
		return hostMove{To: markers.NotStarted, Note: "command did not start: " + why, Evidence: true}, false
	}
	return hostMove{To: markers.Interrupted, Note: "the supervisor failed after it recorded itself: " + why, Evidence: true}, false
}

// waitResult is how waiting for a started command ended.
type waitResult string

const (
	waitedStatus   waitResult = "status"   // the supervisor's status arrived
	waitedVanished waitResult = "vanished" // the supervisor is gone without a status
	waitedFailed   waitResult = "failed"   // the wait itself failed
)

// outcome is outcomeMove's decision: the path from the marker's state, and the outcome
// fields the end marker gets (none for interrupted).
type outcome struct {
	Path []markers.State
	Move hostMove
	// Record: the marker takes the status's exit code, signal, output sizes and digests.
	Record  bool
	IsError bool
}

// outcomeMove decides the end of a command whose marker is in marked (started: it ended
// before running was written, so the end goes through running in the same write; running)
// from how the wait ended (waitErr: the failed wait's error text) and the supervisor's
// status.
func outcomeMove(marked markers.State, wait waitResult, waitErr string, st supervisor.Status) outcome {
	var m hostMove
	switch {
	case wait == waitedVanished:
		m = hostMove{To: markers.Interrupted, Note: "the supervisor vanished without an exit record", Evidence: true}
	case wait == waitedFailed:
		m = hostMove{To: markers.Interrupted, Note: "waiting for the command failed: " + waitErr, Evidence: true}
	case st.Outcome == supervisor.OutcomeStartFailed && marked == markers.Started:
		return outcome{Path: []markers.State{markers.StartFailed},
			Move: hostMove{To: markers.StartFailed, Note: "command did not start: " + st.Error, Evidence: true, StartError: st.Error}}
	case st.Outcome == supervisor.OutcomeTimedOut:
		m = hostMove{To: markers.TimedOut, Note: "timed out"}
	case st.Outcome == supervisor.OutcomeCancelled:
		m = hostMove{To: markers.Cancelled, Note: "cancelled"}
	default:
		m = hostMove{To: markers.Exited, Note: "exited"}
	}
	o := outcome{Path: []markers.State{m.To}, Move: m}
	if marked == markers.Started {
		o.Path = []markers.State{markers.Running, m.To}
	}
	if m.To != markers.Interrupted {
		o.Record = true
		o.IsError = st.ExitCode != 0 || st.Signal != "" || m.To != markers.Exited
	}
	return o
}

// exitStatus is the SSH exit status that reports how an execution ended: the command's own
// for an exit, 128+n for signal n (as a shell reports it), hostproto's for the rest.
func exitStatus(state markers.State, exitCode *int, signal string) int {
	switch {
	case state == markers.TimedOut:
		return hostproto.ExitTimedOut
	case state == markers.NotStarted || state == markers.StartFailed:
		return hostproto.ExitRefused
	case state == markers.Interrupted || state == markers.Started || state == markers.Running:
		return hostproto.ExitUnknownOutcome
	case exitCode != nil:
		return *exitCode
	case signal != "":
		if sig := unix.SignalNum(signal); sig > 0 {
			return 128 + int(sig)
		}
	}
	return hostproto.ExitUnknownOutcome
}

// duplicateDo is what a request gets whose execution id already has a marker.
type duplicateDo string

const (
	// runAgain: the marker proves the command never ran; it runs now under the same marker.
	runAgain duplicateDo = "run_again"
	// refuseOtherCommand: it never ran, but the marker is of another command: nothing runs.
	refuseOtherCommand duplicateDo = "refuse_other_command"
	// replayStartFailure: it could not start; the same answer again.
	replayStartFailure duplicateDo = "replay_start_failure"
	// replayOutcome: it ran; its stored output and outcome again.
	replayOutcome duplicateDo = "replay_outcome"
	// unknownOutcome: it started and its outcome is unknown (interrupted, or still starting
	// with no live execution here): it is not run again.
	unknownOutcome duplicateDo = "unknown_outcome"
)

// duplicateAnswer decides what a request for an existing marker in state gets (sameCommand:
// the request is for the command the marker recorded). A live execution of this process is
// attached to before this is asked.
func duplicateAnswer(state markers.State, sameCommand bool) duplicateDo {
	switch {
	case state == markers.NotStarted && sameCommand:
		return runAgain
	case state == markers.NotStarted:
		return refuseOtherCommand
	case state == markers.StartFailed:
		return replayStartFailure
	case markers.HostGraph.Terminal(state) && state != markers.Interrupted:
		return replayOutcome
	}
	return unknownOutcome
}

// operationFree reports whether an execution other than holder may take holder's operation
// key: only if holder provably had no effect to protect — it never started, or it exited
// non-zero — and the host is configured to retry failed operations.
func operationFree(holder markers.State, exitCode *int, retryFailed bool) bool {
	failed := holder == markers.NotStarted || holder == markers.StartFailed ||
		holder == markers.Exited && exitCode != nil && *exitCode != 0
	return retryFailed && failed
}

// describe renders a move for the decision tables.
func (m hostMove) describe() string {
	if m.To == "" {
		return "no move"
	}
	return fmt.Sprintf("→ %s: %s", m.To, m.detail())
}

// detail is the move's note, and what else it writes.
func (m hostMove) detail() string {
	s := m.Note
	if m.Evidence {
		s += " (evidence)"
	}
	if m.StartError != "" {
		s += fmt.Sprintf(" [start error %q]", m.StartError)
	}
	return s
}
