package bastion

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/datadriven"
	"github.com/postern-dev/postern/markers"
)

// The drivers' decisions are pure functions; testdata/decisions holds their tables, one file
// per DESIGN.md table (internal/datadriven; -rewrite regenerates them).
//
// Commands (key=value inputs; durations in Go syntax; states by their names):
//
//	outcome   from= confirmed= marker=                 markerVerdict + journalPath
//	exec      from= confirmed= [err=refused|lost] [first=STATE|other] [final=STATE]
//	          [exit=N] [signal=S]                       execVerdict + journalPath
//	reconcile from= age= retention= marker=STATE|absent [cancel]
//	                                                    reconcileOn + journalPath
//	http      class= [gone] [check=STATUS|error]        decideUnknownHTTP
//	review    state= driven=                            reviewable
//	stock_exec level= from= [unsent] [refused] [answer=KIND[:STATE[:EXIT]]] [exit=N] [signal=S]
//	                                                    stockExecVerdict + journalPath
//	stock_reconcile level= from= age= [marker=STATE|absent] [cancel]
//	                                                    reconcileByLevel + journalPath
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
		return renderVerdict(t, from, boolean("confirmed"), "", markerVerdict(testHost, marker("marker")))
	case "exec":
		from := state("from")
		a := execAnswer{Stderr: "postern: refused"}
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
		return renderVerdict(t, from, boolean("confirmed"), "", execVerdict("ex_this", testHost, a))
	case "reconcile":
		from := state("from")
		now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		rec := &markers.Record{ID: "ex_this", State: from, CreatedAt: now.Add(-duration("age"))}
		st := hostStatus{Retention: duration("retention")}
		if c.Args["marker"] != "absent" {
			st.Marker = marker("marker")
		}
		act := reconcileOn(rec, now, testHost, st, c.Flags["cancel"])
		return renderVerdict(t, from, false, string(act.Do), act.Verdict)
	case "http":
		rec := &markers.Record{ID: "ex_this", State: markers.Unknown, Class: c.Args["class"], Host: "payments", Channel: "http"}
		var check *statusAnswer
		switch v := c.Args["check"]; v {
		case "":
		case "error":
			check = &statusAnswer{Err: errors.New("connection refused")}
		default:
			n, err := strconv.Atoi(v)
			if err != nil {
				fail("check=: %v", err)
			}
			check = &statusAnswer{Status: n}
		}
		act := decideUnknownHTTP(rec, !c.Flags["gone"], check)
		return renderVerdict(t, markers.Unknown, false, string(act.Do), act.Verdict)
	case "review":
		return strconv.FormatBool(reviewable(state("state"), boolean("driven")))
	case "stock_exec", "stock_reconcile":
		return decideStock(t, c, state, duration, fail) // agentless_decide_test.go
	}
	return fail("unknown command %q", c.Name)
}

// renderVerdict prints a decision and checks that its journal path is legal.
func renderVerdict(t *testing.T, from markers.State, confirmed bool, do string, v verdict) string {
	t.Helper()
	path := journalPath(from, v.To, confirmed)
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
					v := markerVerdict(testHost, m)
					checkJournalPath(t, from, journalPath(from, v.To, confirmed), v.To)
					v = execVerdict("ex_this", testHost, execAnswer{First: m, Final: m})
					checkJournalPath(t, from, journalPath(from, v.To, confirmed), v.To)
				}
				for _, age := range []time.Duration{time.Minute, 1000 * time.Hour} {
					for _, cancel := range []bool{false, true} {
						rec := &markers.Record{ID: "ex_this", State: from, CreatedAt: now.Add(-age)}
						act := reconcileOn(rec, now, testHost, hostStatus{Marker: m, Retention: 720 * time.Hour}, cancel)
						checkJournalPath(t, from, journalPath(from, act.Verdict.To, false), act.Verdict.To)
						// The horizon bounds what an absent marker proves; a not_started marker is
						// proof itself, at any age.
						if act.Do == redispatch && (m == nil && age > 720*time.Hour || cancel) {
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
	for _, cl := range builtinClasses {
		if _, ok := unknownHandling[cl.Name]; !ok {
			t.Errorf("class %s has no unknown handling", cl.Name)
		}
		if got := unknownHandlingFor("ssh", cl.Name); got != askHost {
			t.Errorf("ssh execution of class %s: %s; want %s", cl.Name, got, askHost)
		}
	}
	if got := unknownHandlingFor("http", "my_custom_class"); got != stopForReview {
		t.Errorf("http execution of a configured class: %s; want %s", got, stopForReview)
	}
}

// TestConcludeJournalsEveryHostAnswer carries every host answer out on a real journal, from
// every state a driver asks a host in: the journal takes each verdict (no illegal transition,
// no execution left where it was), with review required exactly when the verdict says so.
func TestConcludeJournalsEveryHostAnswer(t *testing.T) {
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "test")
	if err != nil {
		t.Fatal(err)
	}
	journal, err := markers.Open(filepath.Join(t.TempDir(), "journal"), markers.Options{Graph: markers.JournalGraph, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { journal.Close() })
	b := &Bastion{cfg: DefaultConfig(t.TempDir()), log: slog.New(slog.DiscardHandler), journal: journal, metrics: newMetrics(), ctx: t.Context(), cancels: map[string]bool{}}
	walk := map[markers.State][]markers.State{
		markers.Dispatched: {markers.Authorized, markers.Dispatched},
		markers.Running:    {markers.Authorized, markers.Dispatched, markers.Running},
		markers.Unknown:    {markers.Authorized, markers.Dispatched, markers.Unknown},
	}
	n := 0
	for _, from := range driverStates {
		for _, ms := range hostproto.MarkerStates() {
			for _, confirmed := range []bool{false, true} {
				n++
				id := fmt.Sprintf("ex_%04d", n)
				if _, err := journal.Create(t.Context(), &markers.Record{ID: id, Actor: "a", Channel: "ssh"}); err != nil {
					t.Fatal(err)
				}
				rec, err := journal.Advance(t.Context(), id, markers.Accepted, walk[from], "", nil)
				if err != nil {
					t.Fatal(err)
				}
				d := &driver{id: id, rec: rec, changed: make(chan struct{}), stdout: newTail(1024), stderr: newTail(1024)}
				if confirmed && from != markers.Running {
					d.setStarted(&hostproto.Marker{ID: id, State: hostproto.MarkerStarted, PID: 42, PIDStart: 7})
				}
				m := &hostproto.Marker{ID: id, State: ms, StartError: "cwd /x does not exist"}
				v := execVerdict(id, testHost, execAnswer{First: m, Final: m})
				if !b.conclude(d, v) {
					t.Errorf("from %s, marker %s, confirmed %v: the journal refused %s", from, ms, confirmed, v.To)
					continue
				}
				got, err := journal.Get(id)
				if err != nil {
					t.Fatal(err)
				}
				if got.State != v.To || got.ReviewRequired != v.Review || lastEvidence(got.Evidence) != v.Note {
					t.Errorf("from %s, marker %s, confirmed %v: journal %s (review %v, evidence %q); want %s (review %v, %q)",
						from, ms, confirmed, got.State, got.ReviewRequired, lastEvidence(got.Evidence), v.To, v.Review, v.Note)
				}
				if v.To == markers.Failed && (!got.IsError || got.StartError != v.StartError) {
					t.Errorf("from %s, marker %s: failed record %+v; want is_error and start error %q", from, ms, got, v.StartError)
				}
			}
		}
	}
}
