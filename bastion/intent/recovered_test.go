package intent

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// TestRuleRecovered: a retry that finds only an execution rebuilt from a host's marker never
// runs it again while it awaits review.
func TestRuleRecovered(t *testing.T) {
	now := time.Date(2026, 7, 22, 12, 0, 0, 0, time.UTC)
	class := config.Class{Name: "test", AttachWindow: time.Hour, Retention: 30 * day}
	delivered := now.Add(-time.Minute)
	tests := []struct {
		name string
		rec  markers.Record
		want Match
	}{
		{"awaiting review: answered with it", markers.Record{State: markers.Unknown, ReviewRequired: true}, Recovered},
		{"reviewed completed, never delivered: replay", markers.Record{State: markers.Completed}, Replay},
		{"reviewed completed and delivered: a new intent", markers.Record{State: markers.Completed, ResultDeliveredAt: &delivered}, NewExecution},
		{"reviewed not-run: a new intent", markers.Record{State: markers.Failed}, NewExecution},
		{"past the attach window since the recovery", markers.Record{State: markers.Unknown, ReviewRequired: true, CreatedAt: now.Add(-2 * time.Hour)}, NewExecution},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := tt.rec
			rec.RecoveredFrom = "h1"
			if rec.CreatedAt.IsZero() {
				rec.CreatedAt = now.Add(-time.Minute)
			}
			if got := RuleRecovered(&rec, now, class); got != tt.want {
				t.Fatalf("RuleRecovered = %s; want %s", got, tt.want)
			}
			if got := RuleRecovered(&rec, now, class); got.Joins() != (tt.want != NewExecution) {
				t.Fatalf("%s joins = %v", got, got.Joins())
			}
		})
	}
}
