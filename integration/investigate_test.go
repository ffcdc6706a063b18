package integration

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// These tests ask `postern investigate --json` (the real CLI, through the operator socket)
// about retried calls made by real clients, and check all five answers each time: who sent
// the calls, authorization and dispatch, the observed outcome and the host's marker, delivery,
// and what every later call amounted to.

// investigate runs `postern investigate ID --json` against the fleet's bastion.
func investigate(t *testing.T, b *harness.Bastion, id string) *api.Investigation {
	t.Helper()
	out := postern(t, b, "investigate", id, "--json")
	var inv api.Investigation
	if err := json.Unmarshal(out, &inv); err != nil {
		t.Fatalf("investigate --json printed %s: %v", out, err)
	}
	if len(inv.Answers) != 5 {
		t.Fatalf("investigate answered %d questions; want 5: %+v", len(inv.Answers), inv)
	}
	t.Logf("investigate %s:\n%s", id, strings.Join(inv.Answers, "\n"))
	return &inv
}

// postern runs the operator CLI against b and returns its stdout; it fails the test on a
// non-zero exit.
func postern(t *testing.T, b *harness.Bastion, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(harness.Binary(t, "postern"), append(args, "--config", b.ConfigPath)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("postern %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// checkDispatched checks answer 2: authorized by policy and dispatched.
func checkDispatched(t *testing.T, inv *api.Investigation) {
	t.Helper()
	a := inv.Authorization
	if a.Decision != "authorized" || a.Rule == "" || a.AuthorizedAt == nil || a.DispatchedAt == nil {
		t.Errorf("authorization = %+v; want authorized by a rule, with authorization and dispatch times", a)
	}
	if !strings.Contains(inv.Answers[1], "Dispatched") {
		t.Errorf("answer 2 = %q; want the dispatch time", inv.Answers[1])
	}
}

// checkExited checks answer 3: exit 0 observed, and the host's marker (asked live) agrees.
func checkExited(t *testing.T, inv *api.Investigation) {
	t.Helper()
	o := inv.Outcome
	if o.ExitCode == nil || *o.ExitCode != 0 || o.ObservedAt == nil {
		t.Errorf("outcome = %+v; want exit 0 observed", o)
	}
	if o.Marker == nil || o.Marker.State != hostproto.MarkerExited || o.Marker.ExitCode == nil || *o.Marker.ExitCode != 0 {
		t.Errorf("host marker = %+v (%s); want exited 0, asked live", o.Marker, o.MarkerNote)
	}
	if !strings.Contains(inv.Answers[2], "exit 0") || !strings.Contains(inv.Answers[2], "asked now") {
		t.Errorf("answer 3 = %q; want exit 0 and the host's live answer", inv.Answers[2])
	}
}

// checkDeliveredTo checks answer 4: delivered once, to the call with JSON-RPC id requestID
// ("" for any).
func checkDeliveredTo(t *testing.T, inv *api.Investigation, requestID string) {
	t.Helper()
	d := inv.Delivery
	if d.DeliveredAt == nil || len(d.Deliveries) != 1 || d.Deliveries[0].Call == nil ||
		(requestID != "" && d.Deliveries[0].Call.RequestID != requestID) {
		t.Errorf("delivery = %+v; want one delivery to call %q", d, requestID)
	}
	if !strings.Contains(inv.Answers[3], "Delivered") {
		t.Errorf("answer 4 = %q; want when and to which call", inv.Answers[3])
	}
}

// callsByMatch are the investigation's calls' match values in order.
func callsByMatch(inv *api.Investigation) []string {
	var out []string
	for _, c := range inv.Calls {
		out = append(out, c.Match)
	}
	return out
}

func TestInvestigateOneCall(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, _ := appendCommand(t, "one")
	x := mustCall(t, ctx, f.session(t, "agent", "inv-one"), "ssh_exec", map[string]any{"host": "h1", "command": cmd})
	waitForDelivery(t, f.bastion, x.ExecutionID)
	inv := investigate(t, f.bastion, x.ExecutionID)

	// 1: one call, over HTTP, from the run the Postern-Run header named, with its token.
	if len(inv.Calls) != 1 || inv.Calls[0].Transport != "http" || inv.Calls[0].Run != "run:inv-one" || inv.Calls[0].RequestID == "" {
		t.Errorf("calls = %+v; want one HTTP call of run:inv-one with its JSON-RPC id", inv.Calls)
	}
	if len(inv.Runs) != 1 || inv.Runs[0].Token != "agent" || inv.Runs[0].RunID != "inv-one" {
		t.Errorf("runs = %+v; want the agent token's run inv-one", inv.Runs)
	}
	if !strings.HasPrefix(inv.Answers[0], "One agent run sent 1 call") {
		t.Errorf("answer 1 = %q", inv.Answers[0])
	}
	checkDispatched(t, inv)
	checkExited(t, inv)
	checkDeliveredTo(t, inv, inv.Calls[0].RequestID)
	if !strings.HasPrefix(inv.Answers[4], "No later call.") || len(inv.Siblings) != 1 {
		t.Errorf("answer 5 = %q, siblings %+v; want no later call and no other execution", inv.Answers[4], inv.Siblings)
	}

	// The text form prints the five questions in order; runs list shows the run.
	text := string(postern(t, f.bastion, "investigate", x.ExecutionID))
	for i, q := range []string{"1. Did one agent process", "2. Was the first call authorized", "3. Did the bastion get", "4. Did result delivery fail", "5. Did a later call"} {
		if !strings.Contains(text, q) {
			t.Errorf("investigate text lacks question %d (%q):\n%s", i+1, q, text)
		}
	}
	if runs := string(postern(t, f.bastion, "runs", "list")); !strings.Contains(runs, "run:inv-one") || !strings.Contains(runs, "token:agent") {
		t.Errorf("runs list:\n%s\nwant run:inv-one of token:agent", runs)
	}
	var run markers.Run
	if err := json.Unmarshal(postern(t, f.bastion, "runs", "show", "run:inv-one", "--json"), &run); err != nil || run.Token != "agent" {
		t.Errorf("runs show --json = %+v, %v; want the agent token's run", run, err)
	}
}

func TestInvestigateRetryThatJoined(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cs := f.session(t, "agent", "inv-join")
	g := newGatedCommand(t)
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}
	x := mustCall(t, ctx, cs, "ssh_exec", args)
	waitForJournalState(t, f.bastion, x.ExecutionID, markers.Running)
	if again := mustCall(t, ctx, cs, "ssh_exec", args); again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("retry = %+v; want %s replayed", again, x.ExecutionID)
	}
	g.open(t)
	followOutput(t, ctx, cs, x.ExecutionID)
	waitForDelivery(t, f.bastion, x.ExecutionID)
	inv := investigate(t, f.bastion, x.ExecutionID)

	if got := callsByMatch(inv); len(got) != 2 || got[0] != "new" || got[1] != "attach" {
		t.Fatalf("calls = %v; want new, attach", got)
	}
	if c := inv.Calls[1]; !c.Replayed || c.Run != "run:inv-join" || c.RequestID == inv.Calls[0].RequestID {
		t.Errorf("joined call = %+v; want replayed, same run, its own JSON-RPC id", c)
	}
	if !strings.HasPrefix(inv.Answers[0], "One agent run sent 2 calls") {
		t.Errorf("answer 1 = %q", inv.Answers[0])
	}
	checkDispatched(t, inv)
	checkExited(t, inv)
	checkDeliveredTo(t, inv, "") // to the execution_output call that saw it end
	if !strings.Contains(inv.Answers[4], "attached to it while it ran") {
		t.Errorf("answer 5 = %q; want the joined call", inv.Answers[4])
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}

func TestInvestigateRetryAfterDelivery(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cs := f.session(t, "agent", "inv-after")
	cmd, file := appendCommand(t, "after")
	args := map[string]any{"host": "h1", "command": cmd}
	first := mustCall(t, ctx, cs, "ssh_exec", args)
	waitForDelivery(t, f.bastion, first.ExecutionID)
	second := mustCall(t, ctx, cs, "ssh_exec", args)
	if second.ExecutionID == first.ExecutionID || second.Replayed {
		t.Fatalf("call after delivery = %+v; want a new execution", second)
	}
	if n := effects(t, file); n != 2 {
		t.Fatalf("command ran %d times; want 2 (two intents)", n)
	}

	inv := investigate(t, f.bastion, first.ExecutionID)
	if got := callsByMatch(inv); len(got) != 2 || got[0] != "new" || got[1] != "new" || inv.Calls[1].ExecutionID != second.ExecutionID {
		t.Fatalf("calls = %+v; want the first call and the new execution's", inv.Calls)
	}
	if !strings.HasPrefix(inv.Answers[0], "One agent run sent 2 calls") {
		t.Errorf("answer 1 = %q", inv.Answers[0])
	}
	checkDispatched(t, inv)
	checkExited(t, inv)
	checkDeliveredTo(t, inv, inv.Calls[0].RequestID)
	if len(inv.Siblings) != 2 || inv.Siblings[1].ExecutionID != second.ExecutionID ||
		!strings.Contains(inv.Answers[4], "created "+second.ExecutionID) || !strings.Contains(inv.Answers[4], "delivered") {
		t.Errorf("answer 5 = %q, siblings %+v; want the new execution after the delivery", inv.Answers[4], inv.Siblings)
	}
	// The second execution's investigation tells the same story from its side.
	if inv2 := investigate(t, f.bastion, second.ExecutionID); len(inv2.Siblings) != 2 || inv2.Siblings[0].ExecutionID != first.ExecutionID {
		t.Errorf("siblings of %s = %+v; want %s first", second.ExecutionID, inv2.Siblings, first.ExecutionID)
	}
}

func TestInvestigateIdempotencyKeyReuse(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "keyed")
	args := map[string]any{"host": "h1", "command": cmd, "idempotency_key": "deploy-42"}
	first := mustCall(t, ctx, f.session(t, "agent", "inv-key-1"), "ssh_exec", args)
	// The same key and request from another run: the same execution, replayed.
	other := f.session(t, "agent", "inv-key-2")
	if again := mustCall(t, ctx, other, "ssh_exec", args); again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Fatalf("keyed retry = %+v; want %s replayed", again, first.ExecutionID)
	}
	// The same key for another request: refused.
	if msg := mustRefuse(t, ctx, other, "ssh_exec", map[string]any{"host": "h1", "command": "echo other", "idempotency_key": "deploy-42"}); !strings.Contains(msg, "idempotency_key_reused") {
		t.Fatalf("key reuse = %q; want idempotency_key_reused", msg)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	waitForDelivery(t, f.bastion, first.ExecutionID)

	inv := investigate(t, f.bastion, first.ExecutionID)
	if got := callsByMatch(inv); len(got) != 3 || got[0] != "new" || got[1] != "replay" || got[2] != "idempotency_key_reused" {
		t.Fatalf("calls = %v; want new, replay, idempotency_key_reused", got)
	}
	if !strings.HasPrefix(inv.Answers[0], "2 agent runs sent the 3 calls") || len(inv.Runs) != 2 {
		t.Errorf("answer 1 = %q, runs %+v; want two runs", inv.Answers[0], inv.Runs)
	}
	checkDispatched(t, inv)
	checkExited(t, inv)
	// The first call got the result, and so may the keyed replay if it came before the
	// first delivery was recorded (a replay of a result already delivered is not tracked).
	d := inv.Delivery
	if d.DeliveredAt == nil || len(d.Deliveries) < 1 || len(d.Deliveries) > 2 || !strings.Contains(inv.Answers[3], "Delivered") {
		t.Errorf("delivery = %+v, answer 4 = %q; want one or two deliveries", d, inv.Answers[3])
	}
	for _, dl := range d.Deliveries {
		if dl.Call == nil || (dl.Call.Run != inv.Calls[0].Run && dl.Call.Run != inv.Calls[1].Run) {
			t.Errorf("delivery %+v names no call of the first two", dl)
		}
	}
	if a := inv.Answers[4]; !strings.Contains(a, "reused idempotency key deploy-42): its stored result was replayed") ||
		!strings.Contains(a, "for a different request: refused, nothing dispatched") {
		t.Errorf("answer 5 = %q; want the keyed replay and the refused reuse", a)
	}
}

func TestInvestigateTwoAgentProcesses(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "two")
	bin := harness.Binary(t, "postern")
	call := sshExecStep(map[string]any{"host": "h1", "command": cmd}, nil)
	// Two agent processes (two node processes, each launching its own stdio bridge).
	a := runTS(t, ctx, stdioConnect(bin, f.bastion.Socket), call)[1].Result
	b := runTS(t, ctx, stdioConnect(bin, f.bastion.Socket), call)[1].Result
	if a == nil || b == nil || a.ExecutionID == b.ExecutionID {
		t.Fatalf("two agents' calls = %+v, %+v; want two executions", a, b)
	}
	if n := effects(t, file); n != 2 {
		t.Fatalf("command ran %d times; want 2 (one per agent)", n)
	}

	waitForDelivery(t, f.bastion, b.ExecutionID)
	inv := investigate(t, f.bastion, b.ExecutionID)
	if len(inv.Calls) != 1 || inv.Calls[0].Transport != "stdio-bridge" || len(inv.Runs) != 1 {
		t.Fatalf("calls = %+v, runs %+v; want one bridged call and its run", inv.Calls, inv.Runs)
	}
	run := inv.Runs[0]
	if !strings.HasSuffix(run.Exe, "node") || len(run.Cmdline) < 2 || !strings.Contains(run.Cmdline[1], "call.mjs") ||
		run.StartTime.IsZero() || run.UID == nil || run.PID == 0 {
		t.Errorf("run = %+v; want the node process with its command line, start time and uid", run)
	}
	if len(inv.Related) != 1 || inv.Related[0].ExecutionID != a.ExecutionID {
		t.Errorf("related = %+v; want the other agent's %s", inv.Related, a.ExecutionID)
	}
	if !strings.HasPrefix(inv.Answers[0], "One agent run sent 1 call") || !strings.Contains(inv.Answers[0], "node") ||
		!strings.Contains(inv.Answers[0], a.ExecutionID) {
		t.Errorf("answer 1 = %q; want this agent's process and the other agent's execution", inv.Answers[0])
	}
	checkDispatched(t, inv)
	checkExited(t, inv)
	checkDeliveredTo(t, inv, inv.Calls[0].RequestID)
	if !strings.HasPrefix(inv.Answers[4], "No later call.") {
		t.Errorf("answer 5 = %q; want no later call", inv.Answers[4])
	}
	// executions show names the agent behind the scope, not only run:PID-TICKS.
	if show := string(postern(t, f.bastion, "executions", "show", b.ExecutionID)); !strings.Contains(show, "agent run") || !strings.Contains(show, run.Exe) {
		t.Errorf("executions show:\n%s\nwant the agent run's executable %s", show, run.Exe)
	}
}

func TestInvestigateAcrossBastionRestart(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}
	x := mustCall(t, ctx, f.session(t, "agent", "inv-restart"), "ssh_exec", args)
	waitForJournalState(t, f.bastion, x.ExecutionID, markers.Running)
	f.bastion.Kill(t)
	f.bastion.Start(t)
	cs := f.session(t, "agent", "inv-restart")
	if again := mustCall(t, ctx, cs, "ssh_exec", args); again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("retry after restart = %+v; want %s replayed", again, x.ExecutionID)
	}
	g.open(t)
	followOutput(t, ctx, cs, x.ExecutionID)
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	waitForDelivery(t, f.bastion, x.ExecutionID)

	inv := investigate(t, f.bastion, x.ExecutionID)
	if got := callsByMatch(inv); len(got) != 2 || got[0] != "new" || (got[1] != "attach" && got[1] != "reconcile") {
		t.Fatalf("calls = %v; want new, then attach or reconcile", got)
	}
	// The run is recorded once, at its first contact, not again by the restarted bastion.
	if len(inv.Runs) != 1 || !strings.HasPrefix(inv.Answers[0], "One agent run sent 2 calls") {
		t.Errorf("runs = %+v, answer 1 = %q; want one run", inv.Runs, inv.Answers[0])
	}
	var page api.RunPage
	if err := json.Unmarshal(postern(t, f.bastion, "runs", "list", "--json"), &page); err != nil || len(page.Runs) != 1 {
		t.Errorf("runs list = %+v, %v; want one run", page, err)
	}
	checkDispatched(t, inv)
	checkExited(t, inv)
	checkDeliveredTo(t, inv, "")
	if !strings.Contains(inv.Answers[4], "joined "+x.ExecutionID) {
		t.Errorf("answer 5 = %q; want the retry joined", inv.Answers[4])
	}
	// The chain covers the calls: the journal still verifies.
	if out := string(postern(t, f.bastion, "audit", "verify")); !strings.Contains(out, "PASS") {
		t.Errorf("audit verify:\n%s", out)
	}
}

// waitForDelivery waits until the journal records id's result as delivered.
func waitForDelivery(t *testing.T, b *harness.Bastion, id string) {
	t.Helper()
	testutil.WaitFor(t, id+"'s delivery", func() bool { return journaled(t, b, id).ResultDeliveredAt != nil })
}
