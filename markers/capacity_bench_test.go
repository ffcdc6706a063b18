package markers_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/internal/journaltest"
)

// BenchmarkCapacity measures what the journal keeps per execution of `ssh_exec true` as the
// bastion journals it (journaltest.Execution: a record, six events, a result, the index
// entries, a run per ten), per event and per joined call (a replayed retry), on Pebble: the
// logical bytes (keys and values, as every backend stores them) and the bytes on disk after
// a full compaction (Pebble compresses its tables). Then a retention pass removes them all
// and it measures what is left per execution (its tombstone). 5,000 executions
// (POSTERN_BENCH_SMALL=1: 1,000); run it with -benchtime 1x.
func BenchmarkCapacity(b *testing.B) {
	n := 5000
	if os.Getenv("POSTERN_BENCH_SMALL") != "" {
		n = 1000
	}
	clock := journaltest.NewClock()
	s := testutil.OpenStore(b, markers.JournalGraph, func(o *markers.Options) {
		o.MemTableBytes, o.CacheBytes = markers.JournalMemTableBytes, markers.JournalCacheBytes
		o.Now = clock.Now
		o.Removable = func(*markers.Record, time.Time) bool { return true }
		o.TombstoneRetention = func(string) time.Duration { return time.Hour }
		o.RunRetention = time.Nanosecond
	})
	for b.Loop() {
	}
	empty, err := s.CompactAll()
	if err != nil {
		b.Fatal(err)
	}
	journaltest.Executions(b, s, n, 16)
	logical, families, events := journaltest.Logical(b, s)
	disk, err := s.CompactAll()
	if err != nil {
		b.Fatal(err)
	}
	recs, _, err := s.List(markers.Query{Limit: markers.MaxPage})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for i, r := range recs {
		if err := journaltest.Joined(ctx, s, r.ID, i); err != nil {
			b.Fatal(err)
		}
	}
	withCalls, _, _ := journaltest.Logical(b, s)
	diskCalls, err := s.CompactAll()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(logical)/float64(n), "logical-B/exec")
	b.ReportMetric(float64(disk-empty)/float64(n), "disk-B/exec")
	b.ReportMetric(float64(families['e'])/float64(events), "logical-B/event")
	b.ReportMetric(float64(events)/float64(n), "events/exec")
	b.ReportMetric(float64(withCalls-logical)/float64(len(recs)), "logical-B/call")
	b.ReportMetric(float64(diskCalls-disk)/float64(len(recs)), "disk-B/call")

	clock.Advance(time.Minute)
	res, err := s.GC(ctx, markers.GCOptions{})
	if err != nil || res.Records != n {
		b.Fatalf("pass = %+v, %v", res, err)
	}
	left, _, _ := journaltest.Logical(b, s)
	b.ReportMetric(float64(left)/float64(n), "logical-B/removed-exec")
}
