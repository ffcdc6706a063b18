package bastion

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/datadriven"
	"github.com/postern-dev/postern/markers"
)

// decideStock runs the stock_exec and stock_reconcile commands of testdata/decisions/agentless
// (see TestDecisions). Wrapper answers are written KIND[:STATE[:EXIT]], e.g. duplicate:exited:3;
// a marker state is absent, claimed, claimed_old, running, interrupted or exited (exit 0).
func decideStock(t *testing.T, c datadriven.Case, state func(string) markers.State, duration func(string) time.Duration, fail func(string, ...any) string) string {
	level := Guarantee(c.Args["level"])
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
		a := stockAnswer{Sent: !c.Flags["unsent"], Refused: c.Flags["refused"], Unreadable: c.Flags["unreadable"], Err: errors.New("connection reset"), Stderr: "This account is currently not available."}
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
		act := stockExecVerdict(level, testHost, a)
		started := a.Answer != nil && a.Answer.Kind == agentless.Started
		return renderVerdict(t, from, started, string(act.Do), act.Verdict)
	case "stock_reconcile":
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		rec := &markers.Record{ID: "ex_this", State: from, CreatedAt: now.Add(-duration("age")), ReviewRequired: c.Flags["review"]}
		var st levelStatus
		switch level {
		case GuaranteeMarkerScript:
			st.Wrapper = wrapper(agentless.Status, c.Args["marker"])
		case GuaranteeHostagent:
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
		act := reconcileByLevel(level, rec, now, testHost, st, c.Flags["cancel"])
		return renderVerdict(t, from, false, string(act.Do), act.Verdict)
	}
	return fail("unknown command %q", c.Name)
}

func TestCheckGuarantee(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name      string
		guarantee Guarantee
		digest    string
		wantErr   bool
	}{
		{"default", "", "", false},
		{"hostagent", GuaranteeHostagent, "", false},
		{"none", GuaranteeNone, "", false},
		{"marker script", GuaranteeMarkerScript, digest, false},
		{"marker script without digest", GuaranteeMarkerScript, "", true},
		{"marker script with a short digest", GuaranteeMarkerScript, "abc", true},
		{"digest without the marker script", GuaranteeNone, digest, true},
		{"unknown level", "agent", "", true},
	} {
		if err := checkGuarantee(tc.guarantee, tc.digest); (err != nil) != tc.wantErr {
			t.Errorf("%s: checkGuarantee = %v; want error %v", tc.name, err, tc.wantErr)
		}
	}
}

// TestCheckStockCallKeepsTheWrapperAtHome: the variables a stock sshd refuses are exported
// at the head of the line, before the wrapper runs, so HOME would move the marker script
// and its markers away from where the bastion reads them (`~/.postern/run status` finds no
// marker, "never started"): refused on a marker-script host, before anything is journaled.
func TestCheckStockCallKeepsTheWrapperAtHome(t *testing.T) {
	script := Host{Name: "h1", Guarantee: GuaranteeMarkerScript, ScriptSHA256: strings.Repeat("ab", 32)}
	for _, tc := range []struct {
		name    string
		host    Host
		env     map[string]string
		wantErr bool
	}{
		{"marker script, HOME", script, map[string]string{"HOME": "/tmp/elsewhere"}, true},
		{"marker script, other env", script, map[string]string{"LANG": "C.UTF-8"}, false},
		{"level none, HOME", Host{Name: "h1", Guarantee: GuaranteeNone}, map[string]string{"HOME": "/tmp/elsewhere"}, false},
		{"hostagent, HOME", Host{Name: "h1"}, map[string]string{"HOME": "/tmp/elsewhere"}, false},
	} {
		err := checkStockCall(tc.host, ExecArgs{Command: "true", Env: tc.env}, "")
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: checkStockCall = %v; want error %v", tc.name, err, tc.wantErr)
		}
	}
}
