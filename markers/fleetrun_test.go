package markers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

const validRunID = "fr_01J3Z5V8Q4K7M2N9P0R6S8T1VW"

func TestValidFleetRunID(t *testing.T) {
	for _, tt := range []struct {
		id                  string
		run, execution, any bool
	}{
		{validRunID, true, false, true},
		{validID, false, true, true},
		{"fr_01j3z5v8q4k7m2n9p0r6s8t1vw", false, false, false},
		{"FR_01J3Z5V8Q4K7M2N9P0R6S8T1VW", false, false, false},
		{"fr_01J3Z5V8Q4K7M2N9P0R6S8T1VWX", false, false, false},
		{"fr_", false, false, false},
	} {
		if got := markers.ValidFleetRunID(tt.id); got != tt.run {
			t.Errorf("ValidFleetRunID(%q) = %v; want %v", tt.id, got, tt.run)
		}
		if got := markers.ValidExecutionID(tt.id); got != tt.execution {
			t.Errorf("ValidExecutionID(%q) = %v; want %v", tt.id, got, tt.execution)
		}
		if got := markers.ValidJournalID(tt.id); got != tt.any {
			t.Errorf("ValidJournalID(%q) = %v; want %v", tt.id, got, tt.any)
		}
	}
	id, err := markers.NewFleetRunID(time.Now())
	if err != nil || !markers.ValidFleetRunID(id) || !strings.HasPrefix(id, markers.FleetRunIDPrefix) {
		t.Fatalf("NewFleetRunID() = %q, %v; want a valid fr_ id", id, err)
	}
}

// TestFleetRunRecords: a fleet run is a journal record like an execution — created,
// matched by its key, moved along the journal's graph — that keeps its rollout; its
// executions are found by their fingerprint and name it.
func TestFleetRunRecords(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ids := testutil.FleetRunStory(t, s.Store)
	run, err := s.FindByIdempotencyKey("token:alice", "deploy-42")
	if err != nil || run.ID != ids[0] {
		t.Fatalf("run by key = %v, %v; want %s", run, err, ids[0])
	}
	if !run.IsFleetRun() || run.State != markers.Cancelled || run.Fleet.CancelledBy != "token:alice" ||
		len(run.Fleet.Hosts) != 2 || run.Fleet.Hosts[1].Decision != "rejected" || run.Fleet.MaxConcurrency != "50%" {
		t.Fatalf("run = %+v (fleet %+v); want it cancelled with its rollout", run, run.Fleet)
	}
	child, err := s.FindByFingerprint("token:alice", "run:1", "hmac-sha256:web-1")
	if err != nil || child.ID != ids[1] || child.FleetRun != ids[0] || child.IsFleetRun() {
		t.Fatalf("child by fingerprint = %+v, %v; want %s of run %s", child, err, ids[1], ids[0])
	}
	// A reader's copy is its own: changing it changes nothing stored.
	run.Fleet.Hosts[0].Name, run.Fleet.Targets[0] = "changed", "changed"
	again, err := s.Get(ids[0])
	if err != nil || again.Fleet.Hosts[0].Name != "web-1" || again.Fleet.Targets[0] != "group:web" {
		t.Fatalf("stored run changed through a copy: %+v, %v", again.Fleet, err)
	}
	// The rollout is fixed: identity checks still hold, and an illegal edge is refused.
	if _, err := s.Transition(context.Background(), ids[0], markers.Cancelled, markers.Running, "again", nil); !errors.Is(err, markers.ErrIllegalTransition) {
		t.Fatalf("cancelled → running: %v; want ErrIllegalTransition", err)
	}
	evs, err := s.Events(ids[0])
	if err != nil || len(evs) != 6 {
		t.Fatalf("run events = %d, %v; want 6 (create, authorized, dispatched, running, update, cancelled)", len(evs), err)
	}
	if r, err := evs[0].DecodedRecord(); err != nil || r.Fleet == nil || len(r.Fleet.Hosts) != 2 {
		t.Fatalf("the create event's record = %+v, %v; want the rollout in it", r, err)
	}
}
