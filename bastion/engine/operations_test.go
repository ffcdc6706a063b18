package engine_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestExecutions: the operator's list filters by actor, host, state and review, pages by
// cursor, and refuses a cursor it did not hand out.
func TestExecutions(t *testing.T) {
	f := newFleet(t)
	one := f.exec(t, inRun(alice, "r1"), api.ExecArgs{Host: "h1", Command: "echo one"})
	two := f.exec(t, inRun(alice, "r2"), api.ExecArgs{Host: "h1", Command: "exit 1"})
	theirs := f.exec(t, bob, api.ExecArgs{Host: "h1", Command: "echo bob"})

	first, err := f.engine().Executions(api.ExecutionQuery{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		q    api.ExecutionQuery
		want []string
	}{
		{name: "all", want: []string{theirs.ExecutionID, two.ExecutionID, one.ExecutionID}},
		{name: "actor", q: api.ExecutionQuery{Actor: alice.Actor}, want: []string{two.ExecutionID, one.ExecutionID}},
		{name: "host", q: api.ExecutionQuery{Host: "h1", Limit: 1}, want: []string{theirs.ExecutionID}},
		{name: "other host", q: api.ExecutionQuery{Host: "h2"}, want: nil},
		{name: "state", q: api.ExecutionQuery{State: markers.Running}, want: nil},
		{name: "review required", q: api.ExecutionQuery{ReviewRequired: true}, want: nil},
		{name: "next page", q: api.ExecutionQuery{Limit: 2, Cursor: first.Next}, want: []string{one.ExecutionID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := f.engine().Executions(tt.q)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := joinIDs(page.Executions, recordID), strings.Join(tt.want, ","); got != want {
				t.Errorf("got = %s; want %s", got, want)
			}
		})
	}
	_, err = f.engine().Executions(api.ExecutionQuery{Cursor: "garbage"})
	wantCode(t, err, api.CodeInvalidArgument)
}

// TestExecutionDetail: one execution's record, events, agent run and stored output, and its
// output read from an offset.
func TestExecutionDetail(t *testing.T) {
	f := newFleet(t)
	c := inRun(alice, "r1")
	args := api.ExecArgs{Host: "h1", Command: "echo one"}
	x := f.exec(t, c, args)
	f.exec(t, c, args) // a retry: a joined event

	d, err := f.engine().Execution(x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, ev := range d.Events {
		kinds = append(kinds, string(ev.Kind))
	}
	if d.Record.ID != x.ExecutionID || d.Events[0].Kind != markers.KindCreate || d.Events[len(d.Events)-1].Kind != markers.KindJoined {
		t.Errorf("events %v; want the create first and the retry's joined event last", kinds)
	}
	if d.Run == nil || d.Run.Scope != "run:r1" || d.Run.RunID != "r1" || d.Run.Token != "alice" {
		t.Errorf("run = %+v; want alice's run r1", d.Run)
	}
	if d.Output == nil || d.Output.Stdout != "one\n" {
		t.Errorf("output = %+v; want one", d.Output)
	}
	if _, err := f.engine().Execution("ex_00000000000000000000000000"); !errors.Is(err, markers.ErrNotFound) {
		t.Errorf("detail of an unknown execution = %v; want ErrNotFound", err)
	}
	out, err := f.engine().ReadOutput(context.Background(), x.ExecutionID, api.OutputArgs{ExecutionID: x.ExecutionID, StdoutOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	if out.Stdout != "ne\n" || out.StdoutOffset != 1 {
		t.Errorf("operator's read from 1 = %q at %d; want \"ne\\n\" at 1", out.Stdout, out.StdoutOffset)
	}
}

// TestRuns lists agent runs by actor and by scope.
func TestRuns(t *testing.T) {
	f := newFleet(t)
	f.exec(t, inRun(alice, "r1"), api.ExecArgs{Host: "h1", Command: "echo one"})
	f.exec(t, inRun(alice, "r2"), api.ExecArgs{Host: "h1", Command: "echo two"})
	f.exec(t, inRun(bob, "r1"), api.ExecArgs{Host: "h1", Command: "echo bob"})
	tests := []struct {
		name, actor, scope string
		want               []string // actor/scope of each run, newest first
	}{
		{name: "an actor's", actor: alice.Actor, want: []string{"token:alice/run:r2", "token:alice/run:r1"}},
		{name: "a scope's", scope: "run:r1", want: []string{"token:bob/run:r1", "token:alice/run:r1"}},
		{name: "an actor's scope", actor: bob.Actor, scope: "run:r2", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := f.engine().Runs(tt.actor, tt.scope, 10)
			if err != nil {
				t.Fatal(err)
			}
			got := joinIDs(page.Runs, func(r *markers.Run) string { return r.Actor + "/" + r.Scope })
			if want := strings.Join(tt.want, ","); got != want {
				t.Errorf("got = %s; want %s", got, want)
			}
		})
	}
}

// TestPolicyCheck: the running policy's decision, with the host's groups from the inventory;
// nothing runs.
func TestPolicyCheck(t *testing.T) {
	f := newGatedFleet(t)
	db := f.hostAs("db-1")
	db.Groups = []string{"prod"}
	f.enroll(t, db)
	tests := []struct {
		name     string
		req      policy.Request
		want     policy.Outcome
		wantRule string
	}{
		{name: "authorized", req: policy.Request{Actor: "alice", Tool: policy.ToolSSHExec, Host: "h1", Command: "true"}, want: policy.Authorized},
		{name: "the enrolled account needs no grant", req: policy.Request{Actor: "alice", Tool: policy.ToolSSHExec, Host: "h1", Command: "true", Account: f.hostAs("h1").Account}, want: policy.Authorized},
		{name: "another account needs a grant", req: policy.Request{Actor: "alice", Tool: policy.ToolSSHExec, Host: "h1", Command: "true", Account: "postgres"}, want: policy.Rejected, wantRule: "account postgres on host h1 not allowed"},
		{name: "approval by host", req: policy.Request{Actor: "alice", Tool: policy.ToolSSHExec, Host: "gated", Command: "true"}, want: policy.AwaitingApproval, wantRule: "ask-on-gated"},
		{name: "unknown actor", req: policy.Request{Actor: "mallory", Tool: policy.ToolSSHExec, Host: "h1", Command: "true"}, want: policy.Rejected},
		{name: "host not enrolled", req: policy.Request{Actor: "alice", Tool: policy.ToolSSHExec, Host: "nope", Command: "true"}, want: policy.Authorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.engine().PolicyCheck(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if got.Outcome != tt.want || !strings.Contains(got.Rule, tt.wantRule) {
				t.Errorf("got = %s (%s); want %s (%s)", got.Outcome, got.Rule, tt.want, tt.wantRule)
			}
		})
	}
	// The groups come from the inventory: a rule on group prod applies to db-1.
	f.cfg.Rules = append(f.cfg.Rules, policy.Rule{Name: "prod-denied", Decision: policy.DecisionDeny, Hosts: []string{"group:prod"}})
	e := f.reopen(t)
	got, err := e.PolicyCheck(policy.Request{Actor: "alice", Tool: policy.ToolSSHExec, Host: "db-1", Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Outcome != policy.Rejected || !strings.Contains(got.Rule, "prod-denied") {
		t.Errorf("db-1 in group prod = %s (%s); want rejected by prod-denied", got.Outcome, got.Rule)
	}
	if n := f.journaled(t); n != 0 {
		t.Errorf("%d executions journaled by policy checks; want 0", n)
	}
}

// TestExportAudit: the exported event log verifies with the journal's audit key.
func TestExportAudit(t *testing.T) {
	f := newFleet(t)
	f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "echo one"})
	var buf bytes.Buffer
	if err := f.engine().ExportAudit(&buf); err != nil {
		t.Fatal(err)
	}
	key, err := f.engine().AuditKey()
	if err != nil {
		t.Fatal(err)
	}
	export := buf.Bytes()
	if !bytes.Contains(export, []byte("echo one")) {
		t.Fatalf("the export lacks the execution")
	}
	rep, err := markers.VerifyJSONL(bytes.NewReader(export), key, markers.VerifyOptions{RequireSealed: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Events == 0 {
		t.Errorf("verification = %s; want PASS", rep)
	}
	tampered := bytes.Replace(export, []byte("echo one"), []byte("echo two"), 1)
	if rep, err := markers.VerifyJSONL(bytes.NewReader(tampered), key, markers.VerifyOptions{RequireSealed: true}); err != nil || rep.OK {
		t.Errorf("verification of a tampered export = %s, %v; want FAIL", rep, err)
	}
}

// TestHostMarkers: the operator reads a hostagent's markers through its control protocol.
func TestHostMarkers(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	var ids []string
	for _, cmd := range []string{"echo one", "echo two"} {
		x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: cmd})
		finished(t, x)
		ids = append(ids, x.ExecutionID)
	}
	page, err := f.engine().HostMarkers(ctx, "h1", api.MarkerQuery{State: "exited", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if page.Host != "h1" || len(page.Markers) != 1 || page.Markers[0].ID != ids[1] || page.Next == "" {
		t.Fatalf("first page = %+v; want the newest marker and a cursor", page)
	}
	page, err = f.engine().HostMarkers(ctx, "h1", api.MarkerQuery{State: "exited", Limit: 1, Cursor: page.Next})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Markers) != 1 || page.Markers[0].ID != ids[0] {
		t.Errorf("second page = %+v; want %s", page.Markers, ids[0])
	}
	m, err := f.engine().HostMarker(ctx, "h1", ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if m.State != hostproto.MarkerExited || m.ExitCode == nil || *m.ExitCode != 0 {
		t.Errorf("marker = %+v; want exited 0", m)
	}
	if _, err := f.engine().HostMarker(ctx, "h1", "ex_00000000000000000000000000"); !errors.Is(err, markers.ErrNotFound) {
		t.Errorf("marker of an execution the host never had = %v; want ErrNotFound", err)
	}
	if _, err := f.engine().HostMarkers(ctx, "nope", api.MarkerQuery{}); !errors.Is(err, fleet.ErrUnknownHost) {
		t.Errorf("markers of an unknown host = %v; want ErrUnknownHost", err)
	}
	if _, err := f.engine().HostMarker(ctx, "nope", ids[0]); !errors.Is(err, fleet.ErrUnknownHost) {
		t.Errorf("marker on an unknown host = %v; want ErrUnknownHost", err)
	}
}

// TestInvestigate answers the five questions about a retried call.
func TestInvestigate(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	c := inRun(alice, "r1")
	args := api.ExecArgs{Host: "h1", Command: "echo one"}
	x := f.exec(t, c, args)
	f.exec(t, c, args)
	f.exec(t, inRun(alice, "r2"), args) // the same command from another run: a related intent

	inv, err := f.engine().Investigate(ctx, x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Answers) != 5 {
		t.Fatalf("%d answers; want 5", len(inv.Answers))
	}
	want := []struct {
		answer int
		says   string
	}{
		{answerWho, "One agent run sent 2 calls: run:r1 — token alice, run id r1"},
		{answerWho, "Other agent runs of the same actor sent the same command"},
		{answerAuthorization, "policy decided authorized"},
		{answerAuthorization, "Dispatched "},
		{answerOutcome, "Yes: the bastion observed exit 0"},
		{answerOutcome, "asked now, has marker " + x.ExecutionID + ": exited, exit 0"},
		{answerDelivery, "the result is not delivered (completed_result_not_delivered); a retry replays it"},
		{answerLater, "its stored result was replayed, nothing dispatched"},
	}
	for _, w := range want {
		if got := inv.Answers[w.answer]; !strings.Contains(got, w.says) {
			t.Errorf("answer %d: got = %q; want it to say %q", w.answer+1, got, w.says)
		}
	}
	if len(inv.Calls) != 2 || len(inv.Related) != 1 || inv.Outcome.Marker == nil {
		t.Errorf("calls %d, related %d, marker %v; want 2 calls, 1 related, the host's marker", len(inv.Calls), len(inv.Related), inv.Outcome.Marker)
	}

	if err := f.engine().DeliveryJournal().Delivered(ctx, x.ExecutionID); err != nil {
		t.Fatal(err)
	}
	if inv, err = f.engine().Investigate(ctx, x.ExecutionID); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(inv.Answers[answerDelivery], "The result counts as delivered") || len(inv.Delivery.Deliveries) != 1 {
		t.Errorf("delivery after Delivered = %q (%d deliveries); want it delivered once", inv.Answers[answerDelivery], len(inv.Delivery.Deliveries))
	}
	if _, err := f.engine().Investigate(ctx, "ex_00000000000000000000000000"); !errors.Is(err, markers.ErrNotFound) {
		t.Errorf("investigate an unknown execution = %v; want ErrNotFound", err)
	}
}

// TestDoctor: a host up reports its version; a host down and a host presenting another key
// report the problem with its fix.
func TestDoctor(t *testing.T) {
	f := newFleet(t)
	down, _ := testutil.ClosedAddr(t)
	gone, imposter := f.hostAs("down"), f.hostAs("imposter")
	gone.Addr = down
	imposter.HostKey = testutil.NewSSHKey(t).Public()
	f.enroll(t, gone)
	f.enroll(t, imposter)
	rep, err := f.engine().Doctor(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]api.HostHealth{}
	for _, h := range rep.Hosts {
		got[h.Name] = h
	}
	if h := got["h1"]; !h.OK || h.Version == "" || h.Problem != "" {
		t.Errorf("h1 = %+v; want ok with its version", h)
	}
	tests := []struct{ host, fix string }{
		{"down", "is postern-hostagent running on down"},
		{"imposter", "the host presents another key than the one enrolled"},
	}
	for _, tt := range tests {
		if h := got[tt.host]; h.OK || h.Problem == "" || !strings.Contains(h.Fix, tt.fix) {
			t.Errorf("%s = %+v; want a problem with the fix %q", tt.host, h, tt.fix)
		}
	}
}

// TestMetrics: the metrics handler serves the engine's series, the executions in flight
// counted from the journal.
func TestMetrics(t *testing.T) {
	f := newGatedFleet(t)
	f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "true"})
	f.exec(t, alice, api.ExecArgs{Host: "gated", Command: "true"})
	rec := httptest.NewRecorder()
	f.engine().MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		"postern_executions_accepted_total 2",
		`postern_executions{state="awaiting_approval"} 1`,
		`postern_execution_outcomes_total{state="completed"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
