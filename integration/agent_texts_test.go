package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// What the agent reads: the text of every refusal, as the official TypeScript client hands it
// to a model, says what decided, why and what to do — and never names an operator command or
// another principal's execution. Principals: one key, one execution, whichever actor of a
// principal sends it, over both real transports.

// executionIDPattern finds an execution id in a text.
var executionIDPattern = regexp.MustCompile(`ex_[0-9A-Z]{26}`)

// tsConnectAs connects the TypeScript client over Streamable HTTP as actor, in run run.
func tsConnectAs(b *harness.Bastion, actor, run string) map[string]any {
	return map[string]any{"connect": map[string]any{"url": b.URL, "token": b.Tokens[actor], "run": run}}
}

func tsCall(tool string, args map[string]any) map[string]any {
	return map[string]any{"call": map[string]any{"name": tool, "arguments": args}}
}

// mustSay checks that text holds every want and none of never.
func mustSay(t *testing.T, what, text string, want []string, never ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("%s: the agent reads no %q in:\n%s", what, w, text)
		}
	}
	for _, n := range never {
		if strings.Contains(text, n) {
			t.Errorf("%s: the agent reads %q in:\n%s", what, n, text)
		}
	}
}

// TestWhatTheAgentReadsWhenRefused runs the TypeScript client against a bastion with a deny
// rule, an approval rule, limited actors, a host that refuses the bastion's key and one that
// cannot be reached, and checks the text of each refusal.
func TestWhatTheAgentReadsWhenRefused(t *testing.T) {
	h := harness.StartHostagent(t)
	stranger := harness.StartHostagent(t) // authorizes another key than the bastion's
	b := harness.NewBastion(t, h.ClientKey, `[[rules]]
name = "no-rm"
decision = "deny"
commands = ["rm **"]

[[rules]]
name = "deploys-need-approval"
decision = "approve"
commands = ["deploy **"]
`)
	b.AddActor(t, harness.ActorSpec{Name: "frugal", DailyQuota: 1})
	b.AddActor(t, harness.ActorSpec{Name: "serial", MaxConcurrent: 1})
	b.AddActor(t, harness.ActorSpec{Name: "h1-only", Hosts: []string{"h1"}})
	b.Enroll(t, "h1", h)
	b.Enroll(t, "h2-refuses-key", stranger)
	closed, _ := testutil.ClosedAddr(t)
	inv := config.DefaultConfig(b.StateDir()).InventoryPath()
	if err := fleet.Enroll(inv, fleet.Host{Name: "h3-down", Addr: closed, Account: h.Account, HostKey: h.HostKey}); err != nil {
		t.Fatal(err)
	}
	b.Start(t)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	ctx := testContext(t)

	lines := runTS(t, ctx, tsConnectAs(b, "agent", "texts"),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "rm -rf /tmp/postern-never"}),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "deploy web 42"}),
		tsCall("ssh_exec", map[string]any{"host": "nowhere", "command": "true"}),
		tsCall("ssh_exec", map[string]any{"host": "h2-refuses-key", "command": "true"}),
		tsCall("ssh_exec", map[string]any{"host": "h3-down", "command": "echo 1"}),
		tsCall("ssh_exec", map[string]any{"host": "h3-down", "command": "echo 2"}),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "echo ok"}),
	)
	noOperatorCommand := []string{"postern ", "next dial", "backoff"}

	rejected := lines[1]
	mustSay(t, "policy rejection", rejected.Text, []string{"rejected.", `Cause: denied: denied by rule rules[0] "no-rm": rm -rf /tmp/postern-never`, "Next: Rejected; it was not run"}, noOperatorCommand...)
	if !rejected.IsError || rejected.Result == nil || rejected.Result.State != "rejected" {
		t.Errorf("policy rejection = %+v; want a rejected execution, isError", rejected)
	}

	pending := lines[2]
	mustSay(t, "approval required", pending.Text, []string{"awaiting_approval.", `Cause: approval_required: rule rules[1] "deploys-need-approval" requires a person's approval`,
		"execution_status", "never asks twice"}, noOperatorCommand...)

	mustSay(t, "unknown host", lines[3].Text, []string{`unknown_host: there is no host "nowhere"`, "Use one of your hosts: h1, h2-refuses-key, h3-down."}, noOperatorCommand...)

	refused := lines[4]
	mustSay(t, "host refuses the key", refused.Text, []string{"failed.", "Cause: host_refuses_key: host h2-refuses-key refuses the bastion's SSH key", "Nothing was sent"},
		append(noOperatorCommand, "unreachable")...)

	down1, down2 := lines[5], lines[6]
	for i, l := range []tsLine{down1, down2} {
		mustSay(t, "unreachable host", l.Text, []string{"failed.", "Cause: host_unreachable: host h3-down cannot be reached (connection refused).", "Nothing was sent"},
			append(noOperatorCommand, closed, "dial tcp")...)
		if l.Result == nil || l.Result.Cause == "" {
			t.Fatalf("unreachable host, call %d: %+v", i+1, l)
		}
	}
	if down1.Result.Cause != down2.Result.Cause {
		t.Errorf("the same unreachable host reads two ways:\n%s\n%s", down1.Result.Cause, down2.Result.Cause)
	}

	ok := lines[7]
	if ok.Result == nil || ok.Result.State != "completed" {
		t.Fatalf("ssh_exec on h1 = %+v", ok)
	}
	// Compact evidence: the decision in one line with its class, not the ladder's steps.
	if ev := ok.Result.Evidence; len(ev) == 0 || !strings.HasPrefix(ev[0], "policy: authorized (") || !strings.Contains(ev[0], "class remote_command") ||
		strings.Contains(strings.Join(ev, "\n"), "actor resolved") {
		t.Errorf("evidence of a success = %q; want the decision in one line, then the outcome", ev)
	}

	// The limits, and the hosts an actor limited to h1 is told of.
	lines = runTS(t, ctx, tsConnectAs(b, "frugal", "texts-quota"),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "echo one"}),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "echo two"}),
	)
	mustSay(t, "daily quota", lines[2].Text, []string{"quota_exceeded: actor frugal used its daily quota of 1 executions", "resets at 00:00 UTC", "Nothing was started."}, noOperatorCommand...)

	lines = runTS(t, ctx, tsConnectAs(b, "serial", "texts-concurrency"),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "sleep 30", "wait_s": 0}),
		tsCall("ssh_exec", map[string]any{"host": "h1", "command": "echo second"}),
	)
	mustSay(t, "concurrency", lines[2].Text, []string{"concurrency_limit: actor serial has 1 executions in flight, its limit (max_concurrent).",
		"Wait for one of them to end", "Nothing was started."}, noOperatorCommand...)
	if running := lines[1].Result; running != nil && (running.State == "running" || running.State == "dispatched") {
		mustCall(t, ctx, f.session(t, "serial", "texts-concurrency"), "execution_cancel", map[string]any{"execution_id": running.ExecutionID})
	} else {
		t.Errorf("a long command with wait_s 0 = %+v; want it running", lines[1])
	}

	lines = runTS(t, ctx, tsConnectAs(b, "h1-only", "texts-hosts"),
		tsCall("ssh_exec", map[string]any{"host": "h3-down", "command": "true"}),
		tsCall("ssh_exec", map[string]any{"host": "nowhere", "command": "true"}),
	)
	mustSay(t, "a host the actor may not use", lines[1].Text, []string{"rejected.", "Cause: not_allowed: actor h1-only may not reach host h3-down."}, noOperatorCommand...)
	mustSay(t, "unknown host, limited actor", lines[2].Text, []string{"Use one of your hosts: h1."}, "h2-refuses-key", "h3-down")
	cs := f.session(t, "h1-only", "texts-hosts-list")
	var hosts api.HostsResult
	res, err := harness.CallTool(ctx, cs, "hosts_list", map[string]any{}, &hosts)
	if err != nil || len(hosts.Hosts) != 1 || hosts.Hosts[0].Name != "h1" {
		t.Errorf("hosts_list for an actor limited to h1 = %+v, %v:\n%s", hosts, err, harness.ResultText(res))
	}
}

// TestPrincipalsShareOneKeySpace: the actors of one principal share their idempotency keys —
// the same key and request from another actor of it is the same execution, run once and
// readable by both — while the key in another principal's hands is refused without naming
// that execution, and nothing runs a second time.
func TestPrincipalsShareOneKeySpace(t *testing.T) {
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey, "[[principals]]\nname = \"team\"\nactors = [\"agent\", \"other\"]\n")
	b.AddActor(t, harness.ActorSpec{Name: "outsider"})
	b.Enroll(t, "h1", h)
	b.Start(t)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "principal")
	keyed := func(command string) map[string]any {
		return map[string]any{"host": "h1", "command": command, "idempotency_key": "migrate-2026-07-22"}
	}

	first := mustCall(t, ctx, f.session(t, "agent", "run-a"), "ssh_exec", keyed(cmd))
	if first.State != "completed" || first.Replayed {
		t.Fatalf("first call = %+v; want completed", first)
	}
	other := f.session(t, "other", "run-b")
	again := mustCall(t, ctx, other, "ssh_exec", keyed(cmd))
	if again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Fatalf("the same key from the principal's other actor = %+v; want %s replayed", again, first.ExecutionID)
	}
	if st := statusOf(t, ctx, other, first.ExecutionID); st.ExecutionID != first.ExecutionID {
		t.Fatalf("the other actor cannot read the execution its key handed it: %+v", st)
	}
	if msg := mustRefuse(t, ctx, other, "ssh_exec", keyed("echo another request")); !strings.Contains(msg, api.CodeIdempotencyKeyReused) || !strings.Contains(msg, first.ExecutionID) {
		t.Errorf("another request with the principal's key: %s; want %s naming %s", msg, api.CodeIdempotencyKeyReused, first.ExecutionID)
	}

	outsider := f.session(t, "outsider", "run-c")
	msg := mustRefuse(t, ctx, outsider, "ssh_exec", keyed(cmd))
	if !strings.Contains(msg, api.CodeIdempotencyKeyHeld) || executionIDPattern.MatchString(msg) {
		t.Errorf("the key from another principal: %s; want %s, naming no execution", msg, api.CodeIdempotencyKeyHeld)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	// The outsider never reads the team's execution, however it learns the id.
	if msg := mustRefuse(t, ctx, outsider, "execution_status", map[string]any{"execution_id": first.ExecutionID}); !strings.Contains(msg, api.CodeNotFound) {
		t.Errorf("execution_status of another principal's execution: %s; want not_found", msg)
	}
}

// TestUpCallersAreOnePrincipal: `postern up`'s two callers — its token over Streamable HTTP
// and the stdio bridge of the same user — send the same idempotency_key: the command runs
// once, and the second caller gets the first one's execution (and may read it).
func TestUpCallersAreOnePrincipal(t *testing.T) {
	bin := harness.Binary(t, "postern")
	dir := filepath.Join(sockdir.New(t), "state")
	listen := testutil.FreeAddr(t)
	up, stdout, stderr := startUp(t, bin, dir, listen, testutil.FreeAddr(t))
	t.Cleanup(func() {
		up.Process.Signal(syscall.SIGTERM)
		if err := up.Wait(); err != nil {
			t.Errorf("up exited with %v\n%s", err, stderr.String())
		}
	})
	printed := readUntil(t, stdout, "Operator:")
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	cmd, file := appendCommand(t, "credit-100")
	args := map[string]any{"host": "local", "command": cmd, "idempotency_key": "credit-2026-07-22"}

	httpLines := runTS(t, ctx, map[string]any{"connect": map[string]any{"url": upURL(t, printed), "token": strings.TrimSpace(string(token))}},
		tsCall("ssh_exec", args))
	first := httpLines[1].Result
	if first == nil || first.State != "completed" || first.Replayed {
		t.Fatalf("over HTTP: %+v; want completed", httpLines[1])
	}
	stdioLines := runTS(t, ctx, stdioConnect(bin, filepath.Join(dir, "mcp.sock")),
		tsCall("ssh_exec", args),
		tsCall("execution_status", map[string]any{"execution_id": first.ExecutionID}))
	if x := stdioLines[1].Result; x == nil || x.ExecutionID != first.ExecutionID || !x.Replayed {
		t.Fatalf("through postern mcp: %+v; want %s replayed", stdioLines[1], first.ExecutionID)
	}
	if x := stdioLines[2].Result; x == nil || x.ExecutionID != first.ExecutionID {
		t.Errorf("execution_status through postern mcp: %+v", stdioLines[2])
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}

// TestWaitLongerThanTheClientTimeout: a call whose wait_s outlasts the client's request
// timeout gets its result when the client resets that timeout on progress — the bastion
// sends a progress notification every second while it waits — over Streamable HTTP and
// through the stdio bridge; a client that does not reset it gives up, as wait_s's
// description warns.
func TestWaitLongerThanTheClientTimeout(t *testing.T) {
	f := startFleet(t)
	bin := harness.Binary(t, "postern")
	for name, connect := range map[string]map[string]any{
		"http":  httpConnect(f, "progress"),
		"stdio": stdioConnect(bin, f.bastion.Socket),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			cmd, file := appendCommand(t, "progress-"+name)
			long := map[string]any{"host": "h1", "command": "sleep 3; " + cmd, "wait_s": 10}
			lines := runTS(t, ctx, connect,
				sshExecStep(long, map[string]any{"timeout_ms": 1500, "reset_on_progress": true}))
			if x := lines[1].Result; x == nil || x.State != "completed" || lines[1].Progress < 2 {
				t.Fatalf("a 3 s wait with a 1.5 s timeout reset on progress = %+v; want completed after 2 or more notifications", lines[1])
			}
			if n := effects(t, file); n != 1 {
				t.Fatalf("command ran %d times; want 1", n)
			}
			other := map[string]any{"host": "h1", "command": "sleep 3; echo unreset", "wait_s": 10}
			if l := runTS(t, ctx, connect, sshExecStep(other, map[string]any{"timeout_ms": 1500}))[1]; l.Error == "" {
				t.Errorf("without resetting on progress the client waited it out: %+v", l)
			}
		})
	}
}
