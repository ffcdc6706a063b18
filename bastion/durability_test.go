package bastion_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
)

// TestExecSyncsTwice: an execution the policy authorizes at once costs the journal two
// fsyncs — accepted, authorized and dispatched in one, the outcome with its result in the
// other — every step is still an event of the hash chain, and the delivery mark is written
// without an fsync. Real hostagent, real journal.
func TestExecSyncsTwice(t *testing.T) {
	h := startHostagent(t)
	bs := openBastion(t, h)
	ctx := context.Background()
	if err := execTrue(ctx, bs, "warm"); err != nil { // the pooled connection
		t.Fatal(err)
	}
	j := bs.Engine().Journal()
	before := j.Stats()
	c := benchActor
	c.RunID = "two-syncs"
	x, err := bs.Engine().Exec(ctx, c, api.ExecArgs{Host: "h1", Command: "true"}, nil)
	if err != nil || x.State != "completed" {
		t.Fatalf("exec = %+v, %v; want completed", x, err)
	}
	after := j.Stats()
	if got := after.Commits - before.Commits; got != 2 {
		t.Errorf("%d synced journal commits for one execution; want 2", got)
	}
	evs, err := j.Events(x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, ev := range evs {
		steps = append(steps, fmt.Sprintf("%s→%s", ev.From, ev.To))
	}
	// running is journaled on its own (unsynced), with the outcome, or not at all.
	first := "[→accepted accepted→authorized authorized→dispatched]"
	switch rest := fmt.Sprint(steps[min(3, len(steps)):]); {
	case len(steps) < 4 || fmt.Sprint(steps[:3]) != first:
		t.Errorf("events %v; want %s first", steps, first)
	case rest != "[dispatched→completed]" && rest != "[dispatched→running running→completed]":
		t.Errorf("events %v; want the outcome after dispatched (via running or not)", steps)
	}

	if err := bs.Engine().DeliveryJournal().Delivered(ctx, x.ExecutionID); err != nil {
		t.Fatal(err)
	}
	delivered := j.Stats()
	if delivered.Commits != after.Commits || delivered.Unsynced != after.Unsynced+1 {
		t.Errorf("delivery mark: %d synced, %d unsynced commits; want 0 synced, 1 unsynced",
			delivered.Commits-after.Commits, delivered.Unsynced-after.Unsynced)
	}
	if rec, err := j.Get(x.ExecutionID); err != nil || rec.ResultDeliveredAt == nil {
		t.Errorf("record after delivery = %+v, %v; want result_delivered_at set", rec, err)
	}
}

// TestExecFailsClosedWithoutJournal: when the journal cannot take the execution's first
// write, the call fails with journal_unavailable and the host is sent nothing.
func TestExecFailsClosedWithoutJournal(t *testing.T) {
	h := startHostagent(t)
	bs := openBastion(t, h)
	ctx := context.Background()
	if err := execTrue(ctx, bs, "warm"); err != nil { // the pooled connection: the failure is the journal's
		t.Fatal(err)
	}
	conn := h.Dial(t)
	cc, err := hostproto.DialControl(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	markersOnHost := func() int {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		page, _, err := cc.List(ctx, hostproto.ControlListQuery{})
		if err != nil {
			t.Fatal(err)
		}
		return len(page)
	}
	onHost := markersOnHost()
	if err := bs.Engine().Journal().Close(); err != nil {
		t.Fatal(err)
	}
	c := benchActor
	c.RunID = "no-journal"
	_, err = bs.Engine().Exec(ctx, c, api.ExecArgs{Host: "h1", Command: "true"}, nil)
	var te *api.ToolError
	if !errors.As(err, &te) || te.Code != api.CodeJournalUnavailable {
		t.Fatalf("exec with the journal closed = %v; want %s", err, api.CodeJournalUnavailable)
	}
	if n := markersOnHost(); n != onHost {
		t.Errorf("the host has %d markers, %d before: something was dispatched", n, onHost)
	}
}
