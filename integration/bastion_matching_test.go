package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// callRaw calls a tool that returns an execution and returns it with the raw result (its
// text, isError and structured JSON).
func callRaw(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (api.Execution, *mcp.CallToolResult, string) {
	t.Helper()
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, tool, args, &x)
	if err != nil {
		t.Fatalf("%s %v: %v", tool, args, err)
	}
	if x.ExecutionID == "" {
		t.Fatalf("%s %v: no execution: %s", tool, args, harness.ResultText(res))
	}
	structured, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	return x, res, string(structured)
}

// TestKeyedRetryAfterUnreachableHost: a keyed call to a host that cannot be reached fails
// without effect; once the host is back, the same key and request make a new attempt linked
// to the failed one, and the command runs once. The key then names the new attempt: the same
// request replays it, another request is refused and runs nothing.
func TestKeyedRetryAfterUnreachableHost(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "keyed-retry")
	otherCmd, otherFile := appendCommand(t, "keyed-retry-other")
	keyed := func(command string) map[string]any {
		return map[string]any{"host": "h1", "command": command, "idempotency_key": "matching-deploy-1"}
	}

	f.host.Kill(t)
	first, res, _ := callRaw(t, ctx, f.session(t, "agent", "run-a"), "ssh_exec", keyed(cmd))
	failedAt := time.Now()
	if first.State != "failed" || !res.IsError || first.PreviousAttempt != "" {
		t.Fatalf("call to the stopped host = %+v (isError %v); want failed, an error", first, res.IsError)
	}
	text := harness.ResultText(res)
	if !strings.Contains(text, "Cause: host_unreachable: host h1 cannot be reached (connection refused).") || !strings.Contains(text, "Next: Nothing ran") {
		t.Errorf("failed result text does not give the cause and next step:\n%s", text)
	}

	f.host.Start(t)
	// The bastion's pool waits 250ms before it dials a host again after a failed dial.
	time.Sleep(time.Until(failedAt.Add(time.Second)))
	second, res, _ := callRaw(t, ctx, f.session(t, "agent", "run-b"), "ssh_exec", keyed(cmd))
	if second.ExecutionID == first.ExecutionID || second.Replayed || second.State != "completed" || res.IsError {
		t.Fatalf("retry with the same key = %+v (isError %v); want a new execution, completed", second, res.IsError)
	}
	if second.PreviousAttempt != first.ExecutionID {
		t.Errorf("previous_attempt = %q; want %s", second.PreviousAttempt, first.ExecutionID)
	}
	if text := harness.ResultText(res); !strings.Contains(text, "New attempt after "+first.ExecutionID) {
		t.Errorf("text does not name the previous attempt:\n%s", text)
	}
	if rec := journaled(t, f.bastion, second.ExecutionID); rec.PreviousAttempt != first.ExecutionID {
		t.Errorf("journaled previous_attempt = %q; want %s", rec.PreviousAttempt, first.ExecutionID)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want once", n)
	}

	t.Run("same key and request replays the new attempt", func(t *testing.T) {
		x := mustCall(t, ctx, f.session(t, "agent", "run-c"), "ssh_exec", keyed(cmd))
		if x.ExecutionID != second.ExecutionID || !x.Replayed {
			t.Fatalf("call = %+v; want %s replayed", x, second.ExecutionID)
		}
	})
	t.Run("same key, another command", func(t *testing.T) {
		msg := mustRefuse(t, ctx, f.session(t, "agent", "run-c"), "ssh_exec", keyed(otherCmd))
		if !strings.Contains(msg, "idempotency_key_reused") || !strings.Contains(msg, second.ExecutionID) {
			t.Fatalf("refusal %q; want idempotency_key_reused naming %s", msg, second.ExecutionID)
		}
	})
	if n := effects(t, file); n != 1 {
		t.Errorf("command ran %d times; want once", n)
	}
	if n := effects(t, otherFile); n != 0 {
		t.Errorf("the refused command ran %d times", n)
	}
}

// TestOperationKeyConflictNamesOnlyYourOwnExecution: the host refuses a second execution of
// an operation key. The actor that ran the operation is told which execution did; another
// actor learns only that the key is taken — never the id (the bastion reaches the host with
// one SSH identity, so the host names it to the bastion).
func TestOperationKeyConflictNamesOnlyYourOwnExecution(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "migration")
	op := func(command string) map[string]any {
		return map[string]any{"host": "h1", "command": command, "operation_key": "migration:matching-7"}
	}
	ran := mustCall(t, ctx, f.session(t, "agent", "run-a"), "ssh_exec", op(cmd))
	if ran.State != "completed" {
		t.Fatalf("first execution of the operation = %+v; want completed", ran)
	}

	t.Run("another actor", func(t *testing.T) {
		x, res, structured := callRaw(t, ctx, f.session(t, "other", "run-a"), "ssh_exec", op(cmd))
		text := harness.ResultText(res)
		if x.State != "failed" || !res.IsError {
			t.Fatalf("other actor's call = %+v (isError %v); want failed", x, res.IsError)
		}
		if strings.Contains(text, ran.ExecutionID) || strings.Contains(structured, ran.ExecutionID) {
			t.Fatalf("another actor's result names %s:\n%s\n%s", ran.ExecutionID, text, structured)
		}
		if !strings.Contains(text, "taken by another execution") || !strings.Contains(text, "Do not retry") {
			t.Errorf("text does not say the key is taken:\n%s", text)
		}
	})
	t.Run("same actor", func(t *testing.T) {
		x, res, _ := callRaw(t, ctx, f.session(t, "agent", "run-b"), "ssh_exec", op(cmd))
		text := harness.ResultText(res)
		if x.State != "failed" || !res.IsError {
			t.Fatalf("same actor's second call = %+v (isError %v); want failed", x, res.IsError)
		}
		if !strings.Contains(text, "already ran as "+ran.ExecutionID) || !strings.Contains(text, "do not run it again") {
			t.Errorf("text does not name the execution that ran the operation:\n%s", text)
		}
		// Reading it is not an error: the read succeeded, its state says what happened.
		_, res, _ = callRaw(t, ctx, f.session(t, "agent", "run-b"), "execution_status", map[string]any{"execution_id": x.ExecutionID})
		if res.IsError {
			t.Errorf("execution_status of a failed execution is an error result")
		}
	})
	if n := effects(t, file); n != 1 {
		t.Errorf("operation ran %d times; want once", n)
	}
}

// TestKeyedCallDoesNotHideAnUnkeyedOne: a keyed call of the same command in the same run is
// another request (matched by its key only); it must not hide the unkeyed execution from a
// retry of the unkeyed call, which joins it rather than running the command again.
func TestKeyedCallDoesNotHideAnUnkeyedOne(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	cs := f.session(t, "agent", "run-a")
	unkeyed := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}
	keyed := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0, "idempotency_key": "matching-hide-1"}

	first := mustCall(t, ctx, cs, "ssh_exec", unkeyed)
	withKey := mustCall(t, ctx, cs, "ssh_exec", keyed)
	if withKey.ExecutionID == first.ExecutionID {
		t.Fatalf("keyed call joined the unkeyed execution %s; want its own", first.ExecutionID)
	}
	retry := mustCall(t, ctx, cs, "ssh_exec", unkeyed)
	if retry.ExecutionID != first.ExecutionID || !retry.Replayed {
		t.Fatalf("retry of the unkeyed call = %+v; want %s joined", retry, first.ExecutionID)
	}
	g.open(t)
	for _, id := range []string{first.ExecutionID, withKey.ExecutionID} {
		waitForState(t, ctx, cs, id, "completed")
	}
	if n := effects(t, g.file); n != 2 {
		t.Errorf("command ran %d times; want twice (the unkeyed and the keyed execution)", n)
	}
}
