package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// gated is a command line that records its start, waits at gate g, then prints done.
func (f *testFleet) gated(g string) string {
	return f.effect(g+".started") + "; " + f.gate(g) + "; echo done"
}

// waitStarted waits until the command of gated(g) started: its first side effect. The
// journal's running comes earlier, with the host's first marker, written before the
// process starts.
func (f *testFleet) waitStarted(t testing.TB, g string) {
	t.Helper()
	testutil.WaitFor(t, "the command at gate "+g+" to start", func() bool { return f.count(t, g+".started") > 0 })
}

// hasEvidence reports whether some evidence line contains s.
func hasEvidence(ev []string, s string) bool {
	return slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, s) })
}

// TestRecoverAttachesToRunning: an engine closed while a command runs is reopened; Recover
// asks the host, attaches to the command, and takes its outcome — it never starts it again.
func TestRecoverAttachesToRunning(t *testing.T) {
	f := newFleet(t)
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	f.waitState(t, alice, x.ExecutionID, markers.Running)

	f.reopen(t)
	if rec := f.record(t, x.ExecutionID); rec.State != markers.Running || !hasEvidence(rec.Evidence, "attaching") {
		t.Errorf("after Recover: %s, evidence %q; want running, attached", rec.State, rec.Evidence)
	}
	f.release(t, "g")
	end, err := f.engine().AwaitEnd(context.Background(), alice, x.ExecutionID, nil)
	if err != nil {
		t.Fatal(err)
	}
	finished(t, end)
	if end.Stdout != "done\n" {
		t.Errorf("stdout %q; want the command's output", end.Stdout)
	}
	if n := f.count(t, "g.started"); n != 1 {
		t.Errorf("the command started %d times; want 1", n)
	}
}

// TestRecoverTakesOutcome: a command that ended while the engine was closed is settled from
// the host's marker after Recover, with its output (the host replays it).
func TestRecoverTakesOutcome(t *testing.T) {
	f := newFleet(t)
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	f.waitState(t, alice, x.ExecutionID, markers.Running)
	f.closeEngine(t, f.engine())
	f.release(t, "g")
	testutil.WaitFor(t, "the host's marker to show the exit", func() bool {
		m := f.hostMarker(t, x.ExecutionID)
		return m != nil && m.State == hostproto.MarkerExited
	})

	f.open(t)
	f.waitState(t, alice, x.ExecutionID, markers.Completed)
	rec := f.record(t, x.ExecutionID)
	if rec.State != markers.Completed || rec.ExitCode == nil || *rec.ExitCode != 0 {
		t.Fatalf("after Recover: %s (exit %v, evidence %q); want completed with exit 0", rec.State, rec.ExitCode, rec.Evidence)
	}
	st, err := f.engine().Status(context.Background(), alice, x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Stdout != "done\n" {
		t.Errorf("stdout %q; want the output the command printed while the engine was closed", st.Stdout)
	}
	if n := f.count(t, "g.started"); n != 1 {
		t.Errorf("the command started %d times; want 1", n)
	}
}

// TestHostLostMidCommand: the hostagent dies while a command runs. The execution's outcome
// is unknown; a retry while the host is down joins it and sends nothing, a new call fails
// with nothing sent; once the host is back, the reconcile loop attaches to the command,
// which never started twice.
func TestHostLostMidCommand(t *testing.T) {
	f := newFleet(t, func(c *config.Config) { c.ReconcileInterval = 50 * time.Millisecond })
	args := api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}}
	x := f.exec(t, alice, args)
	f.waitStarted(t, "g")

	f.host.Kill(t)
	f.waitState(t, alice, x.ExecutionID, markers.Unknown)
	retry := args
	retry.WaitS = waitS(5)
	again := f.exec(t, alice, retry)
	if again.ExecutionID != x.ExecutionID || !again.Replayed || again.State != string(markers.Unknown) || !strings.Contains(again.Next, "NOT known") {
		t.Errorf("retry while the host is down = %s %s (replayed %v, next %q); want %s unknown, joined", again.ExecutionID, again.State, again.Replayed, again.Next, x.ExecutionID)
	}
	if got := f.investigated(t, x.ExecutionID, answerLater); !strings.Contains(got, "its unknown outcome was reconciled with the host, nothing dispatched blindly") {
		t.Errorf("later calls = %q; want the retry reconciled", got)
	}
	other := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.effect("other")})
	if other.State != string(markers.Failed) || !strings.Contains(other.Cause, "host_unreachable: host h1 cannot be reached") || !strings.Contains(other.Cause, "Nothing was sent") {
		t.Errorf("a new call while the host is down = %s (cause %q); want failed, nothing sent", other.State, other.Cause)
	}

	f.host.Start(t)
	f.waitState(t, alice, x.ExecutionID, markers.Running)
	f.release(t, "g")
	end, err := f.engine().AwaitEnd(context.Background(), alice, x.ExecutionID, nil)
	if err != nil {
		t.Fatal(err)
	}
	finished(t, end)
	if n, m := f.count(t, "g.started"), f.count(t, "other"); n != 1 || m != 0 {
		t.Errorf("the command started %d times, the other %d; want 1 and 0", n, m)
	}
}

// TestReview: an operator records the outcome of an execution Postern cannot settle; the
// ones whose outcome is known, that await approval or that are still carried are refused.
func TestReview(t *testing.T) {
	f := newGatedFleet(t)
	ctx := context.Background()
	done := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "true"})
	finished(t, done)
	pending := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: "true"})
	tookEffect := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("a"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	argsB := api.ExecArgs{Host: "h1", Command: f.gated("b"), CallOptions: api.CallOptions{WaitS: waitS(0)}}
	didNotRun := f.exec(t, alice, argsB)
	f.waitStarted(t, "a")
	f.waitStarted(t, "b")
	for _, x := range []*api.Execution{tookEffect, didNotRun} {
		f.waitState(t, alice, x.ExecutionID, markers.Running)
	}
	_, err := f.engine().Review(ctx, testOperator, tookEffect.ExecutionID, "completed", "checked")
	if !errors.Is(err, api.ErrNotReviewable) || !strings.Contains(err.Error(), "still carrying it") {
		t.Errorf("review of a running execution = %v; want ErrNotReviewable, still carried", err)
	}

	f.host.Kill(t)
	review := func(id, outcome string) *markers.Record {
		t.Helper()
		var rec *markers.Record
		testutil.WaitFor(t, "the driver of "+id+" to give up", func() bool {
			var err error
			rec, err = f.engine().Review(ctx, testOperator, id, outcome, "checked on the host")
			if errors.Is(err, api.ErrNotReviewable) {
				return false // its driver is still asking the host
			}
			if err != nil {
				t.Fatalf("review %s %s: %v", id, outcome, err)
			}
			return true
		})
		return rec
	}
	rec := review(tookEffect.ExecutionID, "completed")
	if rec.State != markers.Completed || rec.IsError || verdict.LastEvidence(rec.Evidence) != "reviewed by op: it took effect: checked on the host" {
		t.Errorf("reviewed completed = %s (is_error %v, evidence %q); want completed by op", rec.State, rec.IsError, rec.Evidence)
	}
	rec = review(didNotRun.ExecutionID, "not-run")
	if rec.State != markers.Failed || !rec.IsError {
		t.Errorf("reviewed not-run = %s (is_error %v); want failed", rec.State, rec.IsError)
	}
	// It did not run: the same call is a new intent now.
	if x := f.exec(t, alice, argsB); x.ExecutionID == didNotRun.ExecutionID || x.Replayed {
		t.Errorf("the call again after not-run = %s (replayed %v); want a new execution", x.ExecutionID, x.Replayed)
	}

	tests := []struct {
		name, id, outcome, note string
		wantErr                 error
		wantCode, wantText      string
	}{
		{name: "outcome known", id: done.ExecutionID, outcome: "not-run", note: "n", wantErr: api.ErrNotReviewable, wantText: "its outcome is known"},
		{name: "reviewed already", id: tookEffect.ExecutionID, outcome: "not-run", note: "n", wantErr: api.ErrNotReviewable, wantText: "its outcome is known"},
		{name: "awaits approval", id: pending.ExecutionID, outcome: "completed", note: "n", wantErr: api.ErrNotReviewable, wantText: "awaits approval"},
		{name: "no such execution", id: "ex_00000000000000000000000000", outcome: "completed", note: "n", wantCode: api.CodeNotFound},
		{name: "bad outcome", id: done.ExecutionID, outcome: "maybe", note: "n", wantCode: api.CodeInvalidArgument},
		{name: "no note", id: done.ExecutionID, outcome: "completed", wantCode: api.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.engine().Review(ctx, testOperator, tt.id, tt.outcome, tt.note)
			if tt.wantCode != "" {
				wantCode(t, err, tt.wantCode)
				return
			}
			if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("got = %v; want %v saying %q", err, tt.wantErr, tt.wantText)
			}
		})
	}
}

// TestRecoverQueued: an approved execution queued behind its actor's max_concurrent when the
// engine closed stays queued after Recover, and is dispatched once the running one ends.
func TestRecoverQueued(t *testing.T) {
	f := newGatedFleet(t, func(c *config.Config) { c.Actors[0].MaxConcurrent = 1 })
	ctx := context.Background()
	running := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	f.waitState(t, alice, running.ExecutionID, markers.Running)
	pending := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("queued")})
	if _, err := f.engine().Approve(ctx, testOperator, pending.ExecutionID, ""); err != nil {
		t.Fatal(err)
	}
	queued := func() bool {
		st, err := f.engine().State(alice, pending.ExecutionID)
		return err == nil && st.Queued
	}
	testutil.WaitFor(t, "the approved execution to queue", queued)

	// Recover returns once each execution was asked about, or queued. Each restart is a
	// chance for the queued one to be dispatched before the running one's driver is back.
	for i := range 10 {
		f.reopen(t)
		if st, err := f.engine().State(alice, pending.ExecutionID); err != nil || st.State != string(markers.Authorized) || !st.Queued {
			t.Fatalf("after restart %d: %+v, %v; want it authorized and queued while the other one runs (max_concurrent 1)", i+1, st, err)
		}
	}
	f.release(t, "g")
	f.waitState(t, alice, pending.ExecutionID, markers.Completed)
	if n, m := f.count(t, "g.started"), f.count(t, "queued"); n != 1 || m != 1 {
		t.Errorf("started %d and %d times; want once each", n, m)
	}
}

// TestCancelWhileHostDown: a cancel that cannot reach the host says so; once the host
// answers again, the reconciling driver cancels the command there instead of following it.
func TestCancelWhileHostDown(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	f.waitStarted(t, "g")
	f.host.Kill(t)
	f.waitState(t, alice, x.ExecutionID, markers.Unknown)

	c, err := f.engine().Cancel(ctx, alice, x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != string(markers.Unknown) || !strings.Contains(c.Next, "could not be delivered") {
		t.Errorf("cancel with the host down = %s (next %q); want unknown, not delivered", c.State, c.Next)
	}
	f.host.Start(t)
	testutil.WaitFor(t, "the host to be asked again", func() bool {
		st, err := f.engine().Status(ctx, alice, x.ExecutionID)
		if err != nil {
			t.Fatal(err)
		}
		return st.State != string(markers.Unknown)
	})
	f.waitState(t, alice, x.ExecutionID, markers.Cancelled)
	if m := f.hostMarker(t, x.ExecutionID); m == nil || m.State != hostproto.MarkerCancelled {
		t.Errorf("host marker = %+v; want cancelled", m)
	}
}
