package engine_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestMaxConcurrent: at its limit an actor's new call is refused with nothing journaled, a
// call needing approval is accepted, and once approved it queues until a slot frees.
func TestMaxConcurrent(t *testing.T) {
	f := newGatedFleet(t, func(c *config.Config) { c.Actors[0].MaxConcurrent = 1 })
	ctx := context.Background()
	first := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})

	_, err := f.engine().Exec(ctx, alice, api.ExecArgs{Host: "h1", Command: f.effect("refused")}, nil)
	wantCode(t, err, api.CodeConcurrencyLimit)
	if n := f.journaled(t); n != 1 {
		t.Errorf("%d executions journaled; want only the running one", n)
	}
	// Another actor has its own limits.
	finished(t, f.exec(t, bob, api.ExecArgs{Host: "h1", Command: "true"}))

	pending := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("queued")})
	if pending.State != string(markers.AwaitingApproval) {
		t.Fatalf("a call needing approval at the limit = %s; want awaiting_approval", pending.State)
	}
	if _, err := f.engine().Approve(ctx, testOperator, pending.ExecutionID, ""); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the approved execution to queue", func() bool {
		st, err := f.engine().State(alice, pending.ExecutionID)
		return err == nil && st.Queued
	})
	x, err := f.engine().Status(ctx, alice, pending.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if !x.Queued || x.State != string(markers.Authorized) || !strings.Contains(x.Next, "queued") {
		t.Errorf("status of the queued execution = %s (queued %v, next %q); want authorized and queued", x.State, x.Queued, x.Next)
	}
	if n := f.count(t, "queued"); n != 0 {
		t.Fatalf("the queued command ran %d times before a slot freed", n)
	}

	f.release(t, "g")
	f.waitState(t, alice, first.ExecutionID, markers.Completed)
	f.waitState(t, alice, pending.ExecutionID, markers.Completed)
	if rec := f.record(t, pending.ExecutionID); !hasEvidence(rec.Evidence, "max_concurrent") || !hasEvidence(rec.Evidence, "slot is free") {
		t.Errorf("evidence %q; want it queued, then dequeued", rec.Evidence)
	}
	if n, m := f.count(t, "queued"), f.count(t, "refused"); n != 1 || m != 0 {
		t.Errorf("queued ran %d times, refused %d; want 1 and 0", n, m)
	}
}

// TestDailyQuota: the actor's quota counts the executions that dispatched; a rejected one does
// not count, and the call over the quota is refused with nothing journaled.
func TestDailyQuota(t *testing.T) {
	f := newFleet(t, func(c *config.Config) {
		c.Actors[0].DailyQuota = 2
		c.Rules = []policy.Rule{{Name: "no-reboot", Decision: policy.DecisionDeny, Commands: []string{"reboot"}}}
	})
	rejected := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "reboot"})
	if rejected.State != string(markers.Rejected) {
		t.Fatalf("a denied command = %s; want rejected", rejected.State)
	}
	for i := range 2 {
		finished(t, f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "echo " + strconv.Itoa(i)}))
	}
	// Plain words: a command with shell syntax would match the deny rule's pattern.
	ctx := context.Background()
	_, err := f.engine().Exec(ctx, alice, api.ExecArgs{Host: "h1", Command: "echo over"}, nil)
	wantCode(t, err, api.CodeQuotaExceeded)
	if n := f.journaled(t); n != 3 {
		t.Errorf("%d executions journaled; want 3 (the refused call journals nothing)", n)
	}
	page, err := f.engine().HostMarkers(ctx, "h1", api.MarkerQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Markers) != 2 {
		t.Errorf("the host has %d markers; want the 2 executions that dispatched", len(page.Markers))
	}
	// Another actor has a quota of its own.
	finished(t, f.exec(t, bob, api.ExecArgs{Host: "h1", Command: "echo bob"}))
}

// TestTaskState: State and States show the caller's executions only, page by cursor and
// refuse a cursor the journal did not hand out.
func TestTaskState(t *testing.T) {
	f := newFleet(t)
	var ids []string
	for i := range 3 {
		x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "echo " + strconv.Itoa(i)})
		ids = append(ids, x.ExecutionID)
	}
	theirs := f.exec(t, bob, api.ExecArgs{Host: "h1", Command: "true"})

	st, err := f.engine().State(alice, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.State != string(markers.Completed) || st.Retention != f.engine().Config().ResolveClasses().Get(config.ClassRemoteCommand).Retention {
		t.Errorf("state = %+v; want completed with remote_command's retention", st)
	}
	_, err = f.engine().State(alice, theirs.ExecutionID)
	wantCode(t, err, api.CodeNotFound)

	page, next, err := f.engine().States(alice, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	rest, last, err := f.engine().States(alice, next, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := joinIDs(append(page, rest...), func(s *api.ExecutionState) string { return s.ExecutionID })
	if want := strings.Join([]string{ids[2], ids[1], ids[0]}, ","); got != want || next == "" || last != "" {
		t.Errorf("pages = %s (cursors %q, %q); want %s in two pages", got, next, last, want)
	}
	if _, _, err := f.engine().States(alice, "garbage", 2); !errors.Is(err, markers.ErrInvalidCursor) {
		t.Errorf("states with a bad cursor = %v; want ErrInvalidCursor", err)
	}
}

// TestAwaitEnd: a task's wait reports the state when it begins and each change, and returns
// the result at the end; an actor's waits are bounded.
func TestAwaitEnd(t *testing.T) {
	f := newGatedFleet(t)
	ctx := context.Background()
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	f.waitState(t, alice, x.ExecutionID, markers.Running)

	var mu sync.Mutex
	var seen []string
	type result struct {
		x   *api.Execution
		err error
	}
	done := make(chan result, 1)
	go func() {
		end, err := f.engine().AwaitEnd(ctx, alice, x.ExecutionID, func(s *api.ExecutionState) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, s.State)
		})
		done <- result{end, err}
	}()
	testutil.WaitFor(t, "the wait to report its start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0
	})
	f.release(t, "g")
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	finished(t, res.x)
	if got := strings.Join(seen, ","); got != "running,completed" {
		t.Errorf("changes = %s; want running,completed", got)
	}
	_, err := f.engine().AwaitEnd(ctx, bob, x.ExecutionID, nil)
	wantCode(t, err, api.CodeNotFound)

	// Waits on an execution awaiting approval fill the actor's slots; one more is refused,
	// another actor's is not, and slots free as waits end.
	pending := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: "true"})
	theirs := f.exec(t, bob, api.ExecArgs{Host: "gated", Command: "true"})
	probe := func(c transport.Caller, id string) error {
		ctx, cancel := context.WithCancel(ctx)
		cancel() // takes a slot if there is one, then gives up at once
		_, err := f.engine().AwaitEnd(ctx, c, id, nil)
		return err
	}
	if err := probe(alice, pending.ExecutionID); !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait with slots free = %v; want it to wait", err)
	}
	waitCtx, stopWaits := context.WithCancel(ctx)
	var waits sync.WaitGroup
	const maxWaits = 64 // the engine's maxTaskWaitsPerActor
	for range maxWaits {
		waits.Go(func() { f.engine().AwaitEnd(waitCtx, alice, pending.ExecutionID, nil) })
	}
	testutil.WaitFor(t, "the waits to take every slot", func() bool {
		var te *api.ToolError
		return errors.As(probe(alice, pending.ExecutionID), &te) && te.Code == api.CodeTooManyWaits
	})
	if err := probe(bob, theirs.ExecutionID); !errors.Is(err, context.Canceled) {
		t.Errorf("another actor's wait = %v; want it to wait (its own slots)", err)
	}
	stopWaits()
	waits.Wait()
	if err := probe(alice, pending.ExecutionID); !errors.Is(err, context.Canceled) {
		t.Errorf("a wait after the others ended = %v; want it to wait", err)
	}
}
