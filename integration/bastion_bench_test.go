package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/hostagent/client"
	"github.com/postern-dev/postern/internal/testutil"
)

// The bastion benchmarks measure their baselines in the same run, alternating with the
// bastion so both see the same machine noise, and report ratios. They take a fixed number of
// samples whatever b.N is: run them with -benchtime 1x.
const (
	// execSamples is how many calls of `true` each side of BenchmarkBastionExecTrue makes.
	execSamples = 200
	// execBlock is how many calls one side makes before the other takes over.
	execBlock = 20
	// concurrentCallers and concurrentCalls shape BenchmarkBastionConcurrent64.
	concurrentCallers = 64
	concurrentCalls   = 2000
	// concurrentRounds alternates the baseline and the bastion this many times.
	concurrentRounds = 2
)

// benchFleet is a real `postern serve` process with one enrolled hostagent, "h1".
func benchFleet(b *testing.B) (*testutil.Bastion, *testutil.Hostagent) {
	b.Helper()
	testutil.Binary(b, "postern") // build outside any timing
	h := testutil.StartHostagent(b)
	bs := testutil.NewBastion(b, h.ClientKey)
	bs.Enroll(b, "h1", h)
	bs.Start(b)
	return bs, h
}

// execTrue calls ssh_exec of `true` on h1 as a new intent (its own agent run) and checks
// that it ran and succeeded.
func execTrue(ctx context.Context, cs *mcp.ClientSession, run string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var x bastion.Execution
	res, err := testutil.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "true", "run_id": run}, &x)
	if err != nil {
		return fmt.Errorf("ssh_exec (run %s): %w", run, err)
	}
	if res.IsError || x.State != "completed" || x.ExitCode == nil || *x.ExitCode != 0 || x.Replayed {
		return fmt.Errorf("ssh_exec (run %s): %+v: %s", run, x, testutil.ResultText(res))
	}
	return nil
}

// BenchmarkBastionExecTrue (P1) is the latency of one `true` end to end: a go-sdk MCP client
// over Streamable HTTP → `postern serve` (journal writes, pooled SSH connection) → the real
// hostagent (marker write, shim) and back; against OpenSSH's multiplexed client (`ssh -o
// ControlPath=…`, master already up) running `true` on a local sshd. The same hostagent
// reached directly (client.Run over one SSH connection) shows what the bastion adds.
func BenchmarkBastionExecTrue(b *testing.B) {
	sshd := testutil.StartSSHD(b)
	sshArgs := append(sshd.Multiplexed(b), "true")
	bs, h := benchFleet(b)
	cs := bs.Connect(b, "agent", nil)
	conn := h.Dial(b)
	ctx := context.Background()

	calls := 0
	postern := func() error {
		calls++
		return execTrue(ctx, cs, "p1-"+strconv.Itoa(calls))
	}
	direct := func() error {
		if got := execOn(b, conn, client.Exec{ExecutionID: newID(b), Command: "true"}); got.err != nil || got.res.ExitStatus != 0 {
			return fmt.Errorf("hostagent exec: %+v", got)
		}
		return nil
	}
	openssh := func() error {
		var stderr bytes.Buffer
		cmd := exec.Command("ssh", sshArgs...)
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("ssh true: %w: %s", err, stderr.String())
		}
		return nil
	}
	sides := []*benchSide{
		{name: "postern (MCP → bastion → hostagent)", call: postern},
		{name: "hostagent direct (client.Run, one SSH conn)", call: direct},
		{name: "openssh (multiplexed ssh → sshd)", call: openssh},
	}
	sampleInterleaved(b, sides, execSamples, execBlock, func() string { return "bastion log:\n" + bs.Logs() })

	p50 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.5) }
	p99 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.99) }
	const posternSide, directSide, opensshSide = 0, 1, 2
	b.ReportMetric(ms(p50(posternSide)), "postern-p50-ms")
	b.ReportMetric(ms(p99(posternSide)), "postern-p99-ms")
	b.ReportMetric(ms(p50(directSide)), "hostagent-p50-ms")
	b.ReportMetric(ms(p50(opensshSide)), "openssh-p50-ms")
	b.ReportMetric(ms(p99(opensshSide)), "openssh-p99-ms")
	b.ReportMetric(float64(p50(posternSide))/float64(p50(opensshSide)), "p50-postern/openssh")
	b.ReportMetric(float64(p99(posternSide))/float64(p99(opensshSide)), "p99-postern/openssh")
	rows := [][]string{{"", "p50 ms", "p99 ms", "p50 / openssh", "p99 / openssh"}}
	for i, side := range sides {
		rows = append(rows, []string{side.name, f2(ms(p50(i))), f2(ms(p99(i))),
			f2(float64(p50(i)) / float64(p50(opensshSide))), f2(float64(p99(i)) / float64(p99(opensshSide)))})
	}
	rows = append(rows, []string{"bastion's share (postern − hostagent direct)", f2(ms(p50(posternSide) - p50(directSide))), f2(ms(p99(posternSide) - p99(directSide)))})
	table(b, fmt.Sprintf("ssh_exec `true`, %d samples each, alternating blocks of %d (goal: postern ≤ 0.2× openssh)", execSamples, execBlock), rows...)
}

// BenchmarkBastionConcurrent64 (P3) is throughput under load: 64 MCP callers (one session
// each) run `true` as new intents, against 64 goroutines running `true` straight on the
// hostagent over one SSH connection (the bastion pools one per host too). The ratio is the
// bastion's own cost: MCP, the journal, the drivers. Peak RSS of the bastion follows.
func BenchmarkBastionConcurrent64(b *testing.B) {
	bs, h := benchFleet(b)
	pid := bs.PID()
	ssh := h.Dial(b)
	// Keep a connection per caller instead of churning through the default two idle ones.
	rt := &http.Transport{MaxIdleConns: concurrentCallers, MaxIdleConnsPerHost: concurrentCallers}
	defer rt.CloseIdleConnections()
	sessions := make([]*mcp.ClientSession, concurrentCallers)
	for i := range sessions {
		sessions[i] = testutil.ConnectMCP(b, bs.URL, bs.HTTPClient("agent", nil, rt), nil)
	}
	ctx := context.Background()
	var runs atomic.Int64
	viaBastion := func(worker int) error {
		return execTrue(ctx, sessions[worker], "p3-"+strconv.FormatInt(runs.Add(1), 10))
	}
	direct := func(int) error {
		got := execOn(b, ssh, client.Exec{ExecutionID: newID(b), Command: "true"})
		if got.err != nil || got.res.ExitStatus != 0 {
			return fmt.Errorf("hostagent exec: %+v", got)
		}
		return nil
	}
	// Warm up: every session's HTTP connection, the pooled SSH connection.
	if _, err := hammer(concurrentCallers, concurrentCallers, viaBastion); err != nil {
		b.Fatal(err)
	}
	if _, err := hammer(concurrentCallers, concurrentCallers, direct); err != nil {
		b.Fatal(err)
	}
	var baseline, bastion load
	b.ResetTimer()
	for range concurrentRounds {
		for _, side := range []struct {
			f   func(int) error
			out *load
		}{{direct, &baseline}, {viaBastion, &bastion}} {
			before := cpuOf(b, pid, h.PID(), 0)
			got, err := hammer(concurrentCallers, concurrentCalls/concurrentRounds, side.f)
			if err != nil {
				b.Fatalf("%v\nbastion log:\n%s", err, bs.Logs())
			}
			after := cpuOf(b, pid, h.PID(), 0)
			for i := range got.cpu {
				got.cpu[i] = after[i] - before[i]
			}
			side.out.add(got)
		}
	}
	b.StopTimer()
	hwm, err := testutil.ProcStatusKB(pid, "VmHWM")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(bastion.rate(), "postern-execs/s")
	b.ReportMetric(baseline.rate(), "hostagent-execs/s")
	b.ReportMetric(bastion.rate()/baseline.rate(), "postern/hostagent")
	b.ReportMetric(float64(hwm)/1024, "postern-peak-RSS-MB")
	table(b, fmt.Sprintf("%d concurrent callers, %d calls of `true` each side, in %d alternating rounds (goal: postern ≥ 500 execs/s)", concurrentCallers, concurrentCalls, concurrentRounds),
		[]string{"", "execs/s", "p50 ms", "p99 ms", "CPU ms/exec: bastion", "hostagent+shims", "callers"},
		append([]string{"postern (64 MCP sessions → bastion → hostagent)", f0(bastion.rate()), f2(ms(bastion.p(0.5))), f2(ms(bastion.p(0.99)))}, bastion.cpuPerCall()...),
		append([]string{"hostagent direct (64 client.Run, one SSH conn)", f0(baseline.rate()), f2(ms(baseline.p(0.5))), f2(ms(baseline.p(0.99)))}, baseline.cpuPerCall()...),
		[]string{"postern / hostagent", f2(bastion.rate() / baseline.rate()), f2(float64(bastion.p(0.5)) / float64(baseline.p(0.5))), f2(float64(bastion.p(0.99)) / float64(baseline.p(0.99)))},
	)
	b.Logf("postern peak RSS (VmHWM) after the run: %.1f MB", float64(hwm)/1024)
}

// load is what a concurrent run measured.
type load struct {
	calls   int
	elapsed time.Duration
	latency []time.Duration
	// cpu is the CPU time the bastion, the hostagent (with its shims and commands) and this
	// process (the callers) used during the run.
	cpu [3]time.Duration
}

func (l *load) add(o load) {
	l.calls += o.calls
	l.elapsed += o.elapsed
	l.latency = append(l.latency, o.latency...)
	for i := range l.cpu {
		l.cpu[i] += o.cpu[i]
	}
}

func (l *load) cpuPerCall() []string {
	out := make([]string, len(l.cpu))
	for i, c := range l.cpu {
		out[i] = f2(ms(c) / float64(l.calls))
	}
	return out
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every Linux ABI Go runs on.
const clockTick = 10 * time.Millisecond

// cpuOf returns the user+system CPU time of each process so far, including its waited-for
// children (a hostagent's shims and their commands); pid 0 is this process.
func cpuOf(b *testing.B, pids ...int) [3]time.Duration {
	b.Helper()
	var out [3]time.Duration
	for i, pid := range pids {
		path := "/proc/self/stat"
		if pid != 0 {
			path = "/proc/" + strconv.Itoa(pid) + "/stat"
		}
		stat, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		// Fields after the command name (which may hold spaces) start at field 3 (state);
		// utime, stime, cutime, cstime are fields 14-17.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		for _, v := range f[11:15] {
			ticks, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("%s: %v", path, err)
			}
			out[i] += time.Duration(ticks) * clockTick
		}
	}
	return out
}

func (l *load) rate() float64 { return float64(l.calls) / l.elapsed.Seconds() }

func (l *load) p(q float64) time.Duration { return testutil.Percentile(l.latency, q) }

// hammer makes n calls from workers goroutines (call gets the worker's index) and returns
// the wall time and each call's latency; it stops at the first error.
func hammer(workers, n int, call func(worker int) error) (load, error) {
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex // guards firstErr and latency
	var firstErr error
	latency := make([]time.Duration, 0, n)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && !failed.Load() {
				t0 := time.Now()
				err := call(w)
				d := time.Since(t0)
				mu.Lock()
				latency = append(latency, d)
				if err != nil && firstErr == nil {
					firstErr = err
					failed.Store(true)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return load{calls: n, elapsed: time.Since(start), latency: latency}, firstErr
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func f0(v float64) string        { return strconv.FormatFloat(v, 'f', 0, 64) }
func f2(v float64) string        { return strconv.FormatFloat(v, 'f', 2, 64) }

// table logs a titled, aligned table of figures under the benchmark's result line.
func table(b *testing.B, title string, rows ...[]string) {
	b.Helper()
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	tw.Flush()
	b.Logf("%s\n%s", title, sb.String())
}
