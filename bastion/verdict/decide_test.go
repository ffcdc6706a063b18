package verdict

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/datadriven"
	"github.com/postern-dev/postern/markers"
)

// The drivers' decisions are pure functions; testdata/decisions holds their tables, one file
// per table of docs/design.md (internal/datadriven; -rewrite regenerates them).
//
// Commands (key=value inputs; durations in Go syntax; states by their names):
//
//	outcome   from= confirmed= marker=                 MarkerVerdict + JournalPath
//	exec      from= confirmed= [err=refused|lost] [first=STATE|other] [final=STATE]
//	          [exit=N] [signal=S]                       ExecVerdict + JournalPath
//	reconcile from= age= retention= marker=STATE|absent [cancel]
//	                                                    ReconcileOn + JournalPath
//	http      class= [gone] [check=STATUS|error]        DecideUnknownHTTP
//	review    state= driven=                            Reviewable
//	stock_exec level= from= [unsent] [refused] [answer=KIND[:STATE[:EXIT]]] [exit=N] [signal=S]
//	                                                    StockExecVerdict + JournalPath
//	stock_confirm from= [answer=KIND[:REASON|STATE…]] marker=STATE [unreadable]
//	                                                    ConfirmAnswer + JournalPath
//	stock_reconcile level= from= age= [marker=STATE|absent] [cancel]
//	                                                    ReconcileByLevel + JournalPath
//	recover   journal=STATE|absent [review] [http] [removed] marker=STATE|absent level=
//	                                                    RecoverOn + RecoveryPath
//
// Every journal path a decision produces is also checked against the journal graph.
func TestDecisions(t *testing.T) {
	datadriven.RunDir(t, filepath.Join("testdata", "decisions"), decide)
}

// testHost names the host in every decision.
const testHost = "h1"

func decide(t *testing.T, c datadriven.Case) string {
	fail := func(format string, args ...any) string {
		c.Fatalf(t, format, args...)
		return ""
	}
	state := func(key string) markers.State {
		s := markers.State(c.Args[key])
		if s == "" {
			fail("missing %s=", key)
		}
		return s
	}
	boolean := func(key string) bool {
		v, err := strconv.ParseBool(c.Args[key])
		if err != nil {
			fail("%s=: %v", key, err)
		}
		return v
	}
	duration := func(key string) time.Duration {
		d, err := time.ParseDuration(c.Args[key])
		if err != nil {
			fail("%s=: %v", key, err)
		}
		return d
	}
	marker := func(key string) *hostproto.Marker {
		m := &hostproto.Marker{ID: "ex_this", State: hostproto.MarkerState(state(key)), Evidence: []string{"host evidence"}}
		switch m.State {
		case hostproto.MarkerExited:
			code := 0
			m.ExitCode = &code
		case hostproto.MarkerStartFailed:
			m.StartError = "cwd /srv/app does not exist"
		}
		return m
	}
	switch c.Name {
	case "outcome":
		from := state("from")
		return renderVerdict(t, from, boolean("confirmed"), "", MarkerVerdict(testHost, marker("marker")))
	case "exec":
		from := state("from")
		a := ExecAnswer{Stderr: "postern: refused"}
		switch c.Args["err"] {
		case "refused":
			a.Err = fmt.Errorf("%w: no such account", hostproto.ErrRefused)
		case "lost":
			a.Err = errors.New("connection reset")
		case "":
		default:
			fail("err=%s", c.Args["err"])
		}
		switch v := c.Args["first"]; v {
		case "":
		case "other":
			a.First = &hostproto.Marker{ID: "ex_other", State: hostproto.MarkerRunning, OperationKey: "migration:1"}
		default:
			a.First = marker("first")
		}
		if c.Args["final"] != "" {
			a.Final = marker("final")
		}
		if v := c.Args["exit"]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				fail("exit=: %v", err)
			}
			a.ExitStatus = n
		}
		a.ExitSignal = c.Args["signal"]
		return renderVerdict(t, from, boolean("confirmed"), "", ExecVerdict("ex_this", testHost, a))
	case "reconcile":
		from := state("from")
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		rec := &markers.Record{ID: "ex_this", State: from, CreatedAt: now.Add(-duration("age"))}
		st := HostStatus{Retention: duration("retention")}
		if c.Args["marker"] != "absent" {
			st.Marker = marker("marker")
		}
		act := ReconcileOn(rec, now, testHost, st, c.Flags["cancel"])
		return renderVerdict(t, from, false, string(act.Do), act.Verdict)
	case "http":
		rec := &markers.Record{ID: "ex_this", State: markers.Unknown, Class: c.Args["class"], Host: "payments", Channel: "http"}
		var check *StatusAnswer
		switch v := c.Args["check"]; v {
		case "":
		case "error":
			check = &StatusAnswer{Err: errors.New("connection refused")}
		default:
			n, err := strconv.Atoi(v)
			if err != nil {
				fail("check=: %v", err)
			}
			check = &StatusAnswer{Status: n}
		}
		act := DecideUnknownHTTP(rec, !c.Flags["gone"], check)
		return renderVerdict(t, markers.Unknown, false, string(act.Do), act.Verdict)
	case "review":
		return strconv.FormatBool(Reviewable(state("state"), boolean("driven")))
	case "recover":
		return decideRecovery(t, c, marker)
	case "stock_exec", "stock_confirm", "stock_reconcile":
		return decideStock(t, c, state, duration, fail) // stock_test.go
	}
	return fail("unknown command %q", c.Name)
}

// renderVerdict prints a decision and checks that its journal path is legal.
func renderVerdict(t *testing.T, from markers.State, confirmed bool, do string, v Verdict) string {
	t.Helper()
	path := JournalPath(from, v.To, confirmed)
	checkJournalPath(t, from, path, v.To)
	var sb strings.Builder
	if do != "" {
		sb.WriteString(do + ": ")
	}
	fmt.Fprintf(&sb, "%s", v.To)
	if path != nil {
		parts := make([]string, len(path))
		for i, s := range path {
			parts[i] = string(s)
		}
		fmt.Fprintf(&sb, " via %s → %s", from, strings.Join(parts, " → "))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{v.Review, "review required"}, {v.Again, "ask again"}, {v.Outcome != nil, "host outcome copied"}} {
		if f.on {
			sb.WriteString(", " + f.name)
		}
	}
	if v.StartError != "" {
		fmt.Fprintf(&sb, ", start error %q", v.StartError)
	}
	sb.WriteString("\n" + v.Note)
	return sb.String()
}

func checkJournalPath(t *testing.T, from markers.State, path []markers.State, to markers.State) {
	t.Helper()
	prev := from
	for _, s := range path {
		if !markers.JournalGraph.Allows(prev, s) {
			t.Errorf("journal path from %s to %s takes the illegal edge %s → %s", from, to, prev, s)
		}
		prev = s
	}
	if prev != to {
		t.Errorf("journal path from %s ends in %s; want %s", from, prev, to)
	}
}

// driverStates are the journal states a driver asks a host about an execution in.
var driverStates = []markers.State{markers.Dispatched, markers.Running, markers.Unknown}

// TestEveryHostAnswerIsLegal: every host marker state has a row in hostOutcomes, and every
// answer a host can give — each marker state, and no marker at all — leads from every state a
// driver can be in to a legal journal path, whatever the execution's age; nothing is sent
// again after a cancel, and an absent marker past the host's retention proves nothing.
func TestEveryHostAnswerIsLegal(t *testing.T) {
	now := time.Now()
	for _, ms := range hostproto.MarkerStates() {
		if _, ok := hostOutcomes[ms]; !ok {
			t.Errorf("host state %s has no row in hostOutcomes", ms)
		}
	}
	answers := append([]hostproto.MarkerState{""}, hostproto.MarkerStates()...)
	for _, from := range driverStates {
		for _, ms := range answers {
			for _, confirmed := range []bool{false, true} {
				var m *hostproto.Marker
				if ms != "" {
					m = &hostproto.Marker{ID: "ex_this", State: ms}
					v := MarkerVerdict(testHost, m)
					checkJournalPath(t, from, JournalPath(from, v.To, confirmed), v.To)
					v = ExecVerdict("ex_this", testHost, ExecAnswer{First: m, Final: m})
					checkJournalPath(t, from, JournalPath(from, v.To, confirmed), v.To)
				}
				for _, age := range []time.Duration{time.Minute, 1000 * time.Hour} {
					for _, cancel := range []bool{false, true} {
						rec := &markers.Record{ID: "ex_this", State: from, CreatedAt: now.Add(-age)}
						act := ReconcileOn(rec, now, testHost, HostStatus{Marker: m, Retention: 720 * time.Hour}, cancel)
						checkJournalPath(t, from, JournalPath(from, act.Verdict.To, false), act.Verdict.To)
						// The horizon bounds what an absent marker proves; a not_started marker is
						// proof itself, at any age.
						if act.Do == Redispatch && (m == nil && age > 720*time.Hour || cancel) {
							t.Errorf("%s, marker %q, age %v, cancel %v: re-dispatched", from, ms, age, cancel)
						}
					}
				}
			}
		}
	}
}

// TestEveryClassHandlesAnUnknownOutcome: every built-in class has an answer to an unknown
// outcome, and an SSH execution of any class asks its host.
func TestEveryClassHandlesAnUnknownOutcome(t *testing.T) {
	for _, name := range config.BuiltinClassNames() {
		if _, ok := unknownHandling[name]; !ok {
			t.Errorf("class %s has no unknown handling", name)
		}
		if got := UnknownHandlingFor("ssh", name); got != AskHost {
			t.Errorf("ssh execution of class %s: %s; want %s", name, got, AskHost)
		}
	}
	if got := UnknownHandlingFor("http", "my_custom_class"); got != StopForReview {
		t.Errorf("http execution of a configured class: %s; want %s", got, StopForReview)
	}
}

// decideRecovery renders RecoverOn's decision, with the journal path a review takes (checked
// against the journal graph).
func decideRecovery(t *testing.T, c datadriven.Case, marker func(string) *hostproto.Marker) string {
	var rec *markers.Record
	if j := c.Args["journal"]; j != "absent" {
		rec = &markers.Record{ID: "ex_this", State: markers.State(j), Host: testHost, Channel: "ssh", ReviewRequired: c.Flags["review"]}
		if c.Flags["http"] {
			rec.Channel, rec.Class = "http", "irreversible"
		}
	}
	var m *hostproto.Marker
	if c.Args["marker"] != "absent" {
		m = marker("marker")
	}
	r := RecoverOn(rec, m, fleet.Guarantee(c.Args["level"]), testHost, c.Flags["removed"])
	out := string(r.Do)
	if r.Do == RecoverReview {
		path := RecoveryPath(rec.State)
		if path != nil {
			checkJournalPath(t, rec.State, path, markers.Unknown)
			parts := make([]string, len(path))
			for i, s := range path {
				parts[i] = string(s)
			}
			out += fmt.Sprintf(" via %s → %s", rec.State, strings.Join(parts, " → "))
		}
	}
	return out + "\n" + r.Note
}

// RemovedSpan counts an execution as known to the journal only between its oldest and its
// newest less RemovedSkew: older may predate a journal started again empty, newer ran after
// its last record.
func TestRemovedSpan(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	oldest, newest := t0, t0.Add(24*time.Hour)
	for _, tt := range []struct {
		name string
		at   time.Time
		want bool
	}{
		{"between", t0.Add(time.Hour), true},
		{"the oldest itself", t0, true},
		{"before the oldest", t0.Add(-time.Minute), false},
		{"within the skew of the newest", newest.Add(-RemovedSkew + time.Second), false},
		{"after the newest", newest.Add(time.Hour), false},
	} {
		if got := RemovedSpan(tt.at, oldest, newest); got != tt.want {
			t.Errorf("%s: RemovedSpan = %v; want %v", tt.name, got, tt.want)
		}
	}
	if RemovedSpan(t0, time.Time{}, time.Time{}) {
		t.Error("an empty journal counted an execution as removed")
	}
}
