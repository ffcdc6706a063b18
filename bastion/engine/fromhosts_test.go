package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/markers"
)

// The journal is lost after a command ran: recovery from the host's markers (held engine,
// on an empty journal) lists it, journals it only when confirmed and only once, as unknown
// awaiting review with the host's evidence; no driver carries it; a retry of the call that
// started it is answered with it and runs nothing; the same command of another actor is
// another intent; once reviewed completed a retry replays it; investigate says where it came
// from.
func TestRecoverFromHostsAfterTheJournalIsLost(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	args := api.ExecArgs{Host: "h1", Command: f.effect("lost"), CallOptions: api.CallOptions{WaitS: waitS(30)}}
	x := f.exec(t, inRun(alice, "r1"), args)
	finished(t, x)
	f.closeEngine(t, f.engine())
	if err := os.RemoveAll(f.cfg.JournalDir()); err != nil {
		t.Fatal(err)
	}

	held, err := engine.Open(engine.Options{Config: f.cfg, Hold: true, Logger: slog.New(slog.NewTextHandler(&f.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	listed, err := held.RecoverFromHosts(ctx, api.RecoveryQuery{})
	if err != nil || listed.Counts["journal"] != 1 || len(listed.Items) != 1 || listed.Items[0].ExecutionID != x.ExecutionID || listed.Items[0].Journaled {
		t.Fatalf("recovery without confirm = %+v, %v; want %s to journal, not journaled", listed, err, x.ExecutionID)
	}
	if _, err := held.Journal().Get(x.ExecutionID); err == nil {
		t.Fatal("recovery without confirm journaled it")
	}
	done, err := held.RecoverFromHosts(ctx, api.RecoveryQuery{Confirm: true})
	if err != nil || len(done.Items) != 1 || !done.Items[0].Journaled {
		t.Fatalf("recovery confirmed = %+v, %v", done, err)
	}
	again, err := held.RecoverFromHosts(ctx, api.RecoveryQuery{Confirm: true})
	if err != nil || again.Counts["journal"]+again.Counts["review"] != 0 {
		t.Fatalf("a second recovery = %+v, %v; want nothing more to journal", again, err)
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}

	f.open(t)
	rec := f.record(t, x.ExecutionID)
	if rec.RecoveredFrom != "h1" || rec.State != markers.Unknown || !rec.ReviewRequired || rec.Actor != "" || rec.Fingerprint == "" ||
		rec.ExitCode == nil || *rec.ExitCode != 0 || !strings.Contains(strings.Join(rec.Evidence, "\n"), "recovered from h1's marker: exited") {
		t.Fatalf("the recovered record: %+v", rec)
	}
	retry := f.exec(t, inRun(alice, "r1"), args)
	if retry.ExecutionID != x.ExecutionID || !retry.Replayed || !retry.ReviewRequired {
		t.Fatalf("a retry of the lost call = %+v; want %s replayed, awaiting review", retry, x.ExecutionID)
	}
	time.Sleep(200 * time.Millisecond) // nothing runs: give a dispatch the time to show
	if n := f.count(t, "lost"); n != 1 {
		t.Fatalf("the command ran %d times; want 1", n)
	}
	if other := f.exec(t, inRun(bob, "r1"), args); other.ExecutionID == x.ExecutionID {
		t.Fatalf("another actor's same command joined the recovered execution: %+v", other)
	}
	if _, err := f.engine().Review(ctx, testOperator, x.ExecutionID, "completed", "the line is in the file"); err != nil {
		t.Fatal(err)
	}
	if replay := f.exec(t, inRun(alice, "r1"), args); replay.ExecutionID != x.ExecutionID || !replay.Replayed || replay.State != string(markers.Completed) {
		t.Fatalf("a retry after the review = %+v; want %s replayed, completed", replay, x.ExecutionID)
	}
	if n := f.count(t, "lost"); n != 2 { // the original, and bob's
		t.Fatalf("the command ran %d times; want 2 (alice's once, bob's once)", n)
	}
	if who := f.investigated(t, x.ExecutionID, answerWho); !strings.Contains(who, "rebuilt from h1's marker") {
		t.Fatalf("investigate: %s", who)
	}
}

// An execution the journal's retention removed is not brought back by a recovery from the
// hosts, whose markers outlive it (720 h against read_only's 7 days): the journal holds
// executions accepted before it (one awaiting approval, never removed) and after it, so it
// knew it. It is counted as removed, neither listed nor journaled.
func TestRecoverFromHostsLeavesWhatRetentionRemoved(t *testing.T) {
	f := newGatedFleet(t, func(c *config.Config) { c.ApprovalTimeout = 0 })
	ctx := context.Background()
	if x := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("gated")}); x.State != string(markers.AwaitingApproval) {
		t.Fatalf("gated exec = %s; want awaiting_approval", x.State)
	}
	args := func(name string) api.ExecArgs {
		return api.ExecArgs{Host: "h1", Command: f.effect(name), CallOptions: api.CallOptions{WaitS: waitS(30)}}
	}
	old := f.exec(t, inRun(alice, "r1"), args("old"))
	finished(t, old)
	f.clock.advance(31 * 24 * time.Hour) // past remote_command's 30 days
	finished(t, f.exec(t, inRun(alice, "r2"), args("newer")))
	p, err := f.engine().RetentionPass(ctx, false)
	if err != nil || p.Records != 1 {
		t.Fatalf("retention pass = %+v, %v; want the old execution removed", p, err)
	}
	f.closeEngine(t, f.engine())

	held, err := engine.Open(engine.Options{Config: f.cfg, Hold: true, Logger: slog.New(slog.NewTextHandler(&f.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	got, err := held.RecoverFromHosts(ctx, api.RecoveryQuery{Confirm: true})
	if err != nil || got.Counts["removed"] == 0 || got.Counts["journal"] != 0 { // gated and vault are h1 by other names: it is counted once per name
		t.Fatalf("recovery = %+v, %v; want the old execution counted as removed, nothing journaled", got, err)
	}
	for _, it := range got.Items {
		if it.ExecutionID == old.ExecutionID {
			t.Fatalf("the removed execution is listed: %+v", it)
		}
	}
	if _, err := held.Journal().Get(old.ExecutionID); !errors.Is(err, markers.ErrNotFound) {
		t.Fatalf("the removed execution is in the journal again: %v", err)
	}
}
