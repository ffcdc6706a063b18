package engine

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// TestDeliverySettling: only a new-intent decision that rests on a delivery younger than
// delivery_settle waits, only for what is left of it, and never through the stdio bridge,
// where no cancel can overtake the call.
func TestDeliverySettling(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	b := &intake{core: testCore(&core{cfg: config.Config{DeliverySettle: time.Second}, now: func() time.Time { return now }})}
	at := func(d time.Duration) *time.Time { v := now.Add(-d); return &v }
	http, bridged := transport.Caller{Actor: "token:agent"}, transport.Caller{Actor: "local:alice", Local: true, Bridged: true, BridgeBinary: true}
	local := transport.Caller{Actor: "local:alice", Local: true}                      // on the socket itself: an HTTP client of its own
	otherBridge := transport.Caller{Actor: "local:alice", Local: true, Bridged: true} // not the daemon's own executable
	tests := []struct {
		name    string
		caller  transport.Caller
		prior   *markers.Record
		outcome intent.Match
		want    time.Duration
	}{
		{"no prior", http, nil, intent.NewExecution, 0},
		{"delivered just now", http, &markers.Record{State: markers.Completed, ResultDeliveredAt: at(200 * time.Millisecond)}, intent.NewExecution, 800 * time.Millisecond},
		{"delivered just now, on the socket", local, &markers.Record{State: markers.Completed, ResultDeliveredAt: at(200 * time.Millisecond)}, intent.NewExecution, 800 * time.Millisecond},
		{"delivered just now, through another program that names its parent", otherBridge, &markers.Record{State: markers.Completed, ResultDeliveredAt: at(200 * time.Millisecond)}, intent.NewExecution, 800 * time.Millisecond},
		{"delivered just now, through the stdio bridge: no cancel can overtake", bridged, &markers.Record{State: markers.Completed, ResultDeliveredAt: at(200 * time.Millisecond)}, intent.NewExecution, 0},
		{"delivered long ago", http, &markers.Record{State: markers.Completed, ResultDeliveredAt: at(5 * time.Second)}, intent.NewExecution, -4 * time.Second},
		{"not delivered: it joins", http, &markers.Record{State: markers.Completed}, intent.Replay, 0},
		{"failed prior", http, &markers.Record{State: markers.Failed}, intent.NewExecution, 0},
		{"joins anyway", http, &markers.Record{State: markers.Completed, ResultDeliveredAt: at(0)}, intent.Replay, 0},
	}
	for _, tt := range tests {
		if got := b.deliverySettling(tt.caller, tt.prior, tt.outcome); (got > 0) != (tt.want > 0) || tt.want > 0 && got != tt.want {
			t.Errorf("%s: deliverySettling = %v; want %v", tt.name, got, tt.want)
		}
	}
}

// TestDeliveryInDoubt: an unkeyed call that would replay a completed result waits while a
// response carrying that result is being judged — until the last such response is — and no
// other call ever does.
func TestDeliveryInDoubt(t *testing.T) {
	in := &intake{core: testCore(&core{})}
	done := func(id string) *markers.Record { return &markers.Record{ID: id, State: markers.Completed} }
	if in.deliveryInDoubt(done("ex_1"), intent.Replay) != nil {
		t.Fatal("a result nobody is carrying is in doubt")
	}
	first, second := in.judging.add("ex_1"), in.judging.add("ex_1")
	judged := in.deliveryInDoubt(done("ex_1"), intent.Replay)
	if judged == nil {
		t.Fatal("a result on its way is not in doubt")
	}
	delivered := done("ex_1")
	delivered.ResultDeliveredAt = new(time.Now())
	for name, call := range map[string]func() <-chan struct{}{
		"a keyed call": func() <-chan struct{} {
			r := done("ex_1")
			r.IdempotencyKey = "k"
			return in.deliveryInDoubt(r, intent.Replay)
		},
		"a delivered result": func() <-chan struct{} { return in.deliveryInDoubt(delivered, intent.NewExecution) },
		"a call that attaches": func() <-chan struct{} {
			return in.deliveryInDoubt(&markers.Record{ID: "ex_1", State: markers.Running}, intent.Attach)
		},
		"another execution": func() <-chan struct{} { return in.deliveryInDoubt(done("ex_2"), intent.Replay) },
	} {
		if call() != nil {
			t.Errorf("%s waits for a delivery verdict", name)
		}
	}
	first()
	first() // once only
	select {
	case <-judged:
		t.Fatal("judged while a second response is still being judged")
	default:
	}
	second()
	<-judged
	if in.deliveryInDoubt(done("ex_1"), intent.Replay) != nil {
		t.Fatal("still in doubt once every response was judged")
	}
}
