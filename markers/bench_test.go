package markers_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// BenchmarkDurableWrite interleaves a raw write+fdatasync of a small file with a Create and a
// Transition, so all three see the same disk in the same moment; it reports each one's p50
// and its ratio to the raw fsync.
func BenchmarkDurableWrite(b *testing.B) {
	s := testutil.OpenStore(b, markers.HostGraph)
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	payload := make([]byte, 512)
	ctx := context.Background()
	var raw, create, transition []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := f.Write(payload); err != nil {
			b.Fatal(err)
		}
		if err := syncData(f); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		id := fmt.Sprintf("ex_%d", i)
		if _, err := s.Create(ctx, &markers.Record{ID: id, Command: []string{"sh", "-c", "true"}, Account: "deploy"}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := s.Transition(ctx, id, markers.Started, markers.Running, "", func(r *markers.Record) error { r.PID = 4242; return nil }); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		raw, create, transition = append(raw, t1.Sub(t0)), append(create, t2.Sub(t1)), append(transition, t3.Sub(t2))
	}
	b.StopTimer()
	r, c, tr := testutil.Percentile(raw, 0.5), testutil.Percentile(create, 0.5), testutil.Percentile(transition, 0.5)
	b.ReportMetric(float64(r.Microseconds()), "raw-fsync-p50-µs")
	b.ReportMetric(float64(c.Microseconds()), "create-p50-µs")
	b.ReportMetric(float64(tr.Microseconds()), "transition-p50-µs")
	b.ReportMetric(float64(c)/float64(r), "create/raw")
	b.ReportMetric(float64(tr)/float64(r), "transition/raw")
}

// BenchmarkConcurrentWriters measures group commit: records/s and fsyncs per record with
// 1, 16 and 64 concurrent writers each creating records, with the default (hostagent) sizing
// and the journal sizing.
func BenchmarkConcurrentWriters(b *testing.B) {
	for _, sizing := range []string{"hostagent", "journal"} {
		for _, writers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("sizing=%s/writers=%d", sizing, writers), func(b *testing.B) {
				s := testutil.OpenStore(b, markers.HostGraph, func(o *markers.Options) {
					if sizing == "journal" {
						o.MemTableBytes, o.CacheBytes = markers.JournalMemTableBytes, markers.JournalCacheBytes
					}
				})
				ctx := context.Background()
				var next atomic.Int64
				var wg sync.WaitGroup
				before := s.Stats()
				b.ResetTimer()
				start := time.Now()
				for w := 0; w < writers; w++ {
					wg.Go(func() {
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								return
							}
							if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%d", i), Account: "deploy"}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				after := s.Stats()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
				b.ReportMetric(float64(after.Commits-before.Commits)/float64(after.Events-before.Events), "fsyncs/record")
			})
		}
	}
}

// BenchmarkFindByFingerprint looks up fingerprints among 10³ and 10⁶ records (set
// POSTERN_BENCH_SMALL=1 to stop at 10⁵): hit finds an existing execution (uniformly random,
// the worst case for the cache), hit-recent one of the newest 1000 (a retry inside its attach
// window), miss is a new intent — the path every fresh call takes.
func BenchmarkFindByFingerprint(b *testing.B) {
	sizes := []int{1_000, 1_000_000}
	if os.Getenv("POSTERN_BENCH_SMALL") != "" {
		sizes = []int{1_000, 100_000}
	}
	for _, n := range sizes {
		s := testutil.OpenStore(b, markers.JournalGraph, func(o *markers.Options) {
			o.MemTableBytes, o.CacheBytes = markers.JournalMemTableBytes, markers.JournalCacheBytes
		})
		fill(b, s.Store, n)
		// Let flushes and compactions settle and the index and filter blocks load, so the
		// benchmark measures lookups rather than the tail of the fill.
		time.Sleep(2 * time.Second)
		for k := 0; k < min(n, 20_000); k++ {
			s.FindByFingerprint(fmt.Sprintf("actor-%d", k%50), "run:1", fmt.Sprintf("hmac-sha256:%064d-new", k))
		}
		for _, kind := range []string{"hit", "hit-recent", "miss"} {
			b.Run(fmt.Sprintf("records=%d/%s", n, kind), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					k := (i * 7919) % n
					if kind == "hit-recent" {
						k = n - 1 - (i*7919)%min(n, 1000)
					}
					fp := fmt.Sprintf("hmac-sha256:%064d", k)
					if kind == "miss" {
						fp += "-new"
					}
					rec, err := s.FindByFingerprint(fmt.Sprintf("actor-%d", k%50), "run:1", fp)
					if kind != "miss" && (err != nil || rec == nil) || kind == "miss" && !errors.Is(err, markers.ErrNotFound) {
						b.Fatalf("lookup %d (%s): %v", k, kind, err)
					}
				}
			})
		}
	}
}

// fill creates n journal records with 64 concurrent writers.
func fill(b *testing.B, s *markers.Store, n int) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Go(func() {
			for {
				k := next.Add(1) - 1
				if k >= int64(n) {
					return
				}
				_, err := s.Create(ctx, &markers.Record{
					ID: fmt.Sprintf("ex_%012d", k), Actor: fmt.Sprintf("actor-%d", k%50), IntentScope: "run:1",
					Fingerprint: fmt.Sprintf("hmac-sha256:%064d", k), Tool: "ssh_exec", Target: "host:db-1",
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkRSSAfter100kWrites opens a store with the default (hostagent) options in a child
// process, writes 100k records from 16 writers and reports the child's peak RSS and its
// anonymous RSS at the end (RSS minus the file-backed pages of the binary itself).
func BenchmarkRSSAfter100kWrites(b *testing.B) {
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		cmd := testutil.Reexec(b, "rss-probe", "STORE_DIR="+dir+"/store", "AUDIT_KEY="+dir+"/audit.key", "RECORDS=100000")
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("probe: %v\n%s", err, out)
		}
		var hwm, anon float64
		if _, err := fmt.Sscanf(string(out), "%f %f", &hwm, &anon); err != nil {
			b.Fatalf("probe said %q", out)
		}
		b.ReportMetric(hwm/1024, "peak-RSS-MB")
		b.ReportMetric(anon/1024, "anon-RSS-MB")
	}
}

func rssProbe() int {
	signer, _, err := markers.LoadOrCreateAuditKey(os.Getenv("AUDIT_KEY"), "postern-test")
	if err != nil {
		fmt.Println(err)
		return 2
	}
	n, _ := strconv.Atoi(os.Getenv("RECORDS"))
	s, err := markers.Open(os.Getenv("STORE_DIR"), markers.Options{Graph: markers.HostGraph, Signer: signer})
	if err != nil {
		fmt.Println(err)
		return 2
	}
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Go(func() {
			for {
				k := next.Add(1)
				if k > int64(n) {
					return
				}
				if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%012d", k), Command: []string{"sh", "-c", "migrate up"}, Account: "deploy", Cwd: "/srv/app"}); err != nil {
					fmt.Println(err)
					os.Exit(2)
				}
			}
		})
	}
	wg.Wait()
	anon, err := testutil.ProcStatusKB(0, "RssAnon")
	if err != nil {
		fmt.Println(err)
		return 2
	}
	if err := s.Close(); err != nil {
		fmt.Println(err)
		return 2
	}
	hwm, err := testutil.ProcStatusKB(0, "VmHWM")
	if err != nil {
		fmt.Println(err)
		return 2
	}
	fmt.Println(hwm, anon)
	return 0
}
