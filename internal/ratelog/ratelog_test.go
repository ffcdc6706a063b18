package ratelog

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
)

// linesOf is what was logged into out, one entry a line.
func linesOf(out *testutil.LockedBuffer) []string {
	return strings.Split(strings.TrimSpace(out.String()), "\n")
}

func newTestLogger(out *testutil.LockedBuffer, opts Options) *Logger {
	return New(slog.New(slog.NewTextHandler(out, nil)), opts)
}

// TestFloodIsBoundedAndCounted: a flood of one reason logs Burst lines and one summary per
// interval, counts every event, and leaves another reason's lines alone.
func TestFloodIsBoundedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.LockedBuffer
		counted := map[string]int{}
		var mu sync.Mutex
		l := newTestLogger(&out, Options{Where: "sock", Burst: 3, Interval: time.Minute, Count: func(where, reason string) {
			mu.Lock()
			defer mu.Unlock()
			counted[where+"/"+reason]++
		}})
		for range 10000 {
			l.Log(slog.LevelWarn, "busy", "connection refused", "uid", 1000)
		}
		l.Log(slog.LevelWarn, "uid", "connection refused", "uid", 1001)
		if got := len(linesOf(&out)); got != 4 {
			t.Fatalf("%d lines before the interval ended; want 3 of busy and 1 of uid:\n%s", got, strings.Join(linesOf(&out), "\n"))
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		got := linesOf(&out)
		if len(got) != 5 {
			t.Fatalf("%d lines after the interval; want 5 (3 + 1 + the summary):\n%s", len(got), strings.Join(got, "\n"))
		}
		if summary := got[4]; !strings.Contains(summary, "where=sock reason=busy not_logged=9997 total=10000") {
			t.Errorf("summary = %q; want where, reason, not_logged=9997 and total=10000", summary)
		}
		if counted["sock/busy"] != 10000 || counted["sock/uid"] != 1 {
			t.Errorf("Count saw %v; want every event", counted)
		}
		if totals := l.Totals(); totals["busy"] != 10000 || totals["uid"] != 1 {
			t.Errorf("Totals = %v", totals)
		}

		// The next interval logs again.
		l.Log(slog.LevelWarn, "busy", "connection refused")
		if got := linesOf(&out); len(got) != 6 || strings.Contains(got[5], "not_logged") {
			t.Fatalf("first event of a new interval not logged:\n%s", strings.Join(got, "\n"))
		}
	})
}

// TestCloseSummarizes: Close logs the interval's summary; later events are counted only.
func TestCloseSummarizes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testutil.LockedBuffer
		l := newTestLogger(&out, Options{Where: "ssh", Burst: 1, Interval: time.Hour})
		for range 5 {
			l.Log(slog.LevelInfo, "public_key", "public key refused")
		}
		l.Close()
		l.Log(slog.LevelInfo, "public_key", "public key refused")
		got := linesOf(&out)
		if len(got) != 2 || !strings.Contains(got[1], "not_logged=4 total=5") {
			t.Fatalf("lines = %q; want one event and a summary of 4 not logged", got)
		}
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if got := linesOf(&out); len(got) != 2 {
			t.Fatalf("lines after Close = %q; want nothing more", got)
		}
		if totals := l.Totals(); totals["public_key"] != 6 {
			t.Errorf("Totals = %v; want 6 (events after Close are counted)", totals)
		}
	})
}
