package testutil

import (
	"context"
	"testing"

	"github.com/postern-dev/postern/markers"
)

// FleetRunStory writes what the bastion journals for a fleet run of two hosts — the run
// (found by its idempotency key), one execution per host (found by its fingerprint, naming
// the run), a cancel request, the run's end — and returns the ids it wrote. Both journal
// backends run it (markers' tests, and etcdjournal's against the Pebble store).
func FleetRunStory(t testing.TB, j markers.JournalStore) []string {
	t.Helper()
	ctx := context.Background()
	run := &markers.Record{
		ID: "fr_01J3Z5V8Q4K7M2N9P0R6S8T1VW", Actor: "token:alice", IntentScope: "run:1", Fingerprint: "hmac-sha256:run", IdempotencyKey: "deploy-42",
		Tool: "fleet_exec", Channel: "fleet", Command: []string{"sh", "-c", "deploy"}, Class: "remote_command",
		Fleet: &markers.Rollout{
			Targets: []string{"group:web"}, MaxConcurrency: "50%", MaxErrors: "0",
			Hosts: []markers.RolloutHost{
				{Name: "web-1", Target: "host:web-1 ssh-ed25519 SHA256:a", Account: "deploy", Decision: "authorized", Class: "remote_command"},
				{Name: "web-2", Target: "host:web-2 ssh-ed25519 SHA256:b", Account: "deploy", Decision: "rejected", Rule: "rules[0]"},
			},
		},
	}
	if _, err := j.CreateAdvancedFor(ctx, run, []markers.State{markers.Authorized}, "authorized", &markers.Call{Transport: "http", Run: "run:1", Match: "new"}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Advance(ctx, run.ID, markers.Authorized, []markers.State{markers.Dispatched, markers.Running}, "rollout started", nil); err != nil {
		t.Fatal(err)
	}
	child := &markers.Record{
		ID: "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW", Actor: "token:alice", IntentScope: "run:1", Fingerprint: "hmac-sha256:web-1",
		Tool: "ssh_exec", Channel: "ssh", Host: "web-1", FleetRun: run.ID,
	}
	if _, err := j.CreateAdvancedFor(ctx, child, []markers.State{markers.Authorized, markers.Dispatched}, "dispatching to web-1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Update(ctx, run.ID, "cancel requested by token:alice", func(r *markers.Record) error {
		r.Fleet.CancelledBy = "token:alice"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AdvanceWithResult(ctx, child.ID, markers.Dispatched, []markers.State{markers.Cancelled}, "cancelled on web-1", []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Transition(ctx, run.ID, markers.Running, markers.Cancelled, "rollout cancelled", nil); err != nil {
		t.Fatal(err)
	}
	return []string{run.ID, child.ID}
}
