package markers_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/internal/journaltest"
)

func openJournal(t *testing.T, adjust func(*markers.Options)) (markers.JournalStore, string) {
	s := testutil.OpenStore(t, markers.JournalGraph, adjust)
	return s.Store, s.VerifierKey
}

func TestRetention(t *testing.T) { journaltest.Retention(t, openJournal) }

func TestIndexes(t *testing.T) { journaltest.Indexes(t, openJournal) }

// A store written before the actor, run and first-event indexes existed gets them when it is
// next opened for writing: List by actor reads them, and a retention pass prunes its chain.
// Opened read-only before that, List by actor still answers (from the time index).
func TestOlderStoreGetsItsIndexes(t *testing.T) {
	clock := journaltest.NewClock()
	src := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = clock.Now
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
		o.CheckpointEvery = 2
	})
	for i := range 6 {
		journaltest.Finished(t, src, &markers.Record{ID: fmt.Sprintf("ex_%02d", i), Actor: fmt.Sprintf("a%d", i%2),
			IntentScope: "run:1", Fingerprint: fmt.Sprint(i), Class: "read_only"}, clock.Now())
	}
	// The keys an older release wrote: without the new families and the index version.
	var old []markers.KV
	for kv, err := range src.Raw() {
		if err != nil {
			t.Fatal(err)
		}
		if f := kv.Key[0]; f == 'a' || f == 'v' || f == 'y' || string(kv.Key) == string(markers.IndexVersionKey()) {
			continue
		}
		old = append(old, kv)
	}
	dir := filepath.Join(t.TempDir(), "old")
	opts := src.Opts
	if _, err := markers.ImportRaw(dir, opts, func(yield func(markers.KV, error) bool) {
		for _, kv := range old {
			if !yield(kv, nil) {
				return
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	ro, err := markers.Open(dir, markers.Options{Graph: markers.JournalGraph, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := ro.List(markers.Query{Actor: "a1"})
	ro.Close()
	if err != nil || len(recs) != 3 {
		t.Fatalf("read-only List by actor of an older store = %d, %v; want 3", len(recs), err)
	}
	s, err := markers.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, _, err = s.List(markers.Query{Actor: "a1", Scope: "run:1"})
	if err != nil || len(recs) != 3 {
		t.Fatalf("List by run after the migration = %d, %v; want 3", len(recs), err)
	}
	clock.Advance(2 * time.Hour)
	res, err := s.GC(context.Background(), markers.GCOptions{})
	if err != nil || res.Records != 6 || res.Events == 0 {
		t.Fatalf("pass on the migrated store = %+v, %v; want every record removed and the chain pruned", res, err)
	}
}

// A pass reclaims the space it frees: the store's disk usage after the pass (which
// compacts what it deleted) is a fraction of what it was.
func TestRetentionReclaimsSpace(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a few MB")
	}
	clock := journaltest.NewClock()
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = clock.Now
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
		o.MemTableBytes = 1 << 20
	})
	for i := range 2000 {
		rec := &markers.Record{ID: fmt.Sprintf("ex_%05d", i), Actor: "alice", IntentScope: "run:1", Fingerprint: fmt.Sprint(i), Class: "read_only",
			Command: []string{"sh", "-c", fmt.Sprintf("echo %01000d", i)}}
		journaltest.Finished(t, s, rec, clock.Now())
	}
	clock.Advance(2 * time.Hour)
	res, err := s.GC(context.Background(), markers.GCOptions{})
	if err != nil || res.Records != 2000 || !res.Compacted {
		t.Fatalf("pass = %+v, %v", res, err)
	}
	t.Logf("disk usage %d → %d bytes (%.2f)", res.BytesBefore, res.BytesAfter, float64(res.BytesAfter)/float64(res.BytesBefore))
	if res.BytesAfter*2 > res.BytesBefore {
		t.Errorf("disk usage %d → %d: the pass did not reclaim the space", res.BytesBefore, res.BytesAfter)
	}
}

// Close waits for a pass in progress, which stops at its next step.
func TestCloseStopsAPass(t *testing.T) {
	clock := journaltest.NewClock()
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = clock.Now
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
	})
	for i := range 600 {
		journaltest.Finished(t, s, &markers.Record{ID: fmt.Sprintf("ex_%05d", i), Class: "read_only"}, clock.Now())
	}
	clock.Advance(2 * time.Hour)
	done := make(chan error, 1)
	go func() {
		_, err := s.GC(context.Background(), markers.GCOptions{})
		done <- err
	}()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil && !errors.Is(err, markers.ErrClosed) {
		t.Fatalf("pass interrupted by Close: %v", err)
	}
}

// After a pass carried a held record forward, the store's dir verifies offline: the chain,
// and every record against its last event (the carried one holds it as it stands).
func TestCarriedRecordsVerifyOffline(t *testing.T) {
	clock := journaltest.NewClock()
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = clock.Now
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
		o.EventRetention = time.Hour
		o.CheckpointEvery = 3
	})
	held := &markers.Record{ID: "ex_held", Actor: "a", IntentScope: "run:1", Fingerprint: "f", Class: "read_only"}
	journaltest.Dispatched(t, s, held, clock.Now())
	for i := range 3 {
		journaltest.Finished(t, s, &markers.Record{ID: fmt.Sprintf("ex_%d", i), Actor: "b", IntentScope: "run:2", Fingerprint: fmt.Sprint(i), Class: "read_only"}, clock.Now())
	}
	clock.Advance(2 * time.Hour)
	res, err := s.GC(context.Background(), markers.GCOptions{})
	if err != nil || res.Carried != 1 || res.Events == 0 {
		t.Fatalf("pass = %+v, %v", res, err)
	}
	s.Close()
	rep, err := markers.VerifyDir(s.Dir, s.VerifierKey, markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.Records != 1 {
		t.Fatalf("verify dir = %v, %v; want PASS with the held record matching its last event", rep, err)
	}
}
