package integration

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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
// goal (issue 28) is under 1 MiB of bastion RSS per pooled host. Then, on the same
// hostagents, a fleet run of `true` over all of them at max_concurrency 20 against five
// sequential ssh_exec `true` (goal: within 2×), with the bastion's CPU and RSS per host
// (fleetRunOfTrue).
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
	agents := startAgents(b, pooled, key)

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
	csv.WriteString("name,addr,account,labels,host_key,cwd\n")
	for i := range inventoryEnrolled {
		if i < pooled {
			csv.WriteString(agentCSVLine(fmt.Sprintf("h%04d", i), agents[i], "role=pooled", ""))
			continue
		}
		fmt.Fprintf(&csv, "h%04d,127.0.0.1:9,deploy,role=idle env=bench,%s,\n", i, testutil.NewSSHKey(b).AuthorizedLine())
	}
	importHosts(b, bs, csv.String())
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
	fr := fleetRunOfTrue(b, ctx, cs, pid, agents)
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
	b.ReportMetric(fr.wall.Seconds()*1000, "fleet-run-ms")
	b.ReportMetric(fr.sequential.Seconds()*1000, "five-sequential-ms")
	b.ReportMetric(fr.wall.Seconds()/fr.sequential.Seconds(), "fleet/five-sequential")
	b.ReportMetric(fr.cpu.Seconds()*1000/float64(pooled), "fleet-bastion-cpu-ms/host")
	b.ReportMetric(fr.hostsCPU.Seconds()*1000/float64(pooled), "fleet-hosts-cpu-ms/host")
	// Every hostagent shares this machine's cores with the bastion: the run cannot end
	// before their CPU time, spread over every core, has been spent. On a real fleet only
	// the bastion's share is on one machine.
	cpuBound := (fr.cpu + fr.hostsCPU).Seconds() * 1000 / float64(runtime.NumCPU())
	b.ReportMetric(cpuBound, "fleet-cpu-bound-ms")
	b.ReportMetric(fr.wall.Seconds()*1000/cpuBound, "fleet/cpu-bound")
	b.ReportMetric(fr.rssAfter, "fleet-RSS-MB")
	b.ReportMetric((fr.rssAfter-fr.rssBefore)*1024/float64(pooled), "fleet-RSS-KB/host")
	table(b, fmt.Sprintf("fleet_exec `true` over the %d pooled hosts at max_concurrency %d (goal: ≤ 2× five sequential ssh_exec `true`)", pooled, fleetBenchConcurrency),
		[]string{"", "wall ms", "bastion CPU ms", "hostagents' CPU ms", "bastion RSS MB after"},
		[]string{"5 sequential ssh_exec `true`, one host each", f2(fr.sequential.Seconds() * 1000), "", "", ""},
		[]string{fmt.Sprintf("fleet run over %d hosts", pooled), f2(fr.wall.Seconds() * 1000), f0(fr.cpu.Seconds() * 1000), f0(fr.hostsCPU.Seconds() * 1000), f2(fr.rssAfter)},
		[]string{"ratio / per host", f2(fr.wall.Seconds() / fr.sequential.Seconds()), f2(fr.cpu.Seconds() * 1000 / float64(pooled)),
			f2(fr.hostsCPU.Seconds() * 1000 / float64(pooled)), f2((fr.rssAfter-fr.rssBefore)*1024/float64(pooled)) + " KB"},
	)
}

// fleetBenchConcurrency is the max_concurrency of the benchmark's fleet run (issue 28).
const fleetBenchConcurrency = 20

// fleetFigures are what a fleet run of `true` over the pooled hosts cost, and its baseline.
type fleetFigures struct {
	// wall is the fleet_exec call, from sent to the run's answer with its outcome;
	// sequential five ssh_exec `true` calls one after the other, on the first five hosts.
	wall, sequential time.Duration
	// cpu is the bastion's CPU time over the run, hostsCPU that of every hostagent with its
	// supervisor and the commands they ran: on one machine both share its cores, which
	// bound how fast the run can go. rssBefore and rssAfter are the bastion's RSS (MB).
	cpu, hostsCPU       time.Duration
	rssBefore, rssAfter float64
}

// hostsCPU is the CPU time so far of the hostagents, their children, their supervisors and
// the commands those ran.
func hostsCPU(b *testing.B, agents []*harness.Hostagent) time.Duration {
	b.Helper()
	var sum time.Duration
	for _, h := range agents {
		for _, pid := range []int{h.PID(), supervisorPID(h.DataDir)} {
			if pid == 0 {
				continue
			}
			c, err := readProcCPU(pid)
			if err != nil {
				b.Fatal(err)
			}
			sum += c.self + c.children
		}
	}
	return sum
}

// fleetRunOfTrue measures a fleet_exec of `true` over the n pooled hosts (h0000…, labelled
// role=pooled, every one connected already) at max_concurrency 20, and its same-run
// baseline: five sequential ssh_exec `true` calls. The goal (issue 28): the run within 2×
// the five calls.
func fleetRunOfTrue(b *testing.B, ctx context.Context, cs *mcp.ClientSession, pid int, agents []*harness.Hostagent) fleetFigures {
	b.Helper()
	n := len(agents)
	var f fleetFigures
	t0 := time.Now()
	for i := range 5 {
		if err := execTrueArgs(ctx, cs, map[string]any{"host": fmt.Sprintf("h%04d", i%n), "command": "true", "run_id": "seq-" + strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	f.sequential = time.Since(t0)
	kb, err := testutil.ProcStatusKB(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	f.rssBefore = float64(kb) / 1024
	cpu0, err := readProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	hosts0 := hostsCPU(b, agents)
	t0 = time.Now()
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, "fleet_exec", map[string]any{"targets": []string{"role=pooled"}, "command": "true",
		"max_concurrency": fleetBenchConcurrency, "max_errors": 0, "wait_s": 50, "run_id": "fleet-bench"}, &x)
	f.wall = time.Since(t0)
	if err != nil {
		b.Fatalf("fleet run: %v", err)
	}
	if res.IsError || x.Fleet == nil || x.Fleet.Outcome != "completed" || x.Fleet.Counts["completed"] != n {
		b.Fatalf("fleet run: %s; want completed on all %d hosts within wait_s", harness.ResultText(res), n)
	}
	cpu1, err := readProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	f.cpu = cpu1.self + cpu1.children - cpu0.self - cpu0.children
	f.hostsCPU = hostsCPU(b, agents) - hosts0
	if kb, err = testutil.ProcStatusKB(pid, "VmRSS"); err != nil {
		b.Fatal(err)
	}
	f.rssAfter = float64(kb) / 1024
	return f
}
