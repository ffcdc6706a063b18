package verdict

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/markers"
)

// TestAtStart: what a start does with each execution it finds, by state, channel, class
// and host guarantee — the promise `postern status` makes before a restart.
func TestAtStart(t *testing.T) {
	for _, tc := range []struct {
		state   markers.State
		channel string
		class   string
		level   fleet.Guarantee
		review  bool
		want    string // a phrase of the answer; "" for none
	}{
		{markers.Accepted, "ssh", config.ClassRemoteCommand, fleet.GuaranteeHostagent, false, "never left the bastion"},
		{markers.Authorized, "http", config.ClassIrreversible, "", false, "never left the bastion"},
		{markers.Dispatched, "ssh", config.ClassRemoteCommand, fleet.GuaranteeHostagent, false, "asks the hostagent"},
		{markers.Running, "ssh", config.ClassIrreversible, fleet.GuaranteeHostagent, false, "asks the hostagent"},
		{markers.Unknown, "ssh", config.ClassRemoteCommand, fleet.GuaranteeMarkerScript, false, "asks the marker script"},
		{markers.Running, "ssh", config.ClassRemoteCommand, fleet.GuaranteeNone, false, "sends nothing"},
		{markers.Unknown, "ssh", config.ClassRemoteCommand, fleet.GuaranteeHostagent, true, "waits for your review"},
		{markers.Dispatched, "http", config.ClassIdempotentWrite, "", false, "same Idempotency-Key"},
		{markers.Dispatched, "http", config.ClassReadOnly, "", false, "same Idempotency-Key"},
		{markers.Dispatched, "http", config.ClassConditionalWrite, "", false, "status check"},
		{markers.Dispatched, "http", config.ClassIrreversible, "", false, "never sent again"},
		{markers.Dispatched, "http", "custom", "", false, "never sent again"},
		{markers.AwaitingApproval, "ssh", config.ClassRemoteCommand, fleet.GuaranteeHostagent, false, ""},
		{markers.Completed, "ssh", config.ClassRemoteCommand, fleet.GuaranteeHostagent, false, ""},
		{markers.Failed, "http", config.ClassReadOnly, "", false, ""},
	} {
		rec := &markers.Record{ID: "ex_1", State: tc.state, Channel: tc.channel, Class: tc.class, Host: "h1", ReviewRequired: tc.review}
		got := AtStart(rec, tc.level)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s %s %s %s review=%v: %q; want one saying %q", tc.state, tc.channel, tc.class, tc.level, tc.review, got, tc.want)
		}
	}
}

// TestAtStartFleetRun: a fleet run goes on from the journal; its hosts' executions are
// answered for each by itself.
func TestAtStartFleetRun(t *testing.T) {
	for _, tc := range []struct {
		state markers.State
		want  string
	}{
		{markers.Authorized, "started none"},
		{markers.Running, "never a second one"},
		{markers.AwaitingApproval, ""},
		{markers.Completed, ""},
	} {
		rec := &markers.Record{ID: "fr_1", State: tc.state, Channel: "fleet", Fleet: &markers.Rollout{Hosts: make([]markers.RolloutHost, 3), MaxConcurrency: "1", MaxErrors: "0"}}
		got := AtStart(rec, "")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("fleet run %s: %q; want one saying %q", tc.state, got, tc.want)
		}
	}
}
