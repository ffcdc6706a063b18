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
	b := &intake{core: &core{cfg: config.Config{DeliverySettle: time.Second}, now: func() time.Time { return now }}}
	at := func(d time.Duration) *time.Time { v := now.Add(-d); return &v }
	http, bridged := transport.Caller{Actor: "token:agent"}, transport.Caller{Actor: "local:alice", Local: true, Bridged: true, BridgeBinary: true}
	local := transport.Caller{Actor: "local:alice", Local: true} // on the socket itself: an HTTP client of its own
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
