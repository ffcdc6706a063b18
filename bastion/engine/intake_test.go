package engine

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/markers"
)

// TestDeliverySettling: only a new-intent decision that rests on a delivery younger than
// delivery_settle waits, and only for what is left of it.
func TestDeliverySettling(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	b := &intake{core: &core{cfg: config.Config{DeliverySettle: time.Second}, now: func() time.Time { return now }}}
	at := func(d time.Duration) *time.Time { v := now.Add(-d); return &v }
	tests := []struct {
		name    string
		prior   *markers.Record
		outcome intent.Match
		want    time.Duration
	}{
		{"no prior", nil, intent.NewExecution, 0},
		{"delivered just now", &markers.Record{State: markers.Completed, ResultDeliveredAt: at(200 * time.Millisecond)}, intent.NewExecution, 800 * time.Millisecond},
		{"delivered long ago", &markers.Record{State: markers.Completed, ResultDeliveredAt: at(5 * time.Second)}, intent.NewExecution, -4 * time.Second},
		{"not delivered: it joins", &markers.Record{State: markers.Completed}, intent.Replay, 0},
		{"failed prior", &markers.Record{State: markers.Failed}, intent.NewExecution, 0},
		{"joins anyway", &markers.Record{State: markers.Completed, ResultDeliveredAt: at(0)}, intent.Replay, 0},
	}
	for _, tt := range tests {
		if got := b.deliverySettling(tt.prior, tt.outcome); (got > 0) != (tt.want > 0) || tt.want > 0 && got != tt.want {
			t.Errorf("%s: deliverySettling = %v; want %v", tt.name, got, tt.want)
		}
	}
}
