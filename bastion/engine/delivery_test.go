package engine_test

import (
	"context"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/markers"
)

// TestDelivered: a delivered completed execution no longer matches its intent, so the same
// call runs again; a revoked delivery makes it match again, unless a newer execution of the
// intent was accepted since. An execution that has not ended is not marked.
func TestDelivered(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	c := inRun(alice, "deliveries")
	args := api.ExecArgs{Host: "h1", Command: f.effect("ran")}
	first := f.exec(t, c, args)
	finished(t, first)
	if err := f.engine().DeliveryJournal().Delivered(ctx, first.ExecutionID); err != nil {
		t.Fatal(err)
	}
	if rec := f.record(t, first.ExecutionID); rec.ResultDeliveredAt == nil {
		t.Fatalf("delivered record has no result_delivered_at")
	}

	second := f.exec(t, c, args) // after delivery_settle: a new intent
	finished(t, second)
	if second.ExecutionID == first.ExecutionID || second.Replayed {
		t.Errorf("the call after delivery = %s (replayed %v); want a new execution", second.ExecutionID, second.Replayed)
	}
	if revoked, err := f.engine().DeliveryJournal().RevokeDelivery(ctx, first.ExecutionID); err != nil || revoked {
		t.Errorf("revoke the first delivery = %v, %v; want it kept (a newer execution was accepted)", revoked, err)
	}

	if err := f.engine().DeliveryJournal().Delivered(ctx, second.ExecutionID); err != nil {
		t.Fatal(err)
	}
	if revoked, err := f.engine().DeliveryJournal().RevokeDelivery(ctx, second.ExecutionID); err != nil || !revoked {
		t.Fatalf("revoke the latest delivery = %v, %v; want it revoked", revoked, err)
	}
	third := f.exec(t, c, args)
	if third.ExecutionID != second.ExecutionID || !third.Replayed || third.ResultDelivered {
		t.Errorf("the call after the revocation = %s (replayed %v, delivered %v); want %s replayed, not delivered", third.ExecutionID, third.Replayed, third.ResultDelivered, second.ExecutionID)
	}
	if n := f.count(t, "ran"); n != 2 {
		t.Errorf("ran %d times; want 2", n)
	}

	running := f.exec(t, c, api.ExecArgs{Host: "h1", Command: f.gate("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	if err := f.engine().DeliveryJournal().Delivered(ctx, running.ExecutionID); err != nil {
		t.Fatal(err)
	}
	if rec := f.record(t, running.ExecutionID); rec.ResultDeliveredAt != nil {
		t.Errorf("an execution in progress was marked delivered")
	}
	f.release(t, "g")
	f.waitState(t, c, running.ExecutionID, markers.Completed)
}

// TestDeliveredKeyed: a keyed call joins its execution whether or not its result was
// delivered, and its delivery is revoked without looking for newer executions.
func TestDeliveredKeyed(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	args := api.ExecArgs{Host: "h1", Command: f.effect("ran"), CallOptions: api.CallOptions{IdempotencyKey: "k"}}
	first := f.exec(t, alice, args)
	finished(t, first)
	if err := f.engine().DeliveryJournal().Delivered(ctx, first.ExecutionID); err != nil {
		t.Fatal(err)
	}
	again := f.exec(t, alice, args)
	if again.ExecutionID != first.ExecutionID || !again.Replayed || !again.ResultDelivered {
		t.Errorf("keyed retry after delivery = %s (replayed %v, delivered %v); want %s replayed, delivered", again.ExecutionID, again.Replayed, again.ResultDelivered, first.ExecutionID)
	}
	if revoked, err := f.engine().DeliveryJournal().RevokeDelivery(ctx, first.ExecutionID); err != nil || !revoked {
		t.Errorf("revoke = %v, %v; want revoked", revoked, err)
	}
	if _, err := f.engine().DeliveryJournal().RevokeDelivery(ctx, "ex_00000000000000000000000000"); err == nil {
		t.Errorf("revoking an unknown execution succeeded")
	}
	if n := f.count(t, "ran"); n != 1 {
		t.Errorf("ran %d times; want 1", n)
	}
}
