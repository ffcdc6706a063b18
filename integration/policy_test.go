package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// Policy and approvals end to end (docs/design.md, "Approval is evidence, not idempotency"): a
// real `postern serve` with rules and actors in its config, a real hostagent, the go-sdk MCP
// client as the agent and the `postern` binary as the operator. What every test checks
// besides the states: what never ran did not run, and a retry never opens a second approval.

// startPolicyFleet is newFleet with extra actors configured before the bastion starts.
func startPolicyFleet(t *testing.T, opts fleetOptions, actors ...harness.ActorSpec) *testbed {
	t.Helper()
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey, append(opts.settings, opts.tables...)...)
	for _, a := range actors {
		b.AddActor(t, a)
	}
	f := &testbed{bastion: b, host: h}
	addr := h.Addr
	if opts.proxy {
		f.proxy = testutil.StartFaultProxy(t, h.Addr)
		addr = f.proxy.Addr()
	}
	b.EnrollAt(t, "h1", addr, h)
	b.Start(t)
	f.logOnFailure(t)
	return f
}

// cliResult is what one run of the operator CLI printed, and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

// operatorCLI runs `postern ARGS --config <the bastion's config>` as the operator.
func operatorCLI(t *testing.T, ctx context.Context, b *harness.Bastion, args ...string) cliResult {
	t.Helper()
	cmd := exec.CommandContext(ctx, harness.Binary(t, "postern"), append(args, "--config", b.ConfigPath)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("postern %v: %v", args, err)
	}
	return res
}

// mustCLI is operatorCLI for commands that must succeed; it returns stdout.
func mustCLI(t *testing.T, ctx context.Context, b *harness.Bastion, args ...string) string {
	t.Helper()
	res := operatorCLI(t, ctx, b, args...)
	if res.code != 0 {
		t.Fatalf("postern %v: exit status %d\nstdout: %s\nstderr: %s", args, res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

// pendingApprovals is `postern approvals list --json`.
func pendingApprovals(t *testing.T, ctx context.Context, b *harness.Bastion) []*api.ApprovalRequest {
	t.Helper()
	var page api.ApprovalPage
	out := mustCLI(t, ctx, b, "approvals", "list", "--json")
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("approvals list --json: %v\n%s", err, out)
	}
	return page.Approvals
}

// wantOnePending checks that id is the only execution awaiting approval.
func wantOnePending(t *testing.T, ctx context.Context, b *harness.Bastion, id string) {
	t.Helper()
	pending := pendingApprovals(t, ctx, b)
	if len(pending) != 1 || pending[0].ExecutionID != id {
		ids := []string{}
		for _, r := range pending {
			ids = append(ids, r.ExecutionID)
		}
		t.Fatalf("approvals list = %v; want exactly [%s]", ids, id)
	}
}

// wantNoPending checks the human form of an empty approvals list.
func wantNoPending(t *testing.T, ctx context.Context, b *harness.Bastion) {
	t.Helper()
	if out := mustCLI(t, ctx, b, "approvals", "list"); strings.TrimSpace(out) != "No executions are awaiting approval." {
		t.Fatalf("approvals list = %q; want the no-pending message", out)
	}
}

// showExecution is `postern executions show ID --json`.
func showExecution(t *testing.T, ctx context.Context, b *harness.Bastion, id string) api.ExecutionDetail {
	t.Helper()
	var d api.ExecutionDetail
	out := mustCLI(t, ctx, b, "executions", "show", id, "--json")
	if err := json.Unmarshal([]byte(out), &d); err != nil || d.Record == nil {
		t.Fatalf("executions show %s --json: %v\n%s", id, err, out)
	}
	return d
}

// waitJournaled polls the operator API (which does not deliver results to the agent) until
// the execution is in state.
func waitJournaled(t *testing.T, b *harness.Bastion, id string, state markers.State) *markers.Record {
	t.Helper()
	var rec *markers.Record
	testutil.WaitFor(t, id+" to be journaled as "+string(state), func() bool {
		rec = journaled(t, b, id)
		return rec.State == state
	})
	return rec
}

// migrateScript writes an executable named "migrate" that appends a line to its effects
// file per run, so a rule on "migrate **" applies to it (a path's base name is matched).
func migrateScript(t *testing.T) (path, file string) {
	t.Helper()
	dir := t.TempDir()
	path, file = filepath.Join(dir, "migrate"), filepath.Join(dir, "effects")
	script := "#!/bin/sh\necho \"$*\" >> " + file + "\necho done\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, file
}

func operatorName(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return "operator:" + u.Username
}

const approveMigrations = `[[rules]]
name = "migrations-need-approval"
decision = "approve"
commands = ["migrate **"]`

// TestApprovalFlow: an execution that needs approval returns at once as awaiting_approval,
// runs nothing, and stays one pending approval however often the agent retries; approved by
// the operator CLI it runs once, and the retry returns its result.
func TestApprovalFlow(t *testing.T) {
	f := startFleet(t, approveMigrations)
	ctx := testContext(t)
	migrate, file := migrateScript(t)
	args := map[string]any{"host": "h1", "command": migrate + " up", "wait_s": 30}

	wantNoPending(t, ctx, f.bastion)
	first := mustCall(t, ctx, f.session(t, "agent", "run-approve"), "ssh_exec", args)
	if first.State != string(markers.AwaitingApproval) || first.Replayed {
		t.Fatalf("first call = %+v; want a new execution awaiting approval", first)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the command ran %d times before approval", n)
	}
	wantOnePending(t, ctx, f.bastion, first.ExecutionID)

	// The agent retries: new session (new JSON-RPC ids), same run.
	retry := mustCall(t, ctx, f.session(t, "agent", "run-approve"), "ssh_exec", args)
	if retry.ExecutionID != first.ExecutionID || !retry.Replayed || retry.State != string(markers.AwaitingApproval) {
		t.Fatalf("retry = %+v; want %s replayed, still awaiting approval", retry, first.ExecutionID)
	}
	wantOnePending(t, ctx, f.bastion, first.ExecutionID)

	if out := mustCLI(t, ctx, f.bastion, "approve", first.ExecutionID, "--note", "ok"); !strings.Contains(out, first.ExecutionID) {
		t.Fatalf("approve printed %q; want the execution id", out)
	}
	waitJournaled(t, f.bastion, first.ExecutionID, markers.Completed)
	if n := effects(t, file); n != 1 {
		t.Fatalf("the approved command ran %d times; want 1", n)
	}
	wantNoPending(t, ctx, f.bastion)

	done := mustCall(t, ctx, f.session(t, "agent", "run-approve"), "ssh_exec", args)
	if done.ExecutionID != first.ExecutionID || !done.Replayed || done.State != string(markers.Completed) || done.Stdout != "done\n" {
		t.Fatalf("retry after approval = %+v; want %s replayed, completed with its output", done, first.ExecutionID)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times after the retry; want 1", n)
	}

	detail := showExecution(t, ctx, f.bastion, first.ExecutionID)
	var states []markers.State
	var approval string
	for _, e := range detail.Events {
		if e.To == "" || (len(states) > 0 && states[len(states)-1] == e.To) {
			continue
		}
		states = append(states, e.To)
		if e.To == markers.Authorized {
			approval = e.Note
		}
	}
	want := []markers.State{markers.Accepted, markers.AwaitingApproval, markers.Authorized, markers.Dispatched}
	if len(states) < len(want)+1 || !slices.Equal(states[:len(want)], want) || states[len(states)-1] != markers.Completed {
		t.Errorf("event states = %v; want %v ... completed", states, want)
	}
	if wantNote := "approved by " + operatorName(t) + ": ok"; approval != wantNote {
		t.Errorf("authorized event note = %q; want %q", approval, wantNote)
	}
}

// TestApprovalDenied: a denied execution is rejected; the agent's retry returns the same
// rejection, nothing runs and no second approval is opened.
func TestApprovalDenied(t *testing.T) {
	f := startFleet(t, approveMigrations)
	ctx := testContext(t)
	migrate, file := migrateScript(t)
	args := map[string]any{"host": "h1", "command": migrate + " down"}

	first := mustCall(t, ctx, f.session(t, "agent", "run-deny"), "ssh_exec", args)
	if first.State != string(markers.AwaitingApproval) {
		t.Fatalf("first call = %+v; want awaiting approval", first)
	}
	if out := mustCLI(t, ctx, f.bastion, "deny", first.ExecutionID, "--reason", "not today"); !strings.Contains(out, "rejected") {
		t.Fatalf("deny printed %q; want the rejected state", out)
	}
	rec := journaled(t, f.bastion, first.ExecutionID)
	if rec.State != markers.Rejected || !hasEvidence(rec, "denied by "+operatorName(t)+": not today") {
		t.Fatalf("after deny: state %s, evidence %q; want rejected with the operator's reason", rec.State, rec.Evidence)
	}

	retry := mustCall(t, ctx, f.session(t, "agent", "run-deny"), "ssh_exec", args)
	if retry.ExecutionID != first.ExecutionID || !retry.Replayed || retry.State != string(markers.Rejected) {
		t.Fatalf("retry = %+v; want %s replayed, rejected", retry, first.ExecutionID)
	}
	wantNoPending(t, ctx, f.bastion)
	if n := effects(t, file); n != 0 {
		t.Fatalf("the denied command ran %d times", n)
	}
	// A second decision on it is refused: it is no longer waiting.
	if res := operatorCLI(t, ctx, f.bastion, "approve", first.ExecutionID); res.code != 1 || !strings.Contains(res.stderr, "rejected") {
		t.Fatalf("approve after deny: exit %d, stderr %q; want exit 1 naming the rejected state", res.code, res.stderr)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the denied command ran %d times after a late approve", n)
	}
}

// TestApprovalTimeout: nobody decides within approval_timeout, so the execution is
// rejected with the timeout as its reason, and nothing ran.
func TestApprovalTimeout(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{`approval_timeout = "2s"`}, tables: []string{approveMigrations}})
	ctx := testContext(t)
	migrate, file := migrateScript(t)
	args := map[string]any{"host": "h1", "command": migrate + " sideways"}

	first := mustCall(t, ctx, f.session(t, "agent", "run-timeout"), "ssh_exec", args)
	if first.State != string(markers.AwaitingApproval) {
		t.Fatalf("first call = %+v; want awaiting approval", first)
	}
	rec := waitJournaled(t, f.bastion, first.ExecutionID, markers.Rejected)
	if !hasEvidence(rec, "approval timeout") {
		t.Errorf("evidence %q does not name the approval timeout", rec.Evidence)
	}
	retry := mustCall(t, ctx, f.session(t, "agent", "run-timeout"), "ssh_exec", args)
	if retry.ExecutionID != first.ExecutionID || !retry.Replayed || retry.State != string(markers.Rejected) {
		t.Fatalf("retry = %+v; want %s replayed, rejected", retry, first.ExecutionID)
	}
	wantNoPending(t, ctx, f.bastion)
	if n := effects(t, file); n != 0 {
		t.Fatalf("the timed-out command ran %d times", n)
	}
}

// TestPolicyDenyWins: a deny rule on "rm **" rejects every command in which rm appears as a
// command — alone, after `;` or `&&`, by path, in a substitution — although an approve rule
// and a class rule match too, and whatever their order. The file rm would remove survives.
func TestPolicyDenyWins(t *testing.T) {
	f := startFleet(t,
		`[[rules]]
name = "everything-needs-approval"
decision = "approve"`,
		`[[rules]]
name = "rm-is-irreversible"
class = "irreversible"
commands = ["rm **"]`,
		`[[rules]]
name = "no-rm"
decision = "deny"
commands = ["rm **"]`)
	ctx := testContext(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("still here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := f.session(t, "agent", "run-deny-wins")

	for _, tc := range []struct{ name, command, code string }{
		{name: "plain", command: "rm -rf " + victim, code: "denied"},
		{name: "after a semicolon", command: "echo ok; rm -rf " + victim, code: "denied"},
		{name: "after &&", command: "true && rm " + victim, code: "denied"},
		{name: "after a newline", command: "echo ok\nrm " + victim, code: "denied"},
		{name: "by path", command: "/bin/rm " + victim, code: "denied"},
		{name: "command substitution", command: "$(rm " + victim + ")", code: "unparsable"},
		{name: "backticks", command: "echo `rm " + victim + "`", code: "denied"},
		// Wrappers are unwrapped: the rule sees the rm they would run.
		{name: "sudo", command: "sudo -n rm -f " + victim, code: "denied"},
		{name: "sh -c", command: `sh -c "rm -f ` + victim + `"`, code: "denied"},
		{name: "nested wrappers", command: "sudo env FOO=1 sh -c 'nice rm -rf " + victim + "'", code: "denied"},
		{name: "env", command: "env -i rm " + victim, code: "denied"},
		{name: "timeout", command: "timeout -k 1 -s KILL 5 rm " + victim, code: "denied"},
		{name: "xargs", command: "echo " + victim + " | xargs rm", code: "denied"},
		{name: "find -exec", command: "find " + filepath.Dir(victim) + " -name victim -exec rm {} \\;", code: "denied"},
		{name: "busybox", command: "busybox rm " + victim, code: "denied"},
		{name: "a shell reading a pipe", command: "echo 'rm " + victim + "' | sh", code: "unparsable"},
		{name: "a parameter in sh -c", command: "sh -c 'rm $0' " + victim, code: "denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": tc.command})
			if x.State != string(markers.Rejected) {
				t.Fatalf("%q = %+v; want rejected", tc.command, x)
			}
			rec := journaled(t, f.bastion, x.ExecutionID)
			if !hasEvidence(rec, `rules[2] "no-rm"`) || !hasEvidence(rec, "rejected ("+tc.code+")") {
				t.Errorf("%q: evidence %q; want a rejection (%s) by the no-rm rule", tc.command, rec.Evidence, tc.code)
			}
			if at, ok := rec.StateTimes[markers.Dispatched]; ok {
				t.Errorf("%q was dispatched at %v", tc.command, at)
			}
		})
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("the file rm would remove: %v", err)
	}
	// The approve rule still applies where no deny rule does, through a wrapper too.
	for _, command := range []string{"echo ok", "sh -c 'echo ok'"} {
		if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": command}); x.State != string(markers.AwaitingApproval) {
			t.Fatalf("%s = %+v; want awaiting approval", command, x)
		}
	}
}

// TestActorLimits: an actor's hosts and tools are enforced by the ladder (a journaled
// rejection); its daily quota and concurrency by the bastion (a tool error, nothing
// journaled).
func TestActorLimits(t *testing.T) {
	f := startPolicyFleet(t, fleetOptions{},
		harness.ActorSpec{Name: "elsewhere", Hosts: []string{"other-host"}},
		harness.ActorSpec{Name: "lister", Tools: []string{"hosts_list"}},
		harness.ActorSpec{Name: "frugal", DailyQuota: 2},
		harness.ActorSpec{Name: "serial", MaxConcurrent: 1},
	)
	ctx := testContext(t)

	for _, tc := range []struct{ name, actor, rule string }{
		{name: "host not allowed", actor: "elsewhere", rule: "host h1 not allowed"},
		{name: "tool not allowed", actor: "lister", rule: "tool ssh_exec not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, file := appendCommand(t, tc.actor)
			x := mustCall(t, ctx, f.session(t, tc.actor, "run-1"), "ssh_exec", map[string]any{"host": "h1", "command": cmd})
			if x.State != string(markers.Rejected) {
				t.Fatalf("call = %+v; want rejected", x)
			}
			if rec := journaled(t, f.bastion, x.ExecutionID); !hasEvidence(rec, "rejected (not_allowed)") || !hasEvidence(rec, tc.rule) {
				t.Errorf("evidence %q; want not_allowed: %s", rec.Evidence, tc.rule)
			}
			if n := effects(t, file); n != 0 {
				t.Fatalf("the rejected command ran %d times", n)
			}
		})
	}

	t.Run("daily quota", func(t *testing.T) {
		cs := f.session(t, "frugal", "run-1")
		call := func(tag, key string) map[string]any {
			return map[string]any{"host": "h1", "command": "echo " + tag, "idempotency_key": key}
		}
		for _, tag := range []string{"first", "second"} {
			if x := mustCall(t, ctx, cs, "ssh_exec", call(tag, tag)); x.State != string(markers.Completed) || x.Replayed {
				t.Fatalf("call %s = %+v; want a new execution, completed", tag, x)
			}
		}
		msg := mustRefuse(t, ctx, cs, "ssh_exec", call("third", "third"))
		if !strings.Contains(msg, api.CodeQuotaExceeded) {
			t.Errorf("third call: %s; want %s", msg, api.CodeQuotaExceeded)
		}
		// A retry of an execution the quota already counted is not a new one.
		if x := mustCall(t, ctx, cs, "ssh_exec", call("first", "first")); !x.Replayed || x.Stdout != "first\n" {
			t.Errorf("retry of the first at quota = %+v; want it replayed", x)
		}
		if n := len(listOf(t, ctx, cs)); n != 2 {
			t.Errorf("executions_list has %d executions; want 2 (the refused one is not journaled)", n)
		}
	})

	t.Run("concurrency", func(t *testing.T) {
		cs := f.session(t, "serial", "run-1")
		g := newGatedCommand(t)
		t.Cleanup(func() { g.open(t) })
		running := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0})
		if markers.JournalGraph.Terminal(markers.State(running.State)) {
			t.Fatalf("gated command = %+v; want it in flight", running)
		}
		msg := mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo second"})
		if !strings.Contains(msg, api.CodeConcurrencyLimit) {
			t.Errorf("second call while one runs: %s; want %s", msg, api.CodeConcurrencyLimit)
		}
		g.open(t)
		waitJournaled(t, f.bastion, running.ExecutionID, markers.Completed)
		// Its driver lets go just after the journal says completed; then there is room again.
		var x api.Execution
		testutil.WaitFor(t, "a new command to be admitted after the first ended", func() bool {
			var err error
			x, err = callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo second"})
			if err != nil && !strings.Contains(err.Error(), api.CodeConcurrencyLimit) {
				t.Fatalf("second call after the first ended: %v", err)
			}
			return err == nil
		})
		if x.State != string(markers.Completed) || x.Stdout != "second\n" {
			t.Fatalf("second call = %+v; want completed", x)
		}
	})
}

// TestReviewUnknownOutcome: irreversible executions whose host vanished mid-run stay
// unknown — a retry joins them, never runs them again — until an operator reviews them:
// not-run lets the same intent run as a new execution, completed makes the retry return it.
// Only an unknown outcome can be reviewed.
func TestReviewUnknownOutcome(t *testing.T) {
	f := startPolicyFleet(t, fleetOptions{proxy: true, tables: []string{`[[rules]]
name = "all-irreversible"
class = "irreversible"`}})
	ctx := testContext(t)
	cc := hostControl(t, f.host)
	notRun, tookEffect := newGatedCommand(t), newGatedCommand(t)
	// The supervisor outlives the hostagent: let its commands end with the test.
	t.Cleanup(func() { notRun.open(t); tookEffect.open(t) })
	cs := f.session(t, "agent", "run-review")
	argsNotRun := map[string]any{"host": "h1", "command": notRun.cmd, "wait_s": 0}
	argsTookEffect := map[string]any{"host": "h1", "command": tookEffect.cmd, "wait_s": 0}
	a := mustCall(t, ctx, cs, "ssh_exec", argsNotRun)
	b := mustCall(t, ctx, cs, "ssh_exec", argsTookEffect)
	testutil.WaitFor(t, "both commands to run on the host", func() bool {
		page, _, err := cc.List(ctx, hostproto.ControlListQuery{State: hostproto.MarkerRunning})
		if err != nil {
			t.Fatal(err)
		}
		return len(page) == 2
	})
	// The host goes away while both run, so nothing can tell the bastion how they ended.
	f.host.Kill(t)
	f.proxy.Cut()
	for _, id := range []string{a.ExecutionID, b.ExecutionID} {
		if rec := waitJournaled(t, f.bastion, id, markers.Unknown); rec.Class != "irreversible" {
			t.Fatalf("%s: class %q; want irreversible", id, rec.Class)
		}
	}
	if x := mustCall(t, ctx, cs, "ssh_exec", argsNotRun); x.ExecutionID != a.ExecutionID || !x.Replayed || x.State != string(markers.Unknown) {
		t.Fatalf("retry while unknown = %+v; want %s replayed, unknown", x, a.ExecutionID)
	}

	t.Run("not-run", func(t *testing.T) {
		if out := mustCLI(t, ctx, f.bastion, "review", a.ExecutionID, "--outcome", "not-run", "--note", "checked"); !strings.Contains(out, "failed") {
			t.Fatalf("review printed %q; want the failed state", out)
		}
		rec := journaled(t, f.bastion, a.ExecutionID)
		if rec.State != markers.Failed || !hasEvidence(rec, "reviewed by "+operatorName(t)+": it did not run: checked") {
			t.Fatalf("after review: state %s, evidence %q; want failed with the operator's note", rec.State, rec.Evidence)
		}
		x := mustCall(t, ctx, cs, "ssh_exec", argsNotRun)
		if x.ExecutionID == a.ExecutionID || x.Replayed {
			t.Fatalf("the same intent after review not-run = %+v; want a new execution", x)
		}
		// It is dispatched for real: with the host still down, it provably fails to connect.
		waitJournaled(t, f.bastion, x.ExecutionID, markers.Failed)
	})

	t.Run("completed", func(t *testing.T) {
		if out := mustCLI(t, ctx, f.bastion, "review", b.ExecutionID, "--outcome", "completed", "--note", "the effects file has its line"); !strings.Contains(out, "completed") {
			t.Fatalf("review printed %q; want the completed state", out)
		}
		x := mustCall(t, ctx, cs, "ssh_exec", argsTookEffect)
		if x.ExecutionID != b.ExecutionID || !x.Replayed || x.State != string(markers.Completed) {
			t.Fatalf("retry after review completed = %+v; want %s replayed, completed", x, b.ExecutionID)
		}
	})

	t.Run("not unknown", func(t *testing.T) {
		res := operatorCLI(t, ctx, f.bastion, "review", b.ExecutionID, "--outcome", "not-run", "--note", "second thoughts")
		if res.code != 1 || !strings.Contains(res.stderr, "completed") {
			t.Fatalf("review of a completed execution: exit %d, stderr %q; want exit 1 naming its state", res.code, res.stderr)
		}
		if rec := journaled(t, f.bastion, b.ExecutionID); rec.State != markers.Completed {
			t.Fatalf("after a refused review: %s; want completed", rec.State)
		}
	})

	// The orphaned commands end under a restarted hostagent, which adopts them through their
	// supervisor, so that nothing writes to the host's state dir once the test is over.
	notRun.open(t)
	tookEffect.open(t)
	f.host.Start(t)
	cc = hostControl(t, f.host)
	for _, id := range []string{a.ExecutionID, b.ExecutionID} {
		testutil.WaitFor(t, "the host to see "+id+" exit", func() bool {
			m := harness.Marker(t, ctx, cc, id)
			return m != nil && m.State == hostproto.MarkerExited
		})
	}
}

// TestActorLimitsUnderConcurrentCalls: an actor's limits hold when its calls arrive at once
// (different intents, so no fingerprint lock serializes them).
func TestActorLimitsUnderConcurrentCalls(t *testing.T) {
	f := startPolicyFleet(t, fleetOptions{},
		harness.ActorSpec{Name: "frugal", DailyQuota: 2},
		harness.ActorSpec{Name: "serial", MaxConcurrent: 1},
	)
	ctx := testContext(t)
	const calls = 8
	// admitted makes calls distinct calls at once as actor, each in its own run, and returns
	// how many were admitted; the others must be refused with code.
	admitted := func(t *testing.T, actor, code string) int {
		g := newGatedCommand(t)
		t.Cleanup(func() { g.open(t) })
		sessions := make([]*mcp.ClientSession, calls)
		for i := range sessions {
			sessions[i] = f.session(t, actor, fmt.Sprintf("run-%d", i))
		}
		errs := make(chan error, calls)
		var wg sync.WaitGroup
		for i, cs := range sessions {
			wg.Go(func() {
				_, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": fmt.Sprintf("%s; echo %d", g.cmd, i), "wait_s": 0})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		n := 0
		for err := range errs {
			switch {
			case err == nil:
				n++
			case !strings.Contains(err.Error(), code):
				t.Errorf("refused call: %v; want %s", err, code)
			}
		}
		return n
	}

	t.Run("daily quota", func(t *testing.T) {
		if n := admitted(t, "frugal", api.CodeQuotaExceeded); n != 2 {
			t.Errorf("%d of %d concurrent calls admitted; want the quota, 2", n, calls)
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		if n := admitted(t, "serial", api.CodeConcurrencyLimit); n != 1 {
			t.Errorf("%d of %d concurrent calls admitted; want max_concurrent, 1", n, calls)
		}
	})
}

// TestApprovedWorkWaitsForASlot: an execution approved while its actor is at max_concurrent
// is not dispatched past the limit. It stays authorized and queued — the agent's
// execution_status and the journal say so, and a new call is still refused — until the
// execution holding the slot ends; then it runs, once.
func TestApprovedWorkWaitsForASlot(t *testing.T) {
	f := startPolicyFleet(t, fleetOptions{tables: []string{`[[rules]]
name = "migrations-need-approval"
decision = "approve"
actors = ["serial"]
commands = ["migrate **"]`}}, harness.ActorSpec{Name: "serial", MaxConcurrent: 1})
	ctx := testContext(t)
	cs := f.session(t, "serial", "run-1")
	g := newGatedCommand(t)
	t.Cleanup(func() { g.open(t) })
	// The gated command as a script, so that its command line is plain words: shell syntax
	// would meet the approve rule.
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, []byte("#!/bin/sh\n"+g.cmd+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	holder := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": hold, "wait_s": 0})
	if markers.JournalGraph.Terminal(markers.State(holder.State)) {
		t.Fatalf("gated command = %+v; want it in flight", holder)
	}
	waitJournaled(t, f.bastion, holder.ExecutionID, markers.Running)
	migrate, file := migrateScript(t)
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": migrate + " up", "wait_s": 0})
	if x.State != string(markers.AwaitingApproval) {
		t.Fatalf("migrate = %+v; want awaiting approval", x)
	}
	mustCLI(t, ctx, f.bastion, "approve", x.ExecutionID, "--note", "ok")

	var rec *markers.Record
	testutil.WaitFor(t, "the approved execution to be queued", func() bool {
		rec = journaled(t, f.bastion, x.ExecutionID)
		return hasEvidence(rec, "queued: actor serial has 1 executions in flight")
	})
	if _, dispatched := rec.StateTimes[markers.Dispatched]; rec.State != markers.Authorized || dispatched {
		t.Fatalf("queued execution: state %s, state times %v; want authorized, never dispatched", rec.State, rec.StateTimes)
	}
	if st := mustCall(t, ctx, cs, "execution_status", map[string]any{"execution_id": x.ExecutionID}); !st.Queued || st.State != string(markers.Authorized) {
		t.Fatalf("execution_status of the queued execution = %+v; want authorized and queued", st)
	}
	if msg := mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo third"}); !strings.Contains(msg, api.CodeConcurrencyLimit) {
		t.Errorf("a new call while one runs and one is queued: %s; want %s", msg, api.CodeConcurrencyLimit)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the queued command ran %d times", n)
	}

	g.open(t)
	first := waitJournaled(t, f.bastion, holder.ExecutionID, markers.Completed)
	rec = waitJournaled(t, f.bastion, x.ExecutionID, markers.Completed)
	if n := effects(t, file); n != 1 {
		t.Fatalf("the approved command ran %d times; want 1", n)
	}
	if !hasEvidence(rec, "a concurrency slot is free: dispatching") || rec.StateTimes[markers.Dispatched].Before(first.StateTimes[markers.Completed]) {
		t.Errorf("approved execution dispatched at %v, the slot's holder completed at %v; want it dispatched after, with evidence %q",
			rec.StateTimes[markers.Dispatched], first.StateTimes[markers.Completed], rec.Evidence)
	}
}

// TestQuotasCountDispatchedWork: a daily quota counts executions that dispatched (or may
// still), not the ones policy rejected; run_daily_quota and run_max_concurrent hold each
// agent run of an actor to its own share, so one run cannot starve another.
func TestQuotasCountDispatchedWork(t *testing.T) {
	f := startPolicyFleet(t, fleetOptions{tables: []string{`[[rules]]
name = "no-forbidden"
decision = "deny"
actors = ["counted"]
commands = ["forbidden **"]`}},
		harness.ActorSpec{Name: "counted", DailyQuota: 2},
		harness.ActorSpec{Name: "per-run", RunDailyQuota: 1},
		harness.ActorSpec{Name: "per-run-serial", RunMaxConcurrent: 1},
	)
	ctx := testContext(t)

	t.Run("rejections do not count", func(t *testing.T) {
		cs := f.session(t, "counted", "run-1")
		for i := range 3 {
			if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": fmt.Sprintf("forbidden %d", i)}); x.State != string(markers.Rejected) {
				t.Fatalf("forbidden %d = %+v; want rejected", i, x)
			}
		}
		for _, tag := range []string{"first", "second"} {
			if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo " + tag}); x.State != string(markers.Completed) {
				t.Fatalf("echo %s after three rejections = %+v; want completed (rejections do not count)", tag, x)
			}
		}
		if msg := mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo third"}); !strings.Contains(msg, api.CodeQuotaExceeded) {
			t.Errorf("third dispatch: %s; want %s", msg, api.CodeQuotaExceeded)
		}
	})

	t.Run("per run quota", func(t *testing.T) {
		a, b := f.session(t, "per-run", "run-a"), f.session(t, "per-run", "run-b")
		if x := mustCall(t, ctx, a, "ssh_exec", map[string]any{"host": "h1", "command": "echo a"}); x.State != string(markers.Completed) {
			t.Fatalf("run-a's first = %+v; want completed", x)
		}
		if msg := mustRefuse(t, ctx, a, "ssh_exec", map[string]any{"host": "h1", "command": "echo a2"}); !strings.Contains(msg, api.CodeQuotaExceeded) || !strings.Contains(msg, "agent run") {
			t.Errorf("run-a's second: %s; want %s for the run", msg, api.CodeQuotaExceeded)
		}
		if x := mustCall(t, ctx, b, "ssh_exec", map[string]any{"host": "h1", "command": "echo b"}); x.State != string(markers.Completed) {
			t.Fatalf("run-b's first = %+v; want completed: run-a's quota is its own", x)
		}
	})

	t.Run("per run concurrency", func(t *testing.T) {
		a, b := f.session(t, "per-run-serial", "run-a"), f.session(t, "per-run-serial", "run-b")
		g := newGatedCommand(t)
		t.Cleanup(func() { g.open(t) })
		running := mustCall(t, ctx, a, "ssh_exec", map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0})
		if markers.JournalGraph.Terminal(markers.State(running.State)) {
			t.Fatalf("gated command = %+v; want it in flight", running)
		}
		if msg := mustRefuse(t, ctx, a, "ssh_exec", map[string]any{"host": "h1", "command": "echo a2"}); !strings.Contains(msg, api.CodeConcurrencyLimit) {
			t.Errorf("run-a's second while its first runs: %s; want %s", msg, api.CodeConcurrencyLimit)
		}
		if x := mustCall(t, ctx, b, "ssh_exec", map[string]any{"host": "h1", "command": "echo b"}); x.State != string(markers.Completed) {
			t.Fatalf("run-b while run-a's command runs = %+v; want completed", x)
		}
		g.open(t)
		waitJournaled(t, f.bastion, running.ExecutionID, markers.Completed)
	})
}
