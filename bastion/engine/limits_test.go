package engine

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/markers"
)

func TestCountsTowardQuota(t *testing.T) {
	at := map[markers.State]time.Time{markers.Dispatched: time.Unix(1, 0)}
	tests := []struct {
		name string
		rec  markers.Record
		want bool
	}{
		{"rejected by policy", markers.Record{State: markers.Rejected, Decision: string(policy.Rejected)}, false},
		{"accepted, about to be rejected", markers.Record{State: markers.Accepted, Decision: string(policy.Rejected)}, false},
		{"accepted, about to dispatch", markers.Record{State: markers.Accepted, Decision: string(policy.Authorized)}, true},
		{"awaiting approval: it may still run", markers.Record{State: markers.AwaitingApproval}, true},
		{"denied by the operator", markers.Record{State: markers.Rejected, Decision: string(policy.AwaitingApproval)}, false},
		{"authorized, queued", markers.Record{State: markers.Authorized}, true},
		{"cancelled before dispatch", markers.Record{State: markers.Cancelled}, false},
		{"failed before dispatch (host unreachable)", markers.Record{State: markers.Failed}, false},
		{"failed after dispatch", markers.Record{State: markers.Failed, StateTimes: at}, true},
		{"completed", markers.Record{State: markers.Completed, StateTimes: at}, true},
		{"unknown", markers.Record{State: markers.Unknown, StateTimes: at}, true},
	}
	for _, tc := range tests {
		if got := countsTowardQuota(&tc.rec); got != tc.want {
			t.Errorf("%s: countsTowardQuota = %v; want %v", tc.name, got, tc.want)
		}
	}
}
