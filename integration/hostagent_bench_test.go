package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
)

// BenchmarkHostagentStart starts postern-hostagent (fresh data dir: host key, audit key and
// marker store created) and reports the time until it listens, then its RSS after a second
// idle.
func BenchmarkHostagentStart(b *testing.B) {
	testutil.Binary(b, "postern-hostagent") // build outside the timing
	var total time.Duration
	var rssKB int
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		h := testutil.StartHostagent(b)
		total += time.Since(t0)
		time.Sleep(time.Second)
		rssKB = max(rssKB, procRSSKB(b, h.PID()))
		h.Kill(b)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "start-ms")
	b.ReportMetric(float64(rssKB)/1024, "idle-RSS-MB")
}

func procRSSKB(t testing.TB, pid int) int {
	t.Helper()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
