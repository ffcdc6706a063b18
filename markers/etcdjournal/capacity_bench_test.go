package etcdjournal_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
	"github.com/postern-dev/postern/markers/internal/journaltest"
)

// BenchmarkCapacity is markers' BenchmarkCapacity on a 3-member etcd: per execution of
// `ssh_exec true`, the logical bytes, the growth of the members' backend in use with the
// revision history (before any compaction: every version of every key) and after compacting
// it (what the quota must hold in the steady state), per joined call, and what is left per
// execution after a retention pass removed them all (tombstones). 2,000 executions
// (POSTERN_BENCH_SMALL=1: 500); run it with -benchtime 1x.
func BenchmarkCapacity(b *testing.B) {
	n := 2000
	if os.Getenv("POSTERN_BENCH_SMALL") != "" {
		n = 500
	}
	c := etcdtest.Start(b, 3)
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(b.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		b.Fatal(err)
	}
	clock := journaltest.NewClock()
	j, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: "/postern/", Replica: "r0", OpTimeout: 10 * time.Second,
		Markers: markers.Options{Signer: signer, Now: clock.Now,
			Removable:          func(*markers.Record, time.Time) bool { return true },
			TombstoneRetention: func(string) time.Duration { return time.Hour }, RunRetention: time.Nanosecond}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { j.Close() })
	for b.Loop() {
	}
	ctx := context.Background()
	inUse := func() int64 {
		time.Sleep(time.Second) // the members commit their backend every 100 ms
		st, err := j.Backend(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return st.InUseBytes
	}
	compacted := func() int64 {
		rev, err := c.Client().Get(ctx, "/postern/mhead")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Client().Compact(ctx, rev.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			b.Fatal(err)
		}
		return inUse()
	}
	empty := compacted()
	journaltest.Executions(b, j, n, 16)
	withHistory := inUse()
	logical, families, events := journaltest.Logical(b, j)
	steady := compacted()
	recs, _, err := j.List(markers.Query{Limit: markers.MaxPage})
	if err != nil {
		b.Fatal(err)
	}
	for i, r := range recs {
		if err := journaltest.Joined(ctx, j, r.ID, i); err != nil {
			b.Fatal(err)
		}
	}
	withCalls, _, _ := journaltest.Logical(b, j)
	steadyCalls := compacted()
	b.ReportMetric(float64(logical)/float64(n), "logical-B/exec")
	b.ReportMetric(float64(withHistory-empty)/float64(n), "history-B/exec")
	b.ReportMetric(float64(steady-empty)/float64(n), "compacted-B/exec")
	b.ReportMetric(float64(families['e'])/float64(events), "logical-B/event")
	b.ReportMetric(float64(withCalls-logical)/float64(len(recs)), "logical-B/call")
	b.ReportMetric(float64(steadyCalls-steady)/float64(len(recs)), "compacted-B/call")

	clock.Advance(time.Minute)
	res, err := j.GC(ctx, markers.GCOptions{Exclusive: true})
	if err != nil || res.Records != n {
		b.Fatalf("pass = %+v, %v", res, err)
	}
	b.ReportMetric(float64(res.BytesAfter-empty)/float64(n), "compacted-B/removed-exec")
}
