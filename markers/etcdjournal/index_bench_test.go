package etcdjournal_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
)

// BenchmarkListByActor is markers' BenchmarkListByActor on etcd (a 3-member cluster): an
// actor with 10 executions among 10⁴ of other actors (POSTERN_BENCH_SMALL=1: 2,000), its
// index against the time-index scan of before, in the same run.
func BenchmarkListByActor(b *testing.B) {
	n := 10_000
	if os.Getenv("POSTERN_BENCH_SMALL") != "" {
		n = 2_000
	}
	c := etcdtest.Start(b, 3)
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(b.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		b.Fatal(err)
	}
	jj, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: "/bench/", Replica: "r0", OpTimeout: 10 * time.Second,
		Markers: markers.Options{Signer: signer}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { jj.Close() })
	j := markers.JournalStore(jj)
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(n); k = next.Add(1) - 1 {
				if _, err := j.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%012d", k), Actor: fmt.Sprintf("actor-%d", k%50),
					IntentScope: "run:1", Tool: "ssh_exec", Target: "host:db-1"}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range 10 {
		if _, err := j.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_me_%02d", i), Actor: "me", IntentScope: "run:me"}); err != nil {
			b.Fatal(err)
		}
	}
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
	} {
		b.Run(fmt.Sprintf("others=%d/%s", n, tc.name), func(b *testing.B) {
			jj.SetIndexed(tc.indexed)
			defer jj.SetIndexed(true)
			for b.Loop() {
				recs, _, err := j.List(tc.q)
				if err != nil || len(recs) != 10 {
					b.Fatalf("list = %d, %v; want 10", len(recs), err)
				}
			}
		})
	}
}
