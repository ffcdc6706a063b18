package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// Sizes of BenchmarkBastionInventory: hosts enrolled (by one `postern hosts import`), and of
// them the real hostagents the bastion holds a pooled connection to. POSTERN_BENCH_POOLED
// changes the latter (a smaller machine: measure 20 and extrapolate).
const (
	inventoryEnrolled = 1000
	inventoryPooled   = 100
)

// BenchmarkBastionInventory measures the bastion's memory at fleet size: its RSS with
// nothing enrolled; with 1,000 hosts imported (listed once through hosts_list, which reads
// the inventory); after as many ssh_exec calls of `true` on one host as there are pooled
// hosts (the journal's share, for comparison); and after one call on each of the pooled
// hosts — real hostagents, each its own process — so each holds a pooled connection. The
// goal (issue 28) is under 1 MiB of bastion RSS per pooled host.
func BenchmarkBastionInventory(b *testing.B) {
	pooled := inventoryPooled
	if s := os.Getenv("POSTERN_BENCH_POOLED"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > inventoryEnrolled {
			b.Fatalf("POSTERN_BENCH_POOLED=%q: want 1..%d", s, inventoryEnrolled)
		}
		pooled = n
	}
	harness.Binary(b, "postern")
	key := testutil.NewSSHKey(b)
	// One at a time: each takes its port the moment before it listens there.
	agents := make([]*harness.Hostagent, pooled)
	for i := range agents {
		h := harness.NewHostagent(b)
		testutil.WriteAuthorizedKeys(b, h.AuthorizedKeysPath(), key.AuthorizedLine())
		h.Start(b)
		agents[i] = h
	}

	bs := harness.NewBastion(b, key)
	bs.Start(b)
	pid := bs.PID()
	rss := func() float64 {
		kb, err := testutil.ProcStatusKB(pid, "VmRSS")
		if err != nil {
			b.Fatal(err)
		}
		return float64(kb) / 1024
	}
	ctx := context.Background()
	cs := bs.Connect(b, "agent", nil)
	listAll := func() int {
		n := 0
		args := map[string]any{"limit": 1000}
		for {
			var res api.HostsResult
			if _, err := harness.CallTool(ctx, cs, "hosts_list", args, &res); err != nil {
				b.Fatal(err)
			}
			n += len(res.Hosts)
			if res.NextCursor == "" {
				return n
			}
			args["cursor"] = res.NextCursor
		}
	}
	listAll()
	empty := rss()

	// One import file: the pooled hosts first (h0000…), then hosts that are never dialed.
	var csv strings.Builder
	csv.WriteString("name,addr,account,labels,host_key\n")
	for i := range inventoryEnrolled {
		if i < pooled {
			h := agents[i]
			fmt.Fprintf(&csv, "h%04d,%s,%s,role=pooled,%s\n", i, h.Addr, h.Account, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(h.HostKey))))
			continue
		}
		fmt.Fprintf(&csv, "h%04d,127.0.0.1:9,deploy,role=idle env=bench,%s\n", i, testutil.NewSSHKey(b).AuthorizedLine())
	}
	file := filepath.Join(b.TempDir(), "fleet.csv")
	if err := os.WriteFile(file, []byte(csv.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(harness.Binary(b, "postern"), "hosts", "import", file, "--config", bs.ConfigPath).CombinedOutput(); err != nil {
		b.Fatalf("hosts import: %v\n%s", err, out)
	}
	if n := listAll(); n != inventoryEnrolled {
		b.Fatalf("hosts_list listed %d hosts; want %d", n, inventoryEnrolled)
	}
	enrolled := rss()

	b.ResetTimer()
	for i := range pooled {
		if err := execTrueArgs(ctx, cs, map[string]any{"host": "h0000", "command": "true", "run_id": "one-" + strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	oneHost := rss()
	var next sync.Mutex
	i := 0
	if _, err := hammer(8, pooled, func(int) error {
		next.Lock()
		host := fmt.Sprintf("h%04d", i)
		i++
		next.Unlock()
		return execTrueArgs(ctx, cs, map[string]any{"host": host, "command": "true", "run_id": "each-" + host})
	}); err != nil {
		b.Fatalf("%v\nbastion log:\n%s", err, bs.Logs())
	}
	b.StopTimer()
	pooledRSS := rss()
	var res api.HostsResult
	if _, err := harness.CallTool(ctx, cs, "hosts_list", map[string]any{"labels": "role=pooled", "limit": 1000}, &res); err != nil {
		b.Fatal(err)
	}
	connected := 0
	for _, h := range res.Hosts {
		if h.Connected {
			connected++
		}
	}
	if connected != pooled {
		b.Fatalf("%d of %d hosts connected; want every one pooled", connected, pooled)
	}
	perPooled := (pooledRSS - oneHost) * 1024 / float64(pooled)
	b.ReportMetric(empty, "empty-RSS-MB")
	b.ReportMetric(enrolled, "enrolled-RSS-MB")
	b.ReportMetric((enrolled-empty)*1024/inventoryEnrolled, "KB/enrolled-host")
	b.ReportMetric(pooledRSS, "pooled-RSS-MB")
	b.ReportMetric(perPooled, "KB/pooled-host")
	b.ReportMetric(float64(pooled), "pooled-hosts")
	table(b, fmt.Sprintf("bastion RSS at fleet size: %d hosts imported, %d of them real hostagents holding a pooled connection (goal: < 1024 KB per pooled host)", inventoryEnrolled, pooled),
		[]string{"", "RSS MB"},
		[]string{"nothing enrolled", f2(empty)},
		[]string{fmt.Sprintf("%d hosts enrolled, listed", inventoryEnrolled), f2(enrolled)},
		[]string{fmt.Sprintf("+ %d calls on one host", pooled), f2(oneHost)},
		[]string{fmt.Sprintf("+ one call on each of %d hosts: %d pooled connections", pooled, pooled), f2(pooledRSS)},
		[]string{"KB per pooled host (last − previous row)", f0(perPooled)},
	)
}
