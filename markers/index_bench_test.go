package markers_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// BenchmarkListByActor lists the executions of an actor that has a handful (10) in a journal
// where other actors have 10⁵ (POSTERN_BENCH_SMALL=1: 10⁴): what tasks/list and the daily
// quota check read. index reads the actor's index (and run-index its agent run's); scan is
// how they read before the index, the time index filtered by actor (the same store, in the
// same run). The ratio scan/index is the figure; it grows with the others' history.
func BenchmarkListByActor(b *testing.B) {
	n := 100_000
	if os.Getenv("POSTERN_BENCH_SMALL") != "" {
		n = 10_000
	}
	s := testutil.OpenStore(b, markers.JournalGraph, func(o *markers.Options) {
		o.MemTableBytes, o.CacheBytes = markers.JournalMemTableBytes, markers.JournalCacheBytes
	})
	fill(b, s.Store, n)
	ctx := context.Background()
	for i := range 10 {
		if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_me_%02d", i), Actor: "me", IntentScope: "run:me", Fingerprint: fmt.Sprint(i)}); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // let the fill's flushes and compactions settle
	midnight := time.Now().UTC().Truncate(24 * time.Hour)
	for _, tc := range []struct {
		name    string
		indexed bool
		q       markers.Query
	}{
		{"tasks-list/index", true, markers.Query{Actor: "me", Newest: true, Limit: 100}},
		{"tasks-list/scan", false, markers.Query{Actor: "me", Newest: true, Limit: 100}},
		{"quota/index", true, markers.Query{Actor: "me", Since: midnight, Limit: 1000}},
		{"quota/scan", false, markers.Query{Actor: "me", Since: midnight, Limit: 1000}},
		{"quota/run-index", true, markers.Query{Actor: "me", Scope: "run:me", Since: midnight, Limit: 1000}},
	} {
		b.Run(fmt.Sprintf("others=%d/%s", n, tc.name), func(b *testing.B) {
			s.SetIndexed(tc.indexed)
			defer s.SetIndexed(true)
			for b.Loop() {
				recs, _, err := s.List(tc.q)
				if err != nil || len(recs) != 10 {
					b.Fatalf("list = %d, %v; want 10", len(recs), err)
				}
			}
		})
	}
}
