package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil/harness"
)

// The journal over a long life, in compressed time: every class keeps an ended execution
// for a few seconds and the bastion's scheduled pass runs every second, while callers keep
// sending executions (new agent runs each window, some keyed) through real processes. After
// each window the test runs a pass of its own and records the backend's size, and verifies
// the chain. Storage must stay flat once the first retention window has passed; the P1
// latency of the last window against the first is logged (a timing goal is a benchmark's,
// not a test's). POSTERN_LONGEVITY=long runs the long variant whose figures are in
// docs/benchmarks.md.

// longevityPlan is one variant's size.
type longevityPlan struct {
	windows   int
	window    time.Duration
	retention time.Duration
	callers   int
}

func planFor(t *testing.T) longevityPlan {
	if os.Getenv("POSTERN_LONGEVITY") == "long" {
		return longevityPlan{windows: 20, window: 15 * time.Second, retention: 10 * time.Second, callers: 8}
	}
	if testing.Short() {
		t.Skip("a longevity run takes about half a minute per backend")
	}
	return longevityPlan{windows: 5, window: 4 * time.Second, retention: 3 * time.Second, callers: 4}
}

// classesFor shortens every built-in class to retention (attach window 1 s).
func classesFor(retention time.Duration) []string {
	var tables []string
	for _, name := range []string{"read_only", "idempotent_write", "conditional_write", "irreversible", "remote_command"} {
		tables = append(tables, fmt.Sprintf("[[classes]]\nname = %q\nattach_window = \"1s\"\nretention = %q", name, retention))
	}
	return tables
}

func TestLongevity(t *testing.T) {
	plan := planFor(t)
	settings := []string{`retention_interval = "1s"`}
	t.Run("pebble", func(t *testing.T) {
		f := newFleet(t, fleetOptions{settings: settings, tables: classesFor(plan.retention)})
		longevity(t, plan, f.bastion)
	})
	t.Run("etcd", func(t *testing.T) {
		// Exports (audit verify) take well under a second: keep a second of history.
		f := startHAFleetJournal(t, 1, `compaction_lag = "1s"`, append(settings, classesFor(plan.retention)...)...)
		longevity(t, plan, f.replicas[0])
	})
}

// windowFigures is what one window measured.
type windowFigures struct {
	executions int
	p50, p99   time.Duration
	bytes      int64 // the backend after the window's pass
	removed    int
	events     uint64
}

func longevity(t *testing.T, plan longevityPlan, b *harness.Bastion) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(plan.windows+4)*plan.window+2*time.Minute)
	defer cancel()
	var figures []windowFigures
	total, removed := 0, 0
	for w := range plan.windows {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		end := time.Now().Add(plan.window)
		for c := range plan.callers {
			cs := b.Connect(t, "agent", runHeader(fmt.Sprintf("w%d-c%d", w, c)))
			wg.Go(func() {
				for n := 0; time.Now().Before(end); n++ {
					args := map[string]any{"host": "h1", "command": fmt.Sprintf("echo %d-%d-%d", w, c, n)}
					if n%4 == 0 {
						args["idempotency_key"] = fmt.Sprintf("k-%d-%d-%d", w, c, n)
					}
					start := time.Now()
					if _, err := callExecution(ctx, cs, "ssh_exec", args); err != nil {
						t.Errorf("window %d caller %d: %v", w, c, err)
						return
					}
					mu.Lock()
					lat = append(lat, time.Since(start))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		p := gcPass(t, b)
		if p.Error != "" {
			t.Fatalf("window %d: pass: %s", w, p.Error)
		}
		out := string(postern(t, b, "audit", "verify", "--require-sealed"))
		if !strings.Contains(out, "PASS") {
			t.Fatalf("window %d: verify:\n%s", w, out)
		}
		slices.Sort(lat)
		fig := windowFigures{executions: len(lat), p50: lat[len(lat)/2], p99: lat[len(lat)*99/100],
			bytes: p.BytesAfter, removed: p.Records, events: p.Events}
		figures = append(figures, fig)
		total += fig.executions
		removed += fig.removed
		t.Logf("window %d: %d executions (p50 %v, p99 %v); pass removed %d in %.2fs (removed by every pass so far: %v), pruned %d events; backend %d bytes",
			w, fig.executions, fig.p50.Round(10*time.Microsecond), fig.p99.Round(10*time.Microsecond), fig.removed, p.Seconds,
			metric(t, b, `postern_retention_removed_total{what="executions"}`), fig.events, fig.bytes)
	}
	last, first := figures[len(figures)-1], figures[0]
	t.Logf("%d executions in %d windows of %v (retention %v): backend after the first window %d bytes, after the last %d (%.2f×); P1 p50 first %v, last %v (%.2f×)",
		total, plan.windows, plan.window, plan.retention, first.bytes, last.bytes, float64(last.bytes)/float64(first.bytes),
		first.p50.Round(10*time.Microsecond), last.p50.Round(10*time.Microsecond), float64(last.p50)/float64(first.p50))
	// Flat: from the second window on (the first retention window has passed), the backend
	// after a pass does not grow with the windows behind it. It is not constant — on etcd
	// the measure is the members' size in use, which moves with the revision history a pass
	// keeps and bbolt's page use — so the later half's largest is held to the earlier half's
	// (without retention it grows with every window: the later half's would be about twice).
	var steady []int64
	for _, f := range figures[1:] {
		steady = append(steady, f.bytes)
	}
	early, late := slices.Max(steady[:len(steady)/2]), slices.Max(steady[len(steady)/2:])
	if late > early+early/2+(1<<20) {
		t.Errorf("backend after each pass from the second window on = %v bytes: growing (largest %d in the later half, %d in the earlier)", steady, late, early)
	}
	if removed := metric(t, b, `postern_retention_removed_total{what="executions"}`); removed < float64(total-last.executions-first.executions) {
		t.Errorf("removed %v executions in all; want at least those of the windows before the last two (%d)", removed, total-last.executions-first.executions)
	}
	if runs := metric(t, b, `postern_retention_removed_total{what="runs"}`); runs == 0 {
		t.Error("no agent run was removed")
	}
}
