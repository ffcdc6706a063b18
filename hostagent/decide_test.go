package hostagent

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/datadriven"
	"github.com/postern-dev/postern/markers"
)

// The host's decisions are pure functions (decide.go); testdata/decisions holds their tables
// (internal/datadriven; -rewrite regenerates them).
//
// Commands (key=value inputs; states by their names):
//
//	recover       state= boot=this|earlier|unrecorded found=SPOOL [cause=]   recoveryStep
//	start_failure kind=cannot_start|refused|supervisor_failed [fence=fenced|lost]
//	                                                                         startFailure
//	outcome       marked= wait=status|vanished|failed [status=exited:N|signal:S|timed_out|
//	              cancelled|start_failed]                                    outcomeMove
//	exit          state= [code=N] [signal=S]                                 exitStatus
//	duplicate     state= [other_command]                                     duplicateAnswer
//	operation     holder= [code=N] [retry_failed]                            operationFree
//
// Every move a decision makes is also checked against the host graph.
func TestDecisions(t *testing.T) {
	datadriven.RunDir(t, filepath.Join("testdata", "decisions"), decide)
}

func decide(t *testing.T, c datadriven.Case) string {
	fail := func(format string, args ...any) string {
		c.Fatalf(t, format, args...)
		return ""
	}
	state := func(key string) markers.State {
		s := markers.State(c.Args[key])
		if !markers.HostGraph.Has(s) {
			fail("%s=%q is not a host state", key, s)
		}
		return s
	}
	var code *int
	if v, ok := c.Args["code"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			fail("code=: %v", err)
		}
		code = &n
	}
	switch c.Name {
	case "recover":
		from := state("state")
		r := recoveryStep(from, bootOf(c.Args["boot"]), spoolFinding(c.Args["found"]), c.Args["cause"])
		checkMove(t, from, nil, r.Move)
		out := string(r.Do)
		if r.Move.To != "" {
			out += " " + r.Move.describe()
		}
		return out
	case "start_failure":
		m, needFence := startFailure(startFailureKind(c.Args["kind"]), "supervisor exited", "cwd /srv/app does not exist", fenceResult(c.Args["fence"]))
		if needFence {
			return "fence first"
		}
		checkMove(t, markers.Started, nil, m)
		return m.describe()
	case "outcome":
		from := state("marked")
		o := outcomeMove(from, waitResult(c.Args["wait"]), "read status: EIO", testStatus(c.Args["status"]))
		checkMove(t, from, o.Path, o.Move)
		parts := []string{string(from)}
		for _, s := range o.Path {
			parts = append(parts, string(s))
		}
		out := strings.Join(parts, " → ") + ": " + o.Move.detail()
		if o.Record {
			out += fmt.Sprintf("\nrecords the status, is_error %v", o.IsError)
		}
		return out
	case "exit":
		return strconv.Itoa(exitStatus(state("state"), code, c.Args["signal"]))
	case "duplicate":
		return string(duplicateAnswer(state("state"), !c.Flags["other_command"]))
	case "operation":
		if operationFree(state("holder"), code, c.Flags["retry_failed"]) {
			return "free: another execution may take the key"
		}
		return "taken"
	}
	return fail("unknown command %q", c.Name)
}

// testStatus is a supervisor status: exited:N, signal:S, timed_out, cancelled or start_failed.
func testStatus(spec string) supervisor.Status {
	kind, arg, _ := strings.Cut(spec, ":")
	switch kind {
	case "exited":
		n, _ := strconv.Atoi(arg)
		return supervisor.Status{Outcome: supervisor.OutcomeExited, ExitCode: n}
	case "signal":
		return supervisor.Status{Outcome: supervisor.OutcomeExited, ExitCode: -1, Signal: arg}
	case "timed_out":
		return supervisor.Status{Outcome: supervisor.OutcomeTimedOut, ExitCode: -1, Signal: "SIGTERM"}
	case "cancelled":
		return supervisor.Status{Outcome: supervisor.OutcomeCancelled, ExitCode: -1, Signal: "SIGTERM"}
	case "start_failed":
		return supervisor.Status{Outcome: supervisor.OutcomeStartFailed, ExitCode: -1, Error: "cwd /srv/app does not exist"}
	}
	return supervisor.Status{}
}

// checkMove checks that m is reachable from `from` along path (nil: one edge) in the host
// graph.
func checkMove(t *testing.T, from markers.State, path []markers.State, m hostMove) {
	t.Helper()
	if m.To == "" {
		return
	}
	if path == nil {
		path = []markers.State{m.To}
	}
	prev := from
	for _, s := range path {
		if !markers.HostGraph.Allows(prev, s) {
			t.Errorf("move from %s to %s takes the illegal edge %s → %s", from, m.To, prev, s)
		}
		prev = s
	}
	if prev != m.To {
		t.Errorf("path from %s ends in %s; want %s", from, prev, m.To)
	}
}

// TestEveryRecoveryIsLegal: whatever a previous process left and whatever its spool shows,
// recovery decides a legal move or an action, never runs anything again, and says "not run"
// only for a started marker of this boot (or an older release's) whose spool it fenced.
func TestEveryRecoveryIsLegal(t *testing.T) {
	findings := []spoolFinding{foundLive, foundStartFailed, foundNeverStarted, foundFenced, foundVanished, foundMissing, foundUnreadable}
	for _, state := range []markers.State{markers.Started, markers.Running} {
		for _, boot := range []bootOf{thisBoot, earlierBoot, unrecordedBoot} {
			for _, found := range findings {
				r := recoveryStep(state, boot, found, "cause")
				checkMove(t, state, nil, r.Move)
				if r.Move.To == markers.NotStarted && (state != markers.Started || boot == earlierBoot || found != foundFenced) {
					t.Errorf("%s, %s boot, %s: not_started without a fenced spool of this boot", state, boot, found)
				}
				if r.Do == recoverFence && (boot == earlierBoot || state != markers.Started) {
					t.Errorf("%s, %s boot, %s: fences a spool that proves nothing", state, boot, found)
				}
			}
		}
	}
}
