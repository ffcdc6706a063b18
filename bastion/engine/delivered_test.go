package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/markers"
)

// TestNotDeliveredIsExplained: why a response that carried a result did not deliver it is
// journaled as an event the operator reads (investigate's question 4) — only while the
// result counts as not delivered, and without changing that.
func TestNotDeliveredIsExplained(t *testing.T) {
	b := journalOnly(t)
	ctx := context.Background()
	const why = "the client cancelled the request or went away"
	events := func(id string) []markers.Event {
		t.Helper()
		evs, err := b.journal.Events(id)
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}

	running := journalAs(t, b, markers.Record{ID: "ex_01K00000000000000000000RUN", Actor: "token:agent"},
		[]markers.State{markers.Authorized, markers.Dispatched, markers.Running}, nil)
	before := len(events(running.ID))
	if err := b.DeliveryJournal().NotDelivered(ctx, running.ID, why); err != nil {
		t.Fatal(err)
	}
	if n := len(events(running.ID)); n != before {
		t.Errorf("a running execution got %d events for a delivery that cannot be yet; want none", n-before)
	}

	rec := journalAs(t, b, markers.Record{ID: "ex_01K00000000000000000000FIN", Actor: "token:agent"},
		[]markers.State{markers.Authorized, markers.Dispatched, markers.Completed}, nil)
	if err := b.DeliveryJournal().NotDelivered(ctx, rec.ID, why); err != nil {
		t.Fatal(err)
	}
	after, err := b.journal.Get(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.ResultDeliveredAt != nil {
		t.Fatalf("explaining a failed delivery marked the result delivered: %+v", after)
	}
	inv := &api.Investigation{Record: after, Delivery: deliveryOf(after, events(rec.ID))}
	if f := inv.Delivery.Failures; len(f) != 1 || f[0].Note != why {
		t.Fatalf("failures = %+v; want one: %s", f, why)
	}
	answer := answerDelivery(inv)
	for _, want := range []string{"Not delivered", why, "a retry replays it"} {
		if !strings.Contains(answer, want) {
			t.Errorf("answer %q lacks %q", answer, want)
		}
	}

	// Once delivered, a later response that fails to deliver it again explains nothing.
	if err := b.DeliveryJournal().Delivered(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	before = len(events(rec.ID))
	if err := b.DeliveryJournal().NotDelivered(ctx, rec.ID, why); err != nil {
		t.Fatal(err)
	}
	if n := len(events(rec.ID)); n != before {
		t.Errorf("a delivered result got %d more events; want none", n-before)
	}
}
