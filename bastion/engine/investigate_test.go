package engine

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/markers"
)

// TestJoinedReconcileWording: a call that joined an unknown execution is described by what
// its target can tell — the hostagent is asked, the marker script's marker is read, a
// level-none host can be asked nothing, an HTTP endpoint's class decides — never claiming a
// host was asked when none could be.
func TestJoinedReconcileWording(t *testing.T) {
	ssh := &markers.Record{ID: id1, Channel: "ssh", Host: "s1", IdempotencyKey: "deploy-1"}
	tests := []struct {
		name    string
		rec     *markers.Record
		level   fleet.Guarantee
		want    []string
		notWant string
	}{
		{name: "hostagent", rec: ssh, level: fleet.GuaranteeHostagent, want: []string{"reconciled with the host", "nothing dispatched blindly", "deploy-1"}},
		{name: "marker script", rec: ssh, level: fleet.GuaranteeMarkerScript, want: []string{"reading its marker from the marker script on s1", "nothing dispatched blindly"}, notWant: "with the host"},
		{name: "none", rec: ssh, level: fleet.GuaranteeNone, want: []string{"nothing can be asked of s1", "guarantee level none", "not sent again"}, notWant: "reconciled"},
		{name: "host no longer enrolled", rec: ssh, want: []string{"s1 is not enrolled now", "nothing dispatched blindly"}, notWant: "reconciled with"},
		{name: "http", rec: &markers.Record{ID: id1, Channel: "http", Host: "api", Class: config.ClassIdempotentWrite}, want: []string{"endpoint's class (" + config.ClassIdempotentWrite + ")", "nothing sent blindly"}, notWant: "host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := joinedWhat(tt.rec, string(intent.Reconcile), tt.level)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q; want %q", got, w)
				}
			}
			if tt.notWant != "" && strings.Contains(got, tt.notWant) {
				t.Errorf("%q; must not say %q", got, tt.notWant)
			}
		})
	}
}
