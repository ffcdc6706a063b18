package verdict

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/datadriven"
	"github.com/postern-dev/postern/markers"
)

// decideStock runs the stock_exec and stock_reconcile commands of testdata/decisions/agentless
// (see TestDecisions). Wrapper answers are written KIND[:STATE[:EXIT]], e.g. duplicate:exited:3;
// a marker state is absent, claimed, claimed_old, running, interrupted or exited (exit 0).
func decideStock(t *testing.T, c datadriven.Case, state func(string) markers.State, duration func(string) time.Duration, fail func(string, ...any) string) string {
	level := fleet.Guarantee(c.Args["level"])
	from := state("from")
	wrapper := func(kind agentless.Kind, spec string) agentless.Answer {
		a := agentless.Answer{Kind: kind, RetentionDays: 30}
		parts := strings.Split(spec, ":")
		switch parts[0] {
		case "claimed_old":
			a.State, a.Old = agentless.Claimed, true
		default:
			a.State = agentless.State(parts[0])
		}
		if a.State == agentless.Exited {
			code := 0
			if len(parts) > 1 {
				code, _ = strconv.Atoi(parts[1])
			}
			a.Exit = &code
		}
		return a
	}
	switch c.Name {
	case "stock_exec":
		a := AgentlessAnswer{Sent: !c.Flags["unsent"], Refused: c.Flags["refused"], Unreadable: c.Flags["unreadable"], Err: errors.New("connection reset"), Stderr: "This account is currently not available."}
		if v := c.Args["exit"]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				fail("exit=: %v", err)
			}
			a.Exit, a.Err = &n, nil
		}
		if v := c.Args["signal"]; v != "" {
			a.Signal, a.Err = v, nil
		}
		if v := c.Args["answer"]; v != "" {
			kind, rest, _ := strings.Cut(v, ":")
			ans := agentless.Answer{Kind: agentless.Kind(kind)}
			switch ans.Kind {
			case agentless.Duplicate:
				ans = wrapper(agentless.Duplicate, rest)
			case agentless.Refused:
				ans.Reason = rest
			}
			a.Answer = &ans
		}
		act := AgentlessExecVerdict(level, testHost, a)
		started := a.Answer != nil && a.Answer.Kind == agentless.Started
		return renderVerdict(t, from, started, string(act.Do), act.Verdict)
	case "stock_confirm":
		// An answer AgentlessExecVerdict asked to confirm, then the marker as read after it.
		a := AgentlessAnswer{Sent: true, Exit: new(int)}
		if v := c.Args["answer"]; v != "" {
			kind, rest, _ := strings.Cut(v, ":")
			ans := agentless.Answer{Kind: agentless.Kind(kind), Reason: rest}
			if ans.Kind == agentless.Duplicate {
				ans = wrapper(agentless.Duplicate, rest)
			}
			a.Answer = &ans
		}
		act := AgentlessExecVerdict(fleet.GuaranteeMarkerScript, testHost, a)
		if act.Do != Confirm {
			return fail("answer %q is not one to confirm: %s", c.Args["answer"], act.Do)
		}
		var err error
		if c.Flags["unreadable"] {
			err = errors.New("connection reset")
		}
		act = ConfirmAnswer(testHost, act.Verdict, wrapper(agentless.Status, c.Args["marker"]), err)
		return renderVerdict(t, from, false, string(act.Do), act.Verdict)
	case "stock_reconcile":
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		rec := &markers.Record{ID: "ex_this", State: from, CreatedAt: now.Add(-duration("age")), ReviewRequired: c.Flags["review"]}
		var st LevelStatus
		switch level {
		case fleet.GuaranteeMarkerScript:
			st.Wrapper = wrapper(agentless.Status, c.Args["marker"])
		case fleet.GuaranteeHostagent:
			// The hostagent's marker for the same observation.
			st.Hostagent.Retention = 720 * time.Hour
			m := map[string]hostproto.MarkerState{"claimed": hostproto.MarkerStarted, "running": hostproto.MarkerRunning,
				"interrupted": hostproto.MarkerInterrupted, "exited": hostproto.MarkerExited}
			if s, ok := m[c.Args["marker"]]; ok {
				st.Hostagent.Marker = &hostproto.Marker{ID: "ex_this", State: s}
				if s == hostproto.MarkerExited {
					code := 0
					st.Hostagent.Marker.ExitCode = &code
				}
			}
		}
		act := ReconcileByLevel(level, rec, now, testHost, st, c.Flags["cancel"])
		return renderVerdict(t, from, false, string(act.Do), act.Verdict)
	}
	return fail("unknown command %q", c.Name)
}
