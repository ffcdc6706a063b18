package integration

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// hostExecs counts the exec requests a hostagent received for execution id.
func hostExecs(h *harness.Hostagent, id string) int {
	n := 0
	for _, line := range strings.Split(h.Logs(), "\n") {
		if strings.Contains(line, "msg=exec ") && strings.Contains(line, "execution_id="+id) {
			n++
		}
	}
	return n
}

// settleTicks lets the bastion's reconcile loop (reconcile_interval 1s in tests) run a few
// times, so that a test can check it did not act.
func settleTicks() { time.Sleep(3 * time.Second) }

// TestMissingCwdFailsHonestly: a command whose cwd does not exist ends failed — provably not
// run — with evidence that names the cwd and the host (not the shell); status, cancel and a
// retry answer from the record, and the failed execution is never sent again.
func TestMissingCwdFailsHonestly(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cc := hostControl(t, f.host)
	cs := f.session(t, "agent", "run-cwd")
	cmd, file := appendCommand(t, "ran")
	cwd := filepath.Join(t.TempDir(), "missing")
	args := map[string]any{"host": "h1", "command": cmd, "cwd": cwd, "wait_s": 10}

	x := mustCall(t, ctx, cs, "ssh_exec", args)
	cause := "cwd " + cwd + " does not exist"
	if x.State != string(markers.Failed) || !x.IsError {
		t.Fatalf("ssh_exec with a missing cwd = %+v; want failed", x)
	}
	if !containsAll(x.Evidence, cause+" on host h1") || !strings.Contains(x.Next, cause) || !strings.Contains(x.Stderr, cause) {
		t.Errorf("evidence %q, next %q, stderr %q; want each to name %q (on host h1)", x.Evidence, x.Next, x.Stderr, cause)
	}
	if strings.Contains(x.Stderr, "/bin/") || containsAll(x.Evidence, "/bin/") {
		t.Errorf("stderr %q, evidence %q blame the shell", x.Stderr, x.Evidence)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the command ran %d times", n)
	}
	if rec := journaled(t, f.bastion, x.ExecutionID); rec.StartError != cause || rec.ReviewRequired {
		t.Errorf("journal record: start error %q, review required %v; want %q and no review", rec.StartError, rec.ReviewRequired, cause)
	}
	if m := harness.Marker(t, ctx, cc, x.ExecutionID); m == nil || m.State != hostproto.MarkerStartFailed || m.StartError != cause {
		t.Errorf("host marker = %+v; want start_failed with %q", m, cause)
	}

	if st := statusOf(t, ctx, cs, x.ExecutionID); st.State != string(markers.Failed) {
		t.Errorf("execution_status = %+v; want failed", st)
	}
	if c := mustCall(t, ctx, cs, "execution_cancel", map[string]any{"execution_id": x.ExecutionID}); c.State != string(markers.Failed) || !strings.Contains(c.Next, "already ended") {
		t.Errorf("execution_cancel = %+v; want failed, already ended", c)
	}
	if res := operatorCLI(t, ctx, f.bastion, "review", x.ExecutionID, "--outcome", "completed", "--note", "no"); res.code != 1 || !strings.Contains(res.stderr, "outcome is known") {
		t.Errorf("review of a failed execution: exit %d, stderr %q; want exit 1, its outcome is known", res.code, res.stderr)
	}

	// A failed execution no longer matches: the retry is a new execution, which fails the
	// same way; the first is not sent again, by the retry or by the reconcile loop.
	y := mustCall(t, ctx, cs, "ssh_exec", args)
	if y.ExecutionID == x.ExecutionID || y.State != string(markers.Failed) {
		t.Fatalf("retry = %+v; want a new execution, failed", y)
	}
	settleTicks()
	if n := hostExecs(f.host, x.ExecutionID); n != 1 {
		t.Errorf("the host was sent %s %d times; want once", x.ExecutionID, n)
	}
	if n := effects(t, file); n != 0 {
		t.Errorf("the command ran %d times", n)
	}
}

func containsAll(ev []string, substr string) bool {
	for _, e := range ev {
		if strings.Contains(e, substr) {
			return true
		}
	}
	return false
}

// journalDispatched writes an ssh_exec execution that a previous bastion accepted at `at` and
// journaled as dispatched before it stopped — the host never got it. The bastion must not run.
func journalDispatched(t *testing.T, b *harness.Bastion, at time.Time, command string) string {
	t.Helper()
	cfg := config.DefaultConfig(b.StateDir())
	signer, _, err := markers.LoadOrCreateAuditKey(cfg.AuditKeyPath(), "postern-bastion")
	if err != nil {
		t.Fatal(err)
	}
	store, err := markers.Open(cfg.JournalDir(), markers.Options{Graph: markers.JournalGraph, Signer: signer, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	id, err := markers.NewExecutionID(at)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := store.Create(ctx, &markers.Record{
		ID: id, Actor: "token:agent", IntentScope: "run:before-the-crash", Fingerprint: "hmac-sha256:" + id,
		Tool: "ssh_exec", Channel: "ssh", Target: "host:h1", Command: []string{"sh", "-c", command},
		Cwd: t.TempDir(), Class: config.ClassRemoteCommand, Decision: "authorized", Host: "h1",
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Advance(ctx, id, markers.Accepted, []markers.State{markers.Authorized, markers.Dispatched}, "dispatching to h1", nil); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestNoMarkerBeyondRetentionNeedsReview: "the host has no marker, so it never started"
// holds only while the host keeps markers of that age. An execution in flight older than the
// host's marker retention is never re-dispatched: it becomes unknown with review required
// (typed, shown to the agent and the operator) until an operator reviews it. A young one with
// no marker is re-dispatched under its id and runs once.
func TestNoMarkerBeyondRetentionNeedsReview(t *testing.T) {
	h := harness.StartHostagent(t, `marker_retention = "24h"`)
	b := harness.NewBastion(t, h.ClientKey)
	b.Enroll(t, "h1", h)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	oldCmd, oldFile := appendCommand(t, "old")
	youngCmd, youngFile := appendCommand(t, "young")
	now := time.Now()
	old := journalDispatched(t, b, now.Add(-48*time.Hour), oldCmd)
	young := journalDispatched(t, b, now.Add(-time.Minute), youngCmd)
	b.Start(t)
	ctx := testContext(t)

	rec := waitJournaled(t, b, old, markers.Unknown)
	if !rec.ReviewRequired || !hasEvidence(rec, "keeps markers for 24h0m0s") {
		t.Errorf("old execution: review required %v, evidence %q; want review required, naming the host's retention", rec.ReviewRequired, rec.Evidence)
	}
	waitJournaled(t, b, young, markers.Completed)
	if n := effects(t, youngFile); n != 1 {
		t.Errorf("the young execution ran %d times; want once (re-dispatched under its id)", n)
	}

	cs := f.session(t, "agent", "run-horizon")
	x := statusOf(t, ctx, cs, old)
	if x.State != string(markers.Unknown) || !x.ReviewRequired || !strings.Contains(x.Next, "review") {
		t.Errorf("execution_status = %+v; want unknown, review_required, and a next step naming the review", x)
	}
	if out := mustCLI(t, ctx, b, "executions", "list", "--review-required"); !strings.Contains(out, old) || strings.Contains(out, young) || !strings.Contains(out, "review required") {
		t.Errorf("executions list --review-required:\n%s\nwant %s only, marked review required", out, old)
	}
	settleTicks()
	if n, m := hostExecs(h, old), effects(t, oldFile); n != 0 || m != 0 {
		t.Fatalf("the old execution was sent %d times and ran %d times; want never", n, m)
	}

	if out := mustCLI(t, ctx, b, "review", old, "--outcome", "not-run", "--note", "checked the host"); !strings.Contains(out, "failed") {
		t.Fatalf("review printed %q; want failed", out)
	}
	if rec := journaled(t, b, old); rec.State != markers.Failed || rec.ReviewRequired {
		t.Errorf("after review: %s, review required %v; want failed, no review", rec.State, rec.ReviewRequired)
	}
}

// TestCancelOfExecutionTheHostNeverStarted: execution_cancel of an execution whose host was
// unreachable cannot be delivered, but it is not lost: once the host answers that it has no
// marker, the execution is cancelled instead of dispatched again.
func TestCancelOfExecutionTheHostNeverStarted(t *testing.T) {
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey)
	b.Enroll(t, "h1", h)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	cmd, file := appendCommand(t, "cancelled")
	id := journalDispatched(t, b, time.Now().Add(-time.Minute), cmd)
	h.Kill(t)
	b.Start(t)
	ctx := testContext(t)
	waitJournaled(t, b, id, markers.Unknown)

	cs := f.session(t, "agent", "run-cancel")
	x := mustCall(t, ctx, cs, "execution_cancel", map[string]any{"execution_id": id})
	if x.State != string(markers.Unknown) || !strings.Contains(x.Next, "could not be delivered") {
		t.Errorf("execution_cancel with the host down = %+v; want unknown, not delivered", x)
	}
	h.Start(t)
	rec := waitJournaled(t, b, id, markers.Cancelled)
	if !hasEvidence(rec, "never started") {
		t.Errorf("evidence %q; want it to say the host never started it", rec.Evidence)
	}
	settleTicks()
	if n, m := hostExecs(h, id), effects(t, file); n != 0 || m != 0 {
		t.Errorf("the cancelled execution was sent %d times and ran %d times; want never", n, m)
	}
}

// TestMissingCwdWithRealClients: the clients agents use see a missing cwd end failed with its
// cause, and a retry run nothing: the TypeScript SDK over Streamable HTTP and through the
// stdio bridge, and curl. Nothing is left in flight.
func TestMissingCwdWithRealClients(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	check := func(t *testing.T, x *api.Execution, cause string) {
		t.Helper()
		if x == nil || x.State != string(markers.Failed) || !x.IsError || !strings.Contains(x.Cause, cause) || !strings.Contains(x.Next, cause) {
			t.Fatalf("result = %+v; want failed, is_error, cause and next naming %q", x, cause)
		}
	}
	for _, via := range []string{"ts-http", "ts-stdio", "curl"} {
		t.Run(via, func(t *testing.T) {
			cmd, file := appendCommand(t, via)
			cwd := filepath.Join(t.TempDir(), "missing")
			cause := "cwd " + cwd + " does not exist"
			args := map[string]any{"host": "h1", "command": cmd, "cwd": cwd, "wait_s": 10}
			var first, retry *api.Execution
			switch via {
			case "ts-http", "ts-stdio":
				connect := httpConnect(f, "run-"+via)
				if via == "ts-stdio" {
					connect = stdioConnect(harness.Binary(t, "postern"), f.bastion.Socket)
				}
				lines := runTS(t, ctx, connect, sshExecStep(args, nil), sshExecStep(args, nil))
				first, retry = lines[1].Result, lines[2].Result
			case "curl":
				body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
					"params": map[string]any{"name": "ssh_exec", "arguments": args}})
				if err != nil {
					t.Fatal(err)
				}
				call := func() *api.Execution {
					out, err := exec.CommandContext(ctx, "curl", "-sS", "--max-time", "30", f.bastion.URL,
						"-H", "Authorization: Bearer "+f.bastion.Tokens["agent"], "-H", "Postern-Run: curl-cwd",
						"-H", "Content-Type: application/json", "-H", "Accept: application/json, text/event-stream",
						"-H", "Mcp-Protocol-Version: 2025-06-18", "--data-binary", string(body)).Output()
					if err != nil {
						t.Fatalf("curl: %v: %s", err, out)
					}
					x := sseResult(t, out)
					return &x
				}
				first, retry = call(), call()
			}
			check(t, first, cause)
			check(t, retry, cause)
			if retry.ExecutionID == first.ExecutionID {
				t.Errorf("retry = %s; a failed execution never matches, want a new one", retry.ExecutionID)
			}
			if n := effects(t, file); n != 0 {
				t.Fatalf("the command ran %d times", n)
			}
			for _, id := range []string{first.ExecutionID, retry.ExecutionID} {
				if rec := journaled(t, f.bastion, id); rec.State != markers.Failed {
					t.Errorf("%s is %s in the journal; want failed", id, rec.State)
				}
			}
		})
	}
}
