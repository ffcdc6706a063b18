package engine_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// TestExecRunsOnce: a command runs once; a retry of the same call joins it (replayed, its
// stored output) and runs nothing.
func TestExecRunsOnce(t *testing.T) {
	f := newFleet(t)
	c := inRun(alice, "once")
	args := api.ExecArgs{Host: "h1", Command: f.effect("ran") + "; echo hello"}
	first := f.exec(t, c, args)
	finished(t, first)
	if first.Replayed || first.Stdout != "hello\n" {
		t.Errorf("first call: replayed %v, stdout %q; want a new execution printing hello", first.Replayed, first.Stdout)
	}
	again := f.exec(t, c, args)
	if again.ExecutionID != first.ExecutionID || !again.Replayed || again.Stdout != "hello\n" {
		t.Errorf("retry = %s (replayed %v, stdout %q); want %s replayed with its output", again.ExecutionID, again.Replayed, again.Stdout, first.ExecutionID)
	}
	if got := f.count(t, "ran"); got != 1 {
		t.Errorf("the command ran %d times; want 1", got)
	}
}

// TestExecConcurrentCalls: identical calls made at once are one execution: one of them
// creates it, the others join it, and the command runs once.
func TestExecConcurrentCalls(t *testing.T) {
	f := newFleet(t)
	c := inRun(alice, "burst")
	args := api.ExecArgs{Host: "h1", Command: f.effect("ran")}
	const calls = 8
	ids := make([]string, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			x, err := f.engine().Exec(context.Background(), c, args, nil)
			if err == nil {
				ids[i] = x.ExecutionID
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range calls {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Errorf("call %d = %s, %v; want %s", i, ids[i], errs[i], ids[0])
		}
	}
	if n, m := f.count(t, "ran"), f.journaled(t); n != 1 || m != 1 {
		t.Errorf("ran %d times, %d executions journaled; want 1 and 1", n, m)
	}
}

// TestExecIdempotencyKey: a key joins its execution from another agent run, is refused for
// another request, and after an execution that failed without effect starts a new attempt
// linked to it.
func TestExecIdempotencyKey(t *testing.T) {
	f := newFleet(t)
	args := api.ExecArgs{Host: "h1", Command: f.effect("keyed"), CallOptions: api.CallOptions{IdempotencyKey: "deploy-1"}}
	first := f.exec(t, inRun(alice, "r1"), args)
	finished(t, first)

	joined := f.exec(t, inRun(alice, "r2"), args)
	if joined.ExecutionID != first.ExecutionID || !joined.Replayed {
		t.Errorf("the key from another run = %s (replayed %v); want %s replayed", joined.ExecutionID, joined.Replayed, first.ExecutionID)
	}

	other := args
	other.Command = f.effect("other")
	_, err := f.engine().Exec(context.Background(), inRun(alice, "r2"), other, nil)
	if te := wantCode(t, err, api.CodeIdempotencyKeyReused); te.ExecutionID != first.ExecutionID {
		t.Errorf("refusal names %s; want %s", te.ExecutionID, first.ExecutionID)
	}
	later := f.investigated(t, first.ExecutionID, answerLater)
	for _, want := range []string{
		"joined " + first.ExecutionID + " (reused idempotency key deploy-1): its stored result was replayed",
		"reused idempotency key deploy-1 for a different request: refused, nothing dispatched",
	} {
		if !strings.Contains(later, want) {
			t.Errorf("later calls = %q; want %q", later, want)
		}
	}
	if n, m := f.count(t, "keyed"), f.count(t, "other"); n != 1 || m != 0 {
		t.Errorf("side effects: keyed %d, other %d; want 1 and 0", n, m)
	}
	if n := f.journaled(t); n != 1 {
		t.Errorf("%d executions journaled; want 1", n)
	}

	// A cwd that does not exist yet: the host refuses to start it, so it failed without
	// effect, and the same key and request is a new attempt.
	cwd := f.path("later")
	retry := api.ExecArgs{Host: "h1", Command: f.effect("attempt"), Cwd: cwd, CallOptions: api.CallOptions{IdempotencyKey: "deploy-2"}}
	failed := f.exec(t, alice, retry)
	if failed.State != string(markers.Failed) || !failed.IsError {
		t.Fatalf("with a missing cwd = %s (evidence %q); want failed", failed.State, failed.Evidence)
	}
	if err := os.Mkdir(cwd, 0o700); err != nil {
		t.Fatal(err)
	}
	attempt := f.exec(t, alice, retry)
	finished(t, attempt)
	if attempt.ExecutionID == failed.ExecutionID || attempt.PreviousAttempt != failed.ExecutionID || attempt.Replayed {
		t.Errorf("retry after the failure = %s (previous_attempt %q, replayed %v); want a new attempt of %s",
			attempt.ExecutionID, attempt.PreviousAttempt, attempt.Replayed, failed.ExecutionID)
	}
	if got := f.investigated(t, attempt.ExecutionID, answerLater); !strings.Contains(got, "new attempt "+attempt.ExecutionID+" of "+failed.ExecutionID) {
		t.Errorf("later calls = %q; want the new attempt of %s", got, failed.ExecutionID)
	}
	if got := f.count(t, "attempt"); got != 1 {
		t.Errorf("the keyed command ran %d times; want 1", got)
	}
}

// TestExecRefusesBeforeJournaling: invalid arguments and unknown hosts are refused with
// nothing journaled.
func TestExecRefusesBeforeJournaling(t *testing.T) {
	f := newFleet(t)
	tests := []struct {
		name     string
		caller   string
		args     api.ExecArgs
		wantCode string
	}{
		{name: "blank command", args: api.ExecArgs{Host: "h1", Command: " "}, wantCode: api.CodeInvalidArgument},
		{name: "relative cwd", args: api.ExecArgs{Host: "h1", Command: "true", Cwd: "tmp"}, wantCode: api.CodeInvalidArgument},
		{name: "forbidden env", args: api.ExecArgs{Host: "h1", Command: "true", Env: map[string]string{"LD_PRELOAD": "x.so"}}, wantCode: api.CodeInvalidArgument},
		{name: "env the host drops", args: api.ExecArgs{Host: "h1", Command: "true", Env: map[string]string{"RAILS_ENV": "x"}}, wantCode: api.CodeInvalidArgument},
		{name: "wait beyond max_wait", args: api.ExecArgs{Host: "h1", Command: "true", CallOptions: api.CallOptions{WaitS: waitS(3600)}}, wantCode: api.CodeInvalidArgument},
		{name: "unknown host", args: api.ExecArgs{Host: "nope", Command: "true"}, wantCode: api.CodeUnknownHost},
		{name: "no caller", caller: "-", args: api.ExecArgs{Host: "h1", Command: "true"}, wantCode: api.CodeUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := alice
			if tt.caller == "-" {
				c.Actor = ""
			}
			x, err := f.engine().Exec(context.Background(), c, tt.args, nil)
			if x != nil {
				t.Errorf("exec = %+v; want none", x)
			}
			wantCode(t, err, tt.wantCode)
		})
	}
	if n := f.journaled(t); n != 0 {
		t.Errorf("%d executions journaled; want 0", n)
	}
}

// TestExecWaitZero: wait_s 0 returns the execution in progress with its id; it runs on and
// ends.
func TestExecWaitZero(t *testing.T) {
	f := newFleet(t)
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gate("g") + "; " + f.effect("ran"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	if x.ExecutionID == "" || markers.JournalGraph.Terminal(markers.State(x.State)) || !strings.HasPrefix(x.Next, "Still in progress") {
		t.Fatalf("exec with wait_s 0 = %s %q (next %q); want it in progress with its id", x.ExecutionID, x.State, x.Next)
	}
	f.waitState(t, alice, x.ExecutionID, markers.Running)
	joined := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gate("g") + "; " + f.effect("ran"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	if joined.ExecutionID != x.ExecutionID || !joined.Replayed {
		t.Errorf("retry while running = %s (replayed %v); want %s joined", joined.ExecutionID, joined.Replayed, x.ExecutionID)
	}
	if got := f.investigated(t, x.ExecutionID, answerLater); !strings.Contains(got, "attached to it while it ran") {
		t.Errorf("later calls = %q; want the retry attached", got)
	}
	f.release(t, "g")
	end, err := f.engine().AwaitEnd(context.Background(), alice, x.ExecutionID, nil)
	if err != nil {
		t.Fatal(err)
	}
	finished(t, end)
	if got := f.count(t, "ran"); got != 1 {
		t.Errorf("the command ran %d times; want 1", got)
	}
}

// TestExecOperationKey: the host refuses an operation key to every execution but the one
// holding it; the refusal names the holder only to its own actor.
func TestExecOperationKey(t *testing.T) {
	f := newFleet(t)
	first := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.effect("migrate"), OperationKey: "migration:1"})
	finished(t, first)

	again := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.effect("migrate") + "; true", OperationKey: "migration:1"})
	if again.State != string(markers.Failed) || !strings.Contains(again.Cause, first.ExecutionID) || !strings.Contains(again.Next, "already ran as "+first.ExecutionID) {
		t.Errorf("the operation again = %s (cause %q, next %q); want failed, naming %s", again.State, again.Cause, again.Next, first.ExecutionID)
	}
	if again.Stderr != "" {
		t.Errorf("the refusal kept the host's stderr %q; want none", again.Stderr)
	}
	theirs := f.exec(t, bob, api.ExecArgs{Host: "h1", Command: f.effect("migrate"), OperationKey: "migration:1"})
	if theirs.State != string(markers.Failed) || strings.Contains(theirs.Cause+theirs.Next, first.ExecutionID) || !strings.Contains(theirs.Next, "Do not retry") {
		t.Errorf("another actor's try = %s (cause %q, next %q); want failed without naming alice's execution", theirs.State, theirs.Cause, theirs.Next)
	}
	if n := f.count(t, "migrate"); n != 1 {
		t.Errorf("the operation ran %d times; want 1", n)
	}
}

// TestExecOAuthSubjectsDoNotJoin: two people whose tokens map to one actor each have their
// own attach window — the same subject's identical call joins its execution, another
// subject's runs anew.
func TestExecOAuthSubjectsDoNotJoin(t *testing.T) {
	f := newFleet(t)
	ann := transport.Caller{Actor: alice.Actor, Subject: "ann"}
	ben := transport.Caller{Actor: alice.Actor, Subject: "ben"}
	args := api.ExecArgs{Host: "h1", Command: f.effect("ran")}
	first := f.exec(t, ann, args)
	finished(t, first)
	if again := f.exec(t, ann, args); again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Errorf("the same subject's retry = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, first.ExecutionID)
	}
	other := f.exec(t, ben, args)
	finished(t, other)
	if other.ExecutionID == first.ExecutionID || other.Replayed {
		t.Errorf("another subject's call joined %s; want an execution of its own", first.ExecutionID)
	}
	if got := f.count(t, "ran"); got != 2 {
		t.Errorf("the command ran %d times; want 2 (once per subject)", got)
	}
}
