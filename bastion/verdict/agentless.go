package verdict

import (
	"fmt"
	"time"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// What a stock sshd's answer means for the journal, as pure functions the agentless driver
// carries out (tested from testdata/decisions/agentless, which mirrors docs/agentless.md's
// guarantee table):
//
//	AgentlessExecVerdict  how one exec on a stock sshd ended (answer line, exit, transport) → Verdict
//	ConfirmAnswer     an answer that nothing started, checked against the marker → action
//	ReconcileByLevel  what the host can tell about an execution in flight, by level → action

// Watch: the marker says the command is (still) starting or running; its output cannot be
// re-attached, so the driver reads the marker again until it ends.
const Watch Do = "watch"

// Confirm: the answer says the command did not start (a refusal, a duplicate id, a shell that
// did not run Postern's line), and the account's start-up files run before Postern's line
// and can print any such answer. The driver reads the marker script's marker and decides
// with ConfirmAnswer; the verdict is journaled only if the marker agrees.
const Confirm Do = "confirm"

// AgentlessAnswer is how one exec on a stock sshd ended, as the bastion saw it.
type AgentlessAnswer struct {
	// Sent: the exec request was handed to the connection. False: it failed before (no
	// session, connection gone), so the host got nothing to run.
	Sent bool
	// Refused: sshd answered the exec request with a failure.
	Refused bool
	// Answer is the first answer line on stderr (the wrapper's, or the plain program's);
	// nil when none arrived.
	Answer *agentless.Answer
	// Exit is the exit status when one arrived; Signal the exit signal.
	Exit   *int
	Signal string
	// Err is the transport's error when neither arrived.
	Err error
	// Stderr is the last line of stderr (the account's shell's complaint, if it failed).
	Stderr string
	// Unreadable: no answer was taken, yet stderr may have held one (agentless.Filter's
	// Unreadable), so an exit status without an answer does not prove the command never ran.
	Unreadable bool
}

// AgentlessExecVerdict is the journal's verdict on one exec of an execution on a stock sshd
// whose guarantee is level (fleet.GuaranteeNone or fleet.GuaranteeMarkerScript).
func AgentlessExecVerdict(level fleet.Guarantee, host string, a AgentlessAnswer) Action {
	v, do := agentlessExec(level, host, a)
	return Action{Do: do, Verdict: v}
}

func agentlessExec(level fleet.Guarantee, host string, a AgentlessAnswer) (Verdict, Do) {
	lost := a.Exit == nil && a.Signal == ""
	if a.Answer != nil && a.Answer.Kind != agentless.Started && a.Answer.Kind != agentless.Duplicate && a.Answer.Kind != agentless.Refused {
		// An answer an exec never gives first (status, warning): not one to decide on.
		a.Answer, a.Unreadable = nil, true
	}
	switch {
	case !a.Sent:
		return Verdict{To: markers.Failed, Note: fmt.Sprintf("could not send the command to %s (%v); nothing was sent", host, a.Err)}, Settle
	case a.Refused:
		return Verdict{To: markers.Failed, Note: fmt.Sprintf("sshd on %s refused the exec request; nothing was started", host)}, Settle
	case a.Answer != nil && a.Answer.Kind == agentless.Refused && level == fleet.GuaranteeNone:
		return unconfirmable(host, fmt.Sprintf("its answer says it refused the command (%s)", RefusalText(host, a.Answer.Reason))), Settle
	case a.Answer != nil && a.Answer.Kind == agentless.Refused:
		why := RefusalText(host, a.Answer.Reason)
		return Verdict{To: markers.Failed, StartError: why, Note: fmt.Sprintf("%s; the command did not run", why)}, Confirm
	case a.Answer != nil && a.Answer.Kind == agentless.Duplicate && level == fleet.GuaranteeNone:
		return unconfirmable(host, "its answer says the execution id ran before"), Settle
	case a.Answer != nil && a.Answer.Kind == agentless.Duplicate:
		act := wrapperStateVerdict(host, *a.Answer)
		return act.Verdict, Confirm
	case a.Answer != nil && a.Answer.Kind == agentless.Started && !lost:
		m := &hostproto.Marker{State: hostproto.MarkerExited, ExitCode: a.Exit, Signal: a.Signal}
		if a.Signal != "" {
			m.ExitCode = nil
		}
		return Verdict{To: markers.Completed, Outcome: m, Note: OutcomeNote(m)}, Settle
	case a.Answer != nil && a.Answer.Kind == agentless.Started && level == fleet.GuaranteeNone:
		return Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"connection to %s lost after the command started (%v); %s keeps no marker (guarantee level none), so whether and how it ended cannot be known; it is not sent again — review required", host, a.Err, host)}, Settle
	case a.Answer != nil && a.Answer.Kind == agentless.Started:
		return Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf(
			"connection to %s lost after the command started (%v); reading its marker", host, a.Err)}, Settle
	case !lost && a.Answer == nil && a.Unreadable && level == fleet.GuaranteeNone:
		return Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"%s exited (%s), and its answer line could not be read, so whether the command started cannot be known; %s keeps no marker (guarantee level none); it is not sent again — review required", host, exitText(a.Exit, a.Signal), host)}, Settle
	case !lost && a.Answer == nil && a.Unreadable:
		return Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf(
			"%s exited (%s), and its answer line could not be read, so whether the command started cannot be known; reading its marker", host, exitText(a.Exit, a.Signal))}, Settle
	case !lost && level == fleet.GuaranteeNone:
		return unconfirmable(host, fmt.Sprintf("the account's shell exited (%s) without Postern's answer line (%s)", exitText(a.Exit, a.Signal), a.Stderr)), Settle
	case !lost:
		// An exit status, and no answer: the account's shell never ran Postern's line (a
		// login shell that refuses, like nologin), and the answer comes before the command.
		return Verdict{To: markers.Failed, StartError: "the account's shell did not run the command line", Note: fmt.Sprintf(
			"the account's shell on %s exited (%s) without running Postern's command line, so the command did not start: %s", host, exitText(a.Exit, a.Signal), a.Stderr)}, Confirm
	case level == fleet.GuaranteeNone:
		return Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"connection to %s lost after the command was sent, before the host confirmed a start (%v); %s keeps no marker (guarantee level none), so whether it started cannot be known; it is not sent again — review required", host, a.Err, host)}, Settle
	}
	return Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf(
		"connection to %s lost after the command was sent, before the host confirmed a start (%v); reading its marker", host, a.Err)}, Settle
}

// unconfirmable is the verdict on an answer that says "not run" from a level-none host:
// nothing on it can confirm the answer, which the account's start-up files could have
// printed, so the outcome is unknown and never sent again.
func unconfirmable(host, what string) Verdict {
	return Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
		"%s: %s, but %s keeps no marker (guarantee level none) to confirm that the command did not start — the account's start-up files run first and can print such an answer; it is not sent again — review required", host, what, host)}
}

// ConfirmAnswer decides on an answer AgentlessExecVerdict asked to confirm (Confirm), from
// the marker script's marker read after it: pending is the answer's verdict. No marker
// confirms an answer that nothing started (a refusal, a shell that did not run the line);
// a marker means the command was claimed or started whatever the answer said, and its state
// decides. A duplicate's answer is confirmed by the marker it names. err: the marker could
// not be read, so it is read again later (the execution is unknown meanwhile).
func ConfirmAnswer(host string, pending Verdict, w agentless.Answer, err error) Action {
	switch {
	case err != nil:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Again: true, Note: fmt.Sprintf(
			"%s; confirming it with the marker script's marker on %s failed (%v); reading it again", pending.Note, host, err)}}
	case w.State == agentless.Absent && pending.To == markers.Failed:
		pending.Note += "; confirmed: the marker script on " + host + " has no marker for it"
		return Action{Do: Settle, Verdict: pending}
	case w.State == agentless.Absent:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"the answer from %s named a marker for it, but the marker script has none: the answer was not the script's (the account's start-up files print before it); it is not sent again — review required", host)}}
	}
	act := wrapperStateVerdict(host, w)
	if pending.To == markers.Failed {
		act.Verdict.Note = fmt.Sprintf("the answer from %s said the command did not start, but the marker script has a marker for it, so the answer was not the script's (the account's start-up files print before it): %s", host, act.Verdict.Note)
	}
	return act
}

func exitText(code *int, signal string) string {
	if signal != "" {
		return "signal " + signal
	}
	return fmt.Sprintf("exit status %d", *code)
}

// RefusalText says why the wrapper or the plain program refused, for the agent and the
// operator.
func RefusalText(host, reason string) string {
	switch reason {
	case "cwd":
		return "the working directory does not exist or cannot be entered on " + host
	case "timeout_unsupported":
		return "timeout_s needs coreutils timeout on " + host + ", which has none"
	case "script_changed":
		return fmt.Sprintf("the marker script ~/.postern/run on %s is not the one enrolled (its SHA-256 changed); re-enroll the host (postern hosts enroll %s ADDR --agentless --marker-script) to install it again", host, host)
	case "script_missing":
		return fmt.Sprintf("the marker script ~/.postern/run is missing on %s; re-enroll the host (postern hosts enroll %s ADDR --agentless --marker-script) to install it", host, host)
	case "marker_dir", "marker_write":
		return "the marker script could not write its marker under ~/.postern/markers on " + host
	}
	return fmt.Sprintf("the marker script on %s refused it (%s)", host, reason)
}

// LevelStatus is what a host can tell about an execution in flight.
type LevelStatus struct {
	// Wrapper is the marker script's status answer (fleet.GuaranteeMarkerScript).
	Wrapper agentless.Answer
	// Hostagent is the hostagent's answer (fleet.GuaranteeHostagent).
	Hostagent HostStatus
}

// ReconcileByLevel decides what to do with an execution in flight (dispatched, running or
// unknown) from what its host can tell, by the host's guarantee level: the hostagent's
// marker (ReconcileOn); the marker script's (the same rules, with no output to re-attach);
// or nothing, so an outcome lost after dispatch is unknown for good and only an operator
// settles it. cancel: someone asked to cancel it.
func ReconcileByLevel(level fleet.Guarantee, rec *markers.Record, now time.Time, host string, st LevelStatus, cancel bool) Action {
	switch level {
	case fleet.GuaranteeHostagent:
		return ReconcileOn(rec, now, host, st.Hostagent, cancel)
	case fleet.GuaranteeNone:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"%s runs no hostagent and no marker script (guarantee level none): nothing on it records executions, so an outcome lost after dispatch cannot be resolved; it is not sent again — review required", host)}}
	}
	w := st.Wrapper
	if w.State != agentless.Absent {
		return wrapperStateVerdict(host, w)
	}
	if rec.ReviewRequired {
		// Under review already (the marker vanished while the command ran, it was
		// interrupted, a claim was left): the wrapper's files are the account's to delete,
		// so no marker now proves nothing.
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"the marker script on %s has no marker for it now, but its outcome already needed review (the marker was there before, or could not be trusted), so a missing marker does not prove it never started; it is not sent again — review required", host)}}
	}
	// No marker: the same rule as the hostagent's, under the wrapper's retention.
	act := ReconcileOn(rec, now, host, HostStatus{Retention: time.Duration(w.RetentionDays) * 24 * time.Hour}, cancel)
	return act
}

// wrapperStateVerdict is what a marker the wrapper holds means: its outcome, a command still
// running (watched, not attached: the wrapper keeps no output), or an unknown only an
// operator can settle.
func wrapperStateVerdict(host string, w agentless.Answer) Action {
	switch w.State {
	case agentless.Exited:
		code := *w.Exit
		m := &hostproto.Marker{State: hostproto.MarkerExited, ExitCode: &code}
		return Action{Do: Settle, Verdict: Verdict{To: markers.Completed, Outcome: m, Note: fmt.Sprintf(
			"the marker script on %s recorded exit status %d (output after the connection was lost is not kept)", host, code)}}
	case agentless.Running:
		return Action{Do: Watch, Verdict: Verdict{To: markers.Running, Note: fmt.Sprintf(
			"the marker script on %s says the command is still running; its output cannot be re-attached, watching its marker", host)}}
	case agentless.Claimed:
		if w.Old {
			return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
				"the marker script on %s claimed the id more than 5 minutes ago but recorded no start: the command did not start unless the wrapper hangs; it is not sent again — review required (check ~/.postern/markers/ on %s)", host, host)}}
		}
		return Action{Do: Watch, Verdict: Verdict{To: markers.Unknown, Note: fmt.Sprintf(
			"the marker script on %s claimed the id and has not recorded the start yet; watching its marker", host)}}
	case agentless.Interrupted:
		return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
			"the marker script on %s recorded the start, and its process is gone without an exit record (killed, or the machine restarted): the command may have run in part; it is not run again — review required", host)}}
	}
	return Action{Do: Settle, Verdict: Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
		"the marker script on %s answered state %q, which this bastion does not know; it is not sent again — review required", host, w.State)}}
}
