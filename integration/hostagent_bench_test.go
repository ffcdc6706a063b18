package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// BenchmarkHostagentStart starts postern-hostagent (fresh data dir: host key, audit key and
// marker store created) and reports the time until it listens, then its RSS after a second
// idle.
func BenchmarkHostagentStart(b *testing.B) {
	harness.Binary(b, "postern-hostagent") // build outside the timing
	harness.Binary(b, "postern-supervisor")
	var total time.Duration
	var rssKB int
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		h := harness.StartHostagent(b)
		total += time.Since(t0)
		time.Sleep(time.Second)
		kb, err := testutil.ProcStatusKB(h.PID(), "VmRSS")
		if err != nil {
			b.Fatal(err)
		}
		rssKB = max(rssKB, kb)
		h.Kill(b)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "start-ms")
	b.ReportMetric(float64(rssKB)/1024, "idle-RSS-MB")
}

// BenchmarkHostagentExecTrue runs `true` through the real agent over one SSH connection,
// with the dedicated postern-supervisor next to it and with the agent re-executing itself, and
// reports the p50 of each.
func BenchmarkHostagentExecTrue(b *testing.B) {
	selfDir := b.TempDir()
	self := filepath.Join(selfDir, "postern-hostagent")
	if err := os.Link(harness.Binary(b, "postern-hostagent"), self); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, bin string }{{"supervisor=postern-supervisor", ""}, {"supervisor=agent-reexec", self}} {
		b.Run(tc.name, func(b *testing.B) {
			h := harness.NewHostagent(b)
			h.Bin = tc.bin
			h.Start(b)
			c := h.Dial(b)
			var ds []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if got := execOn(b, c, hostproto.Exec{ExecutionID: newID(b), Command: "true", Protocol: hostproto.Version}); got.err != nil || got.res.ExitStatus != 0 {
					b.Fatalf("exec: %+v", got)
				}
				ds = append(ds, time.Since(t0))
			}
			b.StopTimer()
			b.ReportMetric(float64(testutil.Percentile(ds, 0.5).Microseconds()), "p50-µs")
			b.ReportMetric(float64(testutil.Percentile(ds, 0.99).Microseconds()), "p99-µs")
		})
	}
}
