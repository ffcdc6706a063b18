package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// Approvals in the client: the official TypeScript SDK, declaring elicitation, talks to the
// bastion through the stdio bridge (`postern mcp`); an execution awaiting approval asks its
// user with a form, once, and the answer is journaled as the agent's user's decision.

// approveInBand needs approval for migrate (remote_command, opened to the client's user
// with operator_approval_only = false) and pay (irreversible: operator only, the default).
const approveInBand = `[[classes]]
name = "remote_command"
operator_approval_only = false

[[rules]]
name = "migrations-need-approval"
decision = "approve"
commands = ["migrate **"]

[[rules]]
name = "payments"
decision = "approve"
class = "irreversible"
commands = ["pay **"]`

type tsElicitLine struct {
	Step     int            `json:"step"`
	Forged   string         `json:"forged"`
	Result   *api.Execution `json:"result"`
	Asked    int            `json:"asked"`
	Messages []string       `json:"messages"`
	Error    string         `json:"error"`
	raw      string
}

// runTSElicit runs elicit.mjs through the stdio bridge; runTSElicitOver connects with conn.
func runTSElicit(t *testing.T, ctx context.Context, f *testbed, steps ...map[string]any) []tsElicitLine {
	t.Helper()
	return runTSElicitOver(t, ctx, stdioConnect(harness.Binary(t, "postern"), f.bastion.Socket), steps...)
}

func runTSElicitOver(t *testing.T, ctx context.Context, conn map[string]any, steps ...map[string]any) []tsElicitLine {
	t.Helper()
	steps = append([]map[string]any{conn}, steps...)
	out, err := tsScriptCommand(t, ctx, "elicit.mjs", steps).Output()
	if err != nil {
		t.Fatalf("TypeScript elicitation client: %v; output:\n%s", err, out)
	}
	var lines []tsElicitLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l tsElicitLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("TypeScript elicitation client printed %q: %v", sc.Text(), err)
		}
		l.raw = sc.Text()
		t.Logf("ts: %s", l.raw)
		lines = append(lines, l)
	}
	if len(lines) != len(steps) {
		t.Fatalf("TypeScript elicitation client printed %d lines for %d steps:\n%s", len(lines), len(steps), out)
	}
	return lines[1:]
}

// script writes an executable named name that appends its arguments to a file: its line
// count is the number of times it ran.
func script(t *testing.T, name string) (path, file string) {
	t.Helper()
	dir := t.TempDir()
	path, file = filepath.Join(dir, name), filepath.Join(dir, "effects")
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho \"$*\" >> "+file+"\necho done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, file
}

func callStep(args map[string]any) map[string]any {
	return map[string]any{"call": map[string]any{"name": "ssh_exec", "arguments": args}}
}

// decisionEvent returns the note of the event that took execution id out of
// awaiting_approval.
func decisionEvent(t *testing.T, ctx context.Context, f *testbed, id string) string {
	t.Helper()
	for _, e := range showExecution(t, ctx, f.bastion, id).Events {
		if e.From == markers.AwaitingApproval && e.To != "" && e.To != markers.AwaitingApproval {
			return e.Note
		}
	}
	return ""
}

// TestElicitationApprove: the user approves in the client; the call returns the completed
// execution, the command ran once, and the journal names the agent's user as the approver.
func TestElicitationApprove(t *testing.T) {
	f := startFleet(t, approveInBand)
	ctx := testContext(t)
	migrate, file := script(t, "migrate")
	args := map[string]any{"host": "h1", "command": migrate + " up", "wait_s": 30}

	lines := runTSElicit(t, ctx, f, map[string]any{"answer": "approve", "note": "looks right"}, callStep(args))
	got := lines[1]
	if got.Result == nil || got.Result.State != "completed" || got.Result.Stdout != "done\n" || got.Asked != 1 {
		t.Fatalf("approved call = %s; want completed after one question", got.raw)
	}
	if !strings.Contains(got.Messages[0], got.Result.ExecutionID) || !strings.Contains(got.Messages[0], "migrate") {
		t.Fatalf("the question %q does not name the execution and its command", got.Messages[0])
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the approved command ran %d times, want 1", n)
	}
	note := decisionEvent(t, ctx, f, got.Result.ExecutionID)
	if !strings.Contains(note, "approved by the agent's user, by elicitation") || !strings.Contains(note, "looks right") {
		t.Fatalf("the decision is journaled as %q", note)
	}
}

// TestElicitationDenyNotAskedAgain: the user denies; the call returns the rejection; a retry
// of the same call (the same execution) returns the same rejection without asking again.
func TestElicitationDenyNotAskedAgain(t *testing.T) {
	f := startFleet(t, approveInBand)
	ctx := testContext(t)
	migrate, file := script(t, "migrate")
	args := map[string]any{"host": "h1", "command": migrate + " down", "wait_s": 30}

	lines := runTSElicit(t, ctx, f, map[string]any{"answer": "deny", "note": "not today"}, callStep(args), callStep(args))
	first, retry := lines[1], lines[2]
	if first.Result == nil || first.Result.State != "rejected" || first.Asked != 1 {
		t.Fatalf("denied call = %s; want rejected after one question", first.raw)
	}
	if retry.Result == nil || retry.Result.ExecutionID != first.Result.ExecutionID || retry.Result.State != "rejected" || retry.Asked != 1 {
		t.Fatalf("retry = %s; want the same rejection, not asked again", retry.raw)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the denied command ran %d times", n)
	}
	if note := decisionEvent(t, ctx, f, first.Result.ExecutionID); !strings.Contains(note, "denied by the agent's user, by elicitation") || !strings.Contains(note, "not today") {
		t.Fatalf("the decision is journaled as %q", note)
	}
}

// TestElicitationDeclinedOperatorDecides: the user dismisses the form; the call returns the
// pending execution, a retry is not asked again, and the operator CLI approves it. An
// irreversible command is never asked in the client (operator approval only, by default).
func TestElicitationDeclinedOperatorDecides(t *testing.T) {
	f := startFleet(t, approveInBand)
	ctx := testContext(t)
	migrate, file := script(t, "migrate")
	pay, paid := script(t, "pay")
	args := map[string]any{"host": "h1", "command": migrate + " sideways", "wait_s": 5}

	lines := runTSElicit(t, ctx, f, map[string]any{"answer": "decline"}, callStep(args), callStep(args),
		callStep(map[string]any{"host": "h1", "command": pay + " 100", "wait_s": 5}))
	first, retry, payment := lines[1], lines[2], lines[3]
	if first.Result == nil || first.Result.State != "awaiting_approval" || first.Asked != 1 {
		t.Fatalf("declined call = %s; want awaiting_approval after one question", first.raw)
	}
	if retry.Result == nil || retry.Result.ExecutionID != first.Result.ExecutionID || retry.Asked != 1 {
		t.Fatalf("retry = %s; want the same pending execution, not asked again", retry.raw)
	}
	if payment.Result == nil || payment.Result.State != "awaiting_approval" || payment.Asked != 1 {
		t.Fatalf("irreversible call = %s; want awaiting_approval without a question", payment.raw)
	}
	mustCLI(t, ctx, f.bastion, "approve", first.Result.ExecutionID, "--note", "ok")
	waitJournaled(t, f.bastion, first.Result.ExecutionID, markers.Completed)
	if n := effects(t, file); n != 1 {
		t.Fatalf("the operator-approved command ran %d times, want 1", n)
	}
	if n := effects(t, paid); n != 0 {
		t.Fatalf("the pending payment ran %d times", n)
	}
}

// TestElicitationDecisionOnlyFromTheOfferedBridge: the kernel shows that a connection comes
// from a child of the agent, not that it is the bridge the approval was offered to. A process
// the agent started (curl here, as a model's shell could run it) that names the agent as its
// parent, as a bridge does, and sends postern/approval itself — while or after the user is
// asked — is refused: it lacks the offer's token. The execution stays awaiting approval. Nor
// is such a process, which is not the daemon's own binary, offered an approval (with a token)
// for a call it makes itself.
func TestElicitationDecisionOnlyFromTheOfferedBridge(t *testing.T) {
	f := startFleet(t, approveInBand)
	ctx := testContext(t)
	migrate, file := script(t, "migrate")
	args := map[string]any{"host": "h1", "command": migrate + " forged", "wait_s": 5}

	other := map[string]any{"host": "h1", "command": migrate + " forged-too", "wait_s": 0}
	lines := runTSElicit(t, ctx, f, map[string]any{"answer": "decline"}, callStep(args),
		map[string]any{"forge": map[string]any{"socket": f.bastion.Socket, "decision": "approve"}},
		map[string]any{"forge": map[string]any{"socket": f.bastion.Socket, "call": map[string]any{"name": "ssh_exec", "arguments": other}}})
	first, forged, forgedCall := lines[1], lines[2], lines[3]
	if first.Result == nil || first.Result.State != "awaiting_approval" || first.Asked != 1 {
		t.Fatalf("declined call = %s; want awaiting_approval after one question", first.raw)
	}
	if !strings.Contains(forged.Forged, "not_offered") {
		t.Fatalf("the forged decision was answered %q; want not_offered", forged.Forged)
	}
	// Nor is such a process offered an approval (with its token) for a call of its own.
	if !strings.Contains(forgedCall.Forged, "awaiting_approval") || strings.Contains(forgedCall.Forged, "approval-offer") {
		t.Fatalf("a call from a child that is not the bridge was answered %q; want awaiting_approval without an offer", forgedCall.Forged)
	}
	if rec := showExecution(t, ctx, f.bastion, first.Result.ExecutionID); rec.Record.State != markers.AwaitingApproval {
		t.Fatalf("after the forged decision the execution is %s; want awaiting_approval", rec.Record.State)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the command ran %d times after a forged approval", n)
	}
}

// TestElicitationHTTPSessions: with http_sessions, a Streamable HTTP client of protocol
// 2025-11-25 gets a stateful session, and the bastion asks its user itself: approved, the
// call returns the completed execution, whose result is delivered (the evidence works in a
// session too); denied, a retry returns the rejection without asking again.
func TestElicitationHTTPSessions(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{"http_sessions = true"}, tables: []string{approveInBand}})
	ctx := testContext(t)
	migrate, file := script(t, "migrate")
	up := map[string]any{"host": "h1", "command": migrate + " up", "wait_s": 30}
	down := map[string]any{"host": "h1", "command": migrate + " down", "wait_s": 30}

	lines := runTSElicitOver(t, ctx, httpConnect(f, "http-sessions"),
		map[string]any{"answer": "approve", "note": "go"}, callStep(up),
		map[string]any{"answer": "deny", "note": "no"}, callStep(down), callStep(down))
	approved, denied, retry := lines[1], lines[3], lines[4]
	if approved.Result == nil || approved.Result.State != "completed" || approved.Asked != 1 {
		t.Fatalf("approved call = %s; want completed after one question", approved.raw)
	}
	if denied.Result == nil || denied.Result.State != "rejected" || denied.Asked != 2 {
		t.Fatalf("denied call = %s; want rejected after a second question", denied.raw)
	}
	if retry.Result == nil || retry.Result.ExecutionID != denied.Result.ExecutionID || retry.Result.State != "rejected" || retry.Asked != 2 {
		t.Fatalf("retry = %s; want the same rejection, not asked again", retry.raw)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the commands ran %d times, want 1 (the approved one)", n)
	}
	if note := decisionEvent(t, ctx, f, approved.Result.ExecutionID); !strings.Contains(note, "approved by the agent's user, by elicitation (token:agent") {
		t.Fatalf("the decision is journaled as %q", note)
	}
	testutil.WaitFor(t, "the approved result journaled as delivered", func() bool {
		return journaled(t, f.bastion, approved.Result.ExecutionID).ResultDeliveredAt != nil
	})
}
