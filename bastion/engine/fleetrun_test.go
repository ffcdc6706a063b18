package engine_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// Fleet runs on the engine: the fleet's one hostagent enrolled under n names (f1…fn, in
// group "fleet"), so every host of a run is a host of its own to the bastion while the
// test counts, on one disk, what each host's execution did.

// fleetOf enrolls the fleet's hostagent as f1…fn in group fleet, labelled env=prod and
// role=db (even) or role=web (odd).
func (f *testFleet) fleetOf(t testing.TB, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		h := f.hostAs("f" + strconv.Itoa(i))
		h.Groups = []string{"fleet"}
		h.Labels = map[string]string{"env": "prod", "role": []string{"db", "web"}[i%2]}
		f.enroll(t, h)
	}
}

// fleetCommand is a command that records its execution id in the file "effects", its
// start and end in "spans" (for the concurrency a run reached), then does rest.
func (f *testFleet) fleetCommand(rest string) string {
	return `echo "$POSTERN_EXECUTION_ID" >> ` + f.path("effects") +
		`; echo "start $POSTERN_EXECUTION_ID $(date +%s%N)" >> ` + f.path("spans") +
		"; " + rest +
		`; s=$?; echo "end $POSTERN_EXECUTION_ID $(date +%s%N)" >> ` + f.path("spans") + "; exit $s"
}

// effectIDs are the execution ids the commands recorded, in the order they ran.
func (f *testFleet) effectIDs(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(f.path("effects"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

// maxOverlap is the most commands that ran at once, from their spans.
func (f *testFleet) maxOverlap(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile(f.path("spans"))
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		at    int64
		delta int
	}
	var evs []ev
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		fs := strings.Fields(line)
		at, err := strconv.ParseInt(fs[2], 10, 64)
		if err != nil {
			t.Fatalf("span %q: %v", line, err)
		}
		d := 1
		if fs[0] == "end" {
			d = -1
		}
		evs = append(evs, ev{at, d})
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	cur, most := 0, 0
	for _, e := range evs {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// started counts the commands that wrote their effect.
func (f *testFleet) started(t testing.TB) int { return len(f.effectIDs(t)) }

func fleetArgs(cmd, conc, errs string, targets ...string) api.FleetArgs {
	if len(targets) == 0 {
		targets = []string{"group:fleet"}
	}
	return api.FleetArgs{Targets: targets, Command: cmd, MaxConcurrency: api.Limit(conc), MaxErrors: api.Limit(errs), CallOptions: api.CallOptions{WaitS: waitS(60)}}
}

// fleetExec runs a fleet_exec call and fails the test if the engine refuses it.
func (f *testFleet) fleetExec(t testing.TB, c transport.Caller, a api.FleetArgs) *api.Execution {
	t.Helper()
	x, err := f.engine().FleetExec(context.Background(), c, a, nil)
	if err != nil {
		t.Fatalf("fleet_exec %q as %s: %v", a.Command, c.Actor, err)
	}
	if x.Fleet == nil || !markers.ValidFleetRunID(x.ExecutionID) {
		t.Fatalf("fleet_exec answered %+v; want a fleet run", x)
	}
	return x
}

// fleetState waits for run to reach want, and returns its view.
func (f *testFleet) fleetState(t testing.TB, c transport.Caller, run string, want markers.State) *api.Execution {
	t.Helper()
	f.waitState(t, c, run, want)
	x, err := f.engine().Status(context.Background(), c, run)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// checkHosts checks a run's hosts against the journal: each started host has one execution
// that names the run, and ran it at most once.
func (f *testFleet) checkHosts(t testing.TB, x *api.Execution) {
	t.Helper()
	ran := map[string]int{}
	for _, id := range f.effectIDs(t) {
		ran[id]++
	}
	for _, h := range x.Fleet.Hosts {
		if h.ExecutionID == "" {
			continue
		}
		rec := f.record(t, h.ExecutionID)
		if rec.FleetRun != x.ExecutionID || rec.Host != h.Host || rec.Tool != "ssh_exec" {
			t.Errorf("%s: execution %s names run %q on %q (tool %s); want run %s on %s", h.Host, rec.ID, rec.FleetRun, rec.Host, rec.Tool, x.ExecutionID, h.Host)
		}
		if ran[h.ExecutionID] > 1 {
			t.Errorf("%s: %s ran %d times", h.Host, h.ExecutionID, ran[h.ExecutionID])
		}
	}
	if len(ran) > len(x.Fleet.Hosts) {
		t.Errorf("%d executions ran for %d hosts", len(ran), len(x.Fleet.Hosts))
	}
}

// TestFleetRun: one call, one run, one execution per host, each run once, never more at
// once than max_concurrency; a retry of the call joins the run; the run reads as an
// execution (status, output, task state).
func TestFleetRun(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 5)
	a := fleetArgs(f.fleetCommand("sleep 0.2"), "2", "0")
	x := f.fleetExec(t, alice, a)
	if x.State != string(markers.Completed) || x.IsError || x.Fleet.Outcome != "completed" || x.Fleet.Counts["completed"] != 5 || len(x.Fleet.Failed) != 0 {
		t.Fatalf("run = %s (is_error %v), fleet %+v; want completed on all 5", x.State, x.IsError, x.Fleet)
	}
	if x.Fleet.Concurrency != 2 || x.Fleet.Tolerated != 0 || x.Fleet.Total != 5 {
		t.Errorf("brakes = %d at once, %d tolerated of %d; want 2, 0 of 5", x.Fleet.Concurrency, x.Fleet.Tolerated, x.Fleet.Total)
	}
	f.checkHosts(t, x)
	if n := f.started(t); n != 5 {
		t.Fatalf("%d commands ran; want 5", n)
	}
	if most := f.maxOverlap(t); most > 2 || most < 1 {
		t.Errorf("%d commands ran at once; want at most max_concurrency 2", most)
	}
	for i, h := range x.Fleet.Hosts {
		if h.Host != "f"+strconv.Itoa(i+1) || h.State != string(markers.Completed) {
			t.Errorf("host %d = %+v; want f%d completed", i, h, i+1)
		}
	}
	if !strings.Contains(x.Summary(), "5 completed") {
		t.Errorf("summary %q; want the counts", x.Summary())
	}

	// The same call again joins the run: nothing runs again.
	again := f.fleetExec(t, alice, a)
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("retry = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	if n := f.started(t); n != 5 {
		t.Fatalf("after the retry %d commands ran; want still 5", n)
	}
	// Status, output and task state work on the run; another actor sees none of it.
	ctx := context.Background()
	if st, err := f.engine().Status(ctx, alice, x.ExecutionID); err != nil || st.Fleet == nil || st.Fleet.Counts["completed"] != 5 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	if out, err := f.engine().Output(ctx, alice, api.OutputArgs{ExecutionID: x.ExecutionID, WaitS: waitS(0)}); err != nil || out.Fleet == nil {
		t.Fatalf("output = %+v, %v", out, err)
	}
	if ts, err := f.engine().State(alice, x.ExecutionID); err != nil || ts.State != string(markers.Completed) {
		t.Fatalf("task state = %+v, %v", ts, err)
	}
	if end, err := f.engine().AwaitEnd(ctx, alice, x.ExecutionID, nil); err != nil || end.Fleet == nil || end.State != string(markers.Completed) {
		t.Fatalf("await end = %+v, %v", end, err)
	}
	_, err := f.engine().Status(ctx, bob, x.ExecutionID)
	wantCode(t, err, api.CodeNotFound)
	// Each host's execution reads as itself, naming its run.
	child, err := f.engine().Status(ctx, alice, x.Fleet.Hosts[0].ExecutionID)
	if err != nil || child.FleetRun != x.ExecutionID || child.Host != "f1" {
		t.Fatalf("host execution = %+v, %v; want f1's, of run %s", child, err, x.ExecutionID)
	}
}

// TestFleetRunByLabels: a labels target selects the hosts that carry every label; the same
// labels written in another order are the same call, joining the same run.
func TestFleetRunByLabels(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 5)
	x := f.fleetExec(t, alice, fleetArgs(f.fleetCommand("true"), "100%", "0", "role=db,env=prod"))
	var hosts []string
	for _, h := range x.Fleet.Hosts {
		hosts = append(hosts, h.Host)
	}
	if !slices.Equal(hosts, []string{"f2", "f4"}) || x.Fleet.Counts["completed"] != 2 {
		t.Fatalf("hosts %v, counts %v; want f2 and f4 completed", hosts, x.Fleet.Counts)
	}
	again := f.fleetExec(t, alice, fleetArgs(f.fleetCommand("true"), "100%", "0", " env=prod, role=db"))
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("the same labels reordered = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	if n := f.started(t); n != 2 {
		t.Fatalf("%d commands ran; want 2", n)
	}
}

// TestFleetRunStopsAfterMaxErrors: once more hosts failed than max_errors tolerates, no new
// host starts; the run ends stopped, the hosts never started said so.
func TestFleetRunStopsAfterMaxErrors(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 5)
	x := f.fleetExec(t, alice, fleetArgs(f.fleetCommand("echo broken >&2; exit 3"), "1", "20%")) // 20% of 5: 1 tolerated
	if x.State != string(markers.Completed) || !x.IsError || x.Fleet.Outcome != "stopped" {
		t.Fatalf("run = %s (is_error %v) outcome %q; want completed, is_error, stopped", x.State, x.IsError, x.Fleet.Outcome)
	}
	if x.Fleet.Counts["completed"] != 2 || x.Fleet.Counts[api.NotStarted] != 3 || len(x.Fleet.Failed) != 2 {
		t.Fatalf("counts %v, failed %+v; want 2 failed, 3 not started", x.Fleet.Counts, x.Fleet.Failed)
	}
	if n := f.started(t); n != 2 {
		t.Fatalf("%d commands ran; want 2 (stopped after the second failure)", n)
	}
	if h := x.Fleet.Failed[0]; h.ExitCode == nil || *h.ExitCode != 3 || h.Cause != "stderr: broken" {
		t.Errorf("failed host %+v; want exit 3, cause its stderr", h)
	}
	if !strings.Contains(x.Next, "3 hosts never started") {
		t.Errorf("next %q; want it to say what never started", x.Next)
	}
	f.checkHosts(t, x)
}

// TestFleetRunPolicyPerHost: every host is decided as an ssh_exec there. A host the policy
// denies is a failed host of the run, its refusal the cause; one approval, showing every
// host, stands for the run, and no host of an approved run is asked again.
func TestFleetRunPolicyPerHost(t *testing.T) {
	f := newFleet(t, func(cfg *config.Config) {
		cfg.Rules = []policy.Rule{
			{Name: "no-f2", Decision: policy.DecisionDeny, Hosts: []string{"f2"}},
			approvalRule("f3"),
		}
	})
	f.fleetOf(t, 4)
	a := fleetArgs(f.fleetCommand("true"), "4", "1")
	a.Reason = "roll the config"
	x := f.fleetExec(t, alice, a)
	if x.State != string(markers.AwaitingApproval) {
		t.Fatalf("run = %s; want awaiting_approval", x.State)
	}
	page, err := f.engine().PendingApprovals(10)
	if err != nil || len(page.Approvals) != 1 {
		t.Fatalf("approvals = %+v, %v; want the run's one", page, err)
	}
	req := page.Approvals[0]
	if req.ExecutionID != x.ExecutionID || !slices.Equal(req.Hosts, []string{"f1", "f2", "f3", "f4"}) || req.Reason != "roll the config" ||
		!strings.Contains(req.Message(), "4 hosts (f1, f2, f3, f4)") {
		t.Fatalf("approval request = %+v; want the run with its 4 hosts", req)
	}
	if n := f.started(t); n != 0 {
		t.Fatalf("%d commands ran before the approval", n)
	}
	if _, err := f.engine().Approve(context.Background(), testOperator, x.ExecutionID, "ok"); err != nil {
		t.Fatal(err)
	}
	x = f.fleetState(t, alice, x.ExecutionID, markers.Completed)
	if !x.IsError || x.Fleet.Outcome != "failed" || x.Fleet.Counts["completed"] != 3 || x.Fleet.Counts["rejected"] != 1 {
		t.Fatalf("run = is_error %v outcome %q counts %v; want 3 completed, f2 rejected", x.IsError, x.Fleet.Outcome, x.Fleet.Counts)
	}
	if len(x.Fleet.Failed) != 1 || x.Fleet.Failed[0].Host != "f2" || !strings.Contains(x.Fleet.Failed[0].Cause, "no-f2") {
		t.Fatalf("failed = %+v; want f2 with the deny rule as its cause", x.Fleet.Failed)
	}
	if page, _ := f.engine().PendingApprovals(10); len(page.Approvals) != 0 {
		t.Fatalf("approvals after the run's: %+v; want none", page.Approvals)
	}
	f3 := f.record(t, x.Fleet.Hosts[2].ExecutionID)
	if f3.State != markers.Completed || !slices.ContainsFunc(f3.Evidence, func(e string) bool { return strings.Contains(e, "approved with its fleet run") }) {
		t.Errorf("f3 = %s, evidence %q; want it run on the run's approval", f3.State, f3.Evidence)
	}
	f.checkHosts(t, x)
	if n := f.started(t); n != 3 {
		t.Fatalf("%d commands ran; want 3", n)
	}
}

// TestFleetRunRejectedEverywhere: a run the policy refuses on every host is rejected, and
// nothing is journaled for its hosts.
func TestFleetRunRejectedEverywhere(t *testing.T) {
	f := newFleet(t, func(cfg *config.Config) {
		cfg.Rules = []policy.Rule{{Name: "no-reboot", Decision: policy.DecisionDeny, Commands: []string{"reboot"}}}
	})
	f.fleetOf(t, 3)
	x := f.fleetExec(t, alice, fleetArgs("reboot", "3", "0"))
	if x.State != string(markers.Rejected) || x.Fleet.Counts[api.NotStarted] != 3 {
		t.Fatalf("run = %s, counts %v; want rejected, nothing started", x.State, x.Fleet.Counts)
	}
	if n := f.journaled(t); n != 1 {
		t.Fatalf("journal holds %d records; want the run alone", n)
	}
}

// TestFleetRunArguments: a call the bastion cannot run is refused before anything is
// journaled, saying what to fix.
func TestFleetRunArguments(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 2)
	for _, tc := range []struct {
		a    api.FleetArgs
		code string
		says string
	}{
		{fleetArgs("true", "", "0"), api.CodeInvalidArgument, "max_concurrency is required"},
		{fleetArgs("true", "1", ""), api.CodeInvalidArgument, "max_errors is required"},
		{fleetArgs("true", "0", "0"), api.CodeInvalidArgument, "at least 1"},
		{fleetArgs("true", "150%", "0"), api.CodeInvalidArgument, "at most 100%"},
		{fleetArgs("true", "1", "0", "group:nope"), api.CodeUnknownHost, `"group:nope" selects no enrolled host`},
		{fleetArgs("true", "1", "0", "f1", "f9"), api.CodeUnknownHost, `"f9" selects no enrolled host`},
		{fleetArgs("", "1", "0"), api.CodeInvalidArgument, "command is required"},
		{api.FleetArgs{Command: "true", MaxConcurrency: "1", MaxErrors: "0"}, api.CodeInvalidArgument, "targets"},
	} {
		_, err := f.engine().FleetExec(context.Background(), alice, tc.a, nil)
		te := wantCode(t, err, tc.code)
		if !strings.Contains(te.Message, tc.says) {
			t.Errorf("%+v: %q; want it to say %q", tc.a, te.Message, tc.says)
		}
	}
	if n := f.journaled(t); n != 0 {
		t.Fatalf("journal holds %d records after refused calls", n)
	}
}

// TestFleetRunSurvivesRestart: a bastion stopped mid-run goes on from the journal: the
// hosts started are reconciled (their commands run once), the others are started under the
// same brakes.
func TestFleetRunSurvivesRestart(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 4)
	a := fleetArgs(f.fleetCommand(f.gate("go")), "2", "0")
	a.WaitS = waitS(0)
	x := f.fleetExec(t, alice, a)
	testutil.WaitFor(t, "two hosts to start", func() bool { return f.started(t) == 2 })
	f.reopen(t)
	time.Sleep(300 * time.Millisecond) // a restarted driver that started more would show now
	if n := f.started(t); n != 2 {
		t.Fatalf("after the restart %d commands started; want still 2", n)
	}
	f.release(t, "go")
	x = f.fleetState(t, alice, x.ExecutionID, markers.Completed)
	if x.IsError || x.Fleet.Counts["completed"] != 4 {
		t.Fatalf("run = is_error %v counts %v; want 4 completed", x.IsError, x.Fleet.Counts)
	}
	f.checkHosts(t, x)
	if n := f.started(t); n != 4 {
		t.Fatalf("%d commands ran; want 4, once each", n)
	}
	if most := f.maxOverlap(t); most > 2 {
		t.Errorf("%d commands ran at once; want at most 2", most)
	}
	if n := f.journaled(t); n != 5 {
		t.Fatalf("journal holds %d records; want the run and its 4 executions", n)
	}
}

// TestFleetRunCancel: a cancel starts no more hosts and stops the running ones.
func TestFleetRunCancel(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 4)
	a := fleetArgs(f.fleetCommand(f.gate("never")), "2", "0")
	a.WaitS = waitS(0)
	x := f.fleetExec(t, alice, a)
	testutil.WaitFor(t, "two hosts to start", func() bool { return f.started(t) == 2 })
	// postern status shows the run in flight.
	o, err := f.engine().Overview()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(o.InFlight, func(it api.OverviewItem) bool { return it.Record.ID == x.ExecutionID }) {
		t.Errorf("in flight %+v; want the run among them", o.InFlight)
	}
	if _, err := f.engine().Cancel(context.Background(), alice, x.ExecutionID); err != nil {
		t.Fatal(err)
	}
	x = f.fleetState(t, alice, x.ExecutionID, markers.Cancelled)
	if x.Fleet.Counts["cancelled"] != 2 || x.Fleet.Counts[api.NotStarted] != 2 || x.Fleet.Outcome != "cancelled" {
		t.Fatalf("counts %v outcome %q; want 2 cancelled, 2 never started", x.Fleet.Counts, x.Fleet.Outcome)
	}
	if n := f.started(t); n != 2 {
		t.Fatalf("%d commands started; want 2", n)
	}
	rec := f.record(t, x.ExecutionID)
	if rec.Fleet.CancelledBy != alice.Actor {
		t.Errorf("cancelled by %q; want %s", rec.Fleet.CancelledBy, alice.Actor)
	}
}

// TestFleetRunHostReEnrolled: a host enrolled again with another key after the run was
// accepted is not sent the command: its execution fails with the reason.
func TestFleetRunHostReEnrolled(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 2)
	a := fleetArgs(f.fleetCommand(f.gate("go")), "1", "1")
	a.WaitS = waitS(0)
	x := f.fleetExec(t, alice, a)
	testutil.WaitFor(t, "f1 to start", func() bool { return f.started(t) == 1 })
	h := f.hostAs("f2")
	h.Groups, h.HostKey = []string{"fleet"}, testutil.NewSSHKey(t).Public()
	f.enroll(t, h)
	f.release(t, "go")
	x = f.fleetState(t, alice, x.ExecutionID, markers.Completed)
	if len(x.Fleet.Failed) != 1 || x.Fleet.Failed[0].Host != "f2" || x.Fleet.Failed[0].State != string(markers.Failed) ||
		!strings.Contains(x.Fleet.Failed[0].Cause, "enrolled again") {
		t.Fatalf("failed = %+v; want f2 failed, enrolled again", x.Fleet.Failed)
	}
	if n := f.started(t); n != 1 {
		t.Fatalf("%d commands ran; want 1", n)
	}
}

// TestFleetRunKeyedAcrossRuns: with an idempotency key, the same call from another agent
// run joins the fleet run; another request under the key is refused.
func TestFleetRunKeyedAcrossRuns(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 2)
	a := fleetArgs(f.fleetCommand("true"), "2", "0")
	a.IdempotencyKey = "deploy-7"
	x := f.fleetExec(t, inRun(alice, "one"), a)
	again := f.fleetExec(t, inRun(alice, "two"), a)
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("keyed retry = %s replayed %v; want %s", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	other := a
	other.MaxConcurrency = "1"
	_, err := f.engine().FleetExec(context.Background(), inRun(alice, "two"), other, nil)
	wantCode(t, err, api.CodeIdempotencyKeyReused)
	if n := f.started(t); n != 2 {
		t.Fatalf("%d commands ran; want 2", n)
	}
}

// TestFleetRunInvestigate: investigate answers the five questions for the run and for each
// host it started.
func TestFleetRunInvestigate(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 3)
	x := f.fleetExec(t, alice, fleetArgs(f.fleetCommand("exit 2"), "1", "0"))
	if x.Fleet.Outcome != "stopped" {
		t.Fatalf("outcome %q; want stopped after the first failure", x.Fleet.Outcome)
	}
	inv, err := f.engine().Investigate(context.Background(), x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if x.Fleet.Failures != 1 || !strings.Contains(x.Summary(), "1 failed (max_errors tolerates 0)") {
		t.Errorf("failures %d, summary %q; want 1 failed of 0 tolerated", x.Fleet.Failures, x.Summary())
	}
	if len(inv.Answers) != 5 || !strings.Contains(inv.Answers[2], "1 completed, 2 not_started") || !strings.Contains(inv.Answers[2], "2 never started") {
		t.Fatalf("the run's answers %q; want five, the outcome naming its hosts' counts", inv.Answers)
	}
	if len(inv.Hosts) != 1 || inv.Hosts[0].ExecutionID != x.Fleet.Hosts[0].ExecutionID || len(inv.Hosts[0].Answers) != 5 ||
		!strings.Contains(inv.Hosts[0].Answers[2], "exit 2") {
		t.Fatalf("hosts = %+v; want f1's five answers, exit 2 observed", inv.Hosts)
	}
	if a := inv.Hosts[0].Answers[3]; !strings.Contains(a, "part of fleet run "+x.ExecutionID) {
		t.Errorf("f1's delivery answer %q; want it to name its run", a)
	}
}

// TestOperatorFleetRun: an operator starts a fleet run for a configured actor, whose policy
// decides it; the run is the operator's (no agent sees or joins it), and a uid an agent may
// run as may not start one.
func TestOperatorFleetRun(t *testing.T) {
	f := newFleet(t, func(cfg *config.Config) {
		cfg.Rules = []policy.Rule{{Name: "no-f2-for-alice", Decision: policy.DecisionDeny, Actors: []string{"alice"}, Hosts: []string{"f2"}}}
	})
	f.fleetOf(t, 2)
	ctx := context.Background()
	a := fleetArgs(f.fleetCommand("true"), "2", "1")
	_, err := f.engine().OperatorFleetRun(ctx, testOperator, "alice", a)
	wantCode(t, err, api.CodeInvalidArgument) // no run_id
	a.RunID = "cli-1"
	_, err = f.engine().OperatorFleetRun(ctx, testOperator, "nobody", a)
	wantCode(t, err, api.CodeInvalidArgument)
	_, err = f.engine().OperatorFleetRun(ctx, api.Operator{Name: "operator:me", UID: os.Getuid()}, "alice", a)
	wantCode(t, err, api.CodeNotAnOperator)

	x, err := f.engine().OperatorFleetRun(ctx, testOperator, "alice", a)
	if err != nil {
		t.Fatal(err)
	}
	if x.Fleet.Counts["completed"] != 1 || x.Fleet.Counts["rejected"] != 1 {
		t.Fatalf("counts %v; want f1 completed, f2 rejected by alice's policy", x.Fleet.Counts)
	}
	rec := f.record(t, x.ExecutionID)
	if rec.Actor != testOperator.Name || rec.PolicyActor != "alice" {
		t.Fatalf("run actor %q, policy actor %q; want the operator's run, decided as alice", rec.Actor, rec.PolicyActor)
	}
	_, err = f.engine().Status(ctx, alice, x.ExecutionID)
	wantCode(t, err, api.CodeNotFound)
	again, err := f.engine().OperatorFleetRun(ctx, testOperator, "alice", a)
	if err != nil || again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("the same invocation again = %+v, %v; want %s replayed", again, err, x.ExecutionID)
	}
	if n := f.started(t); n != 1 {
		t.Fatalf("%d commands ran; want 1", n)
	}
}

// TestFleetRunDailyQuota: every host a run may start counts toward its actor's daily quota,
// checked whole before anything starts; the hosts' executions then count as any other.
func TestFleetRunDailyQuota(t *testing.T) {
	f := newFleet(t, func(c *config.Config) { c.Actors[0].DailyQuota = 3 })
	f.fleetOf(t, 4)
	_, err := f.engine().FleetExec(context.Background(), alice, fleetArgs(f.fleetCommand("true"), "4", "0"), nil)
	wantCode(t, err, api.CodeQuotaExceeded)
	if n := f.journaled(t); n != 0 {
		t.Fatalf("journal holds %d records after the refusal; want none", n)
	}
	x := f.fleetExec(t, alice, fleetArgs(f.fleetCommand("true"), "2", "0", "f1", "f2"))
	if x.Fleet.Counts["completed"] != 2 {
		t.Fatalf("counts %v; want 2 completed", x.Fleet.Counts)
	}
	_, err = f.engine().FleetExec(context.Background(), alice, fleetArgs(f.fleetCommand("true"), "2", "0", "f3", "f4"), nil)
	wantCode(t, err, api.CodeQuotaExceeded)
	if n := f.started(t); n != 2 {
		t.Fatalf("%d commands ran; want 2", n)
	}
}

// TestFleetRunUsableHosts: targets select among the hosts the actor may use: a group never
// sweeps in one its policy keeps it from, and naming one finds nothing.
func TestFleetRunUsableHosts(t *testing.T) {
	f := newFleet(t, func(c *config.Config) { c.Actors[0].Hosts = []string{"f1", "f2"} })
	f.fleetOf(t, 4)
	x := f.fleetExec(t, alice, fleetArgs(f.fleetCommand("true"), "4", "0"))
	if x.Fleet.Total != 2 || x.Fleet.Counts["completed"] != 2 || x.Fleet.Hosts[1].Host != "f2" {
		t.Fatalf("run of group:fleet = %+v; want f1 and f2 only", x.Fleet)
	}
	_, err := f.engine().FleetExec(context.Background(), alice, fleetArgs("true", "1", "0", "f3"), nil)
	if te := wantCode(t, err, api.CodeUnknownHost); !strings.Contains(te.Message, `"f3" selects no enrolled host`) {
		t.Errorf("naming f3: %q", te.Message)
	}
}

// TestFleetRunHostRemovedByRetention: a host's execution that the journal's retention
// removed while its run still went on is never started again: its tombstone stands for it,
// for a driver started after a restart as for the one that made it.
func TestFleetRunHostRemovedByRetention(t *testing.T) {
	f := newFleet(t)
	f.fleetOf(t, 2)
	first := f.path("first")
	a := fleetArgs(f.fleetCommand("if [ -e "+first+" ]; then "+f.gate("go")+"; else touch "+first+"; fi"), "1", "0")
	a.WaitS = waitS(0)
	x := f.fleetExec(t, alice, a)
	testutil.WaitFor(t, "f1 to end and f2 to start", func() bool { return f.started(t) == 2 })
	f.clock.advance(31 * 24 * time.Hour) // past remote_command's 30 days
	p, err := f.engine().RetentionPass(context.Background(), false)
	if err != nil || p.Records != 1 {
		t.Fatalf("retention pass = %+v, %v; want f1's execution removed", p, err)
	}
	f.reopen(t)
	f.release(t, "go")
	x = f.fleetState(t, alice, x.ExecutionID, markers.Completed)
	if x.IsError || x.Fleet.Counts["completed"] != 2 || x.Fleet.Hosts[0].ExecutionID == "" {
		t.Fatalf("run = is_error %v, hosts %+v; want both completed, f1 by its tombstone", x.IsError, x.Fleet.Hosts)
	}
	if n := f.started(t); n != 2 {
		t.Fatalf("%d commands ran; want 2, f1 never again", n)
	}
	if _, err := f.engine().Investigate(context.Background(), x.ExecutionID); err != nil {
		t.Fatalf("investigate with a host removed: %v", err)
	}
}
