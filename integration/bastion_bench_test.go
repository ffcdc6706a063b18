package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
// ControlPath=…`, master already up) running `true` on a local sshd.
func BenchmarkBastionExecTrue(b *testing.B) {
	sshd := testutil.StartSSHD(b)
	sshArgs := append(sshd.Multiplexed(b), "true")
	bs, _ := benchFleet(b)
	cs := bs.Connect(b, "agent", nil)
	ctx := context.Background()

	calls := 0
	postern := func() (time.Duration, error) {
		calls++
		t0 := time.Now()
		err := execTrue(ctx, cs, "p1-"+strconv.Itoa(calls))
		return time.Since(t0), err
	}
	openssh := func() (time.Duration, error) {
		var stderr bytes.Buffer
		cmd := exec.Command("ssh", sshArgs...)
		cmd.Stderr = &stderr
		t0 := time.Now()
		err := cmd.Run()
		d := time.Since(t0)
		if err != nil {
			return d, fmt.Errorf("ssh true: %w: %s", err, stderr.String())
		}
		return d, nil
	}
	// Warm up both: the bastion's pooled connection, the page cache, the sshd session path.
	for range 10 {
		for _, f := range []func() (time.Duration, error){postern, openssh} {
			if _, err := f(); err != nil {
				b.Fatal(err)
			}
		}
	}
	var p, o []time.Duration
	b.ResetTimer()
	for len(p) < execSamples {
		for _, side := range []struct {
			f   func() (time.Duration, error)
			out *[]time.Duration
		}{{postern, &p}, {openssh, &o}} {
			for range execBlock {
				d, err := side.f()
				if err != nil {
					b.Fatalf("%v\nbastion log:\n%s", err, bs.Logs())
				}
				*side.out = append(*side.out, d)
			}
		}
	}
	b.StopTimer()

	pp50, pp99 := testutil.Percentile(p, 0.5), testutil.Percentile(p, 0.99)
	op50, op99 := testutil.Percentile(o, 0.5), testutil.Percentile(o, 0.99)
	b.ReportMetric(ms(pp50), "postern-p50-ms")
	b.ReportMetric(ms(pp99), "postern-p99-ms")
	b.ReportMetric(ms(op50), "openssh-p50-ms")
	b.ReportMetric(ms(op99), "openssh-p99-ms")
	b.ReportMetric(float64(pp50)/float64(op50), "p50-postern/openssh")
	b.ReportMetric(float64(pp99)/float64(op99), "p99-postern/openssh")
	table(b, fmt.Sprintf("ssh_exec `true`, %d samples each, alternating blocks of %d (goal: postern ≤ 0.2× openssh)", execSamples, execBlock),
		[]string{"", "p50 ms", "p99 ms"},
		[]string{"postern (MCP → bastion → hostagent)", f2(ms(pp50)), f2(ms(pp99))},
		[]string{"openssh (multiplexed ssh → sshd)", f2(ms(op50)), f2(ms(op99))},
		[]string{"postern / openssh", f2(float64(pp50) / float64(op50)), f2(float64(pp99) / float64(op99))},
	)
}

// BenchmarkBastionConcurrent64 (P3) is throughput under load: 64 MCP callers (one session
// each) run `true` as new intents, against 64 goroutines running `true` straight on the
// hostagent over one SSH connection (the bastion pools one per host too). The ratio is the
// bastion's own cost: MCP, the journal, the drivers. Peak RSS of the bastion follows.
func BenchmarkBastionConcurrent64(b *testing.B) {
	bs, h := benchFleet(b)
	pid := pidByArg(b, bs.ConfigPath)
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
			got, err := hammer(concurrentCallers, concurrentCalls/concurrentRounds, side.f)
			if err != nil {
				b.Fatalf("%v\nbastion log:\n%s", err, bs.Logs())
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
		[]string{"", "execs/s", "p50 ms", "p99 ms"},
		[]string{"postern (64 MCP sessions → bastion → hostagent)", f0(bastion.rate()), f2(ms(bastion.p(0.5))), f2(ms(bastion.p(0.99)))},
		[]string{"hostagent direct (64 client.Run, one SSH conn)", f0(baseline.rate()), f2(ms(baseline.p(0.5))), f2(ms(baseline.p(0.99)))},
		[]string{"postern / hostagent", f2(bastion.rate() / baseline.rate()), f2(float64(bastion.p(0.5)) / float64(baseline.p(0.5))), f2(float64(bastion.p(0.99)) / float64(baseline.p(0.99)))},
	)
	b.Logf("postern peak RSS (VmHWM) after the run: %.1f MB", float64(hwm)/1024)
}

// load is what a concurrent run measured.
type load struct {
	calls   int
	elapsed time.Duration
	latency []time.Duration
}

func (l *load) add(o load) {
	l.calls += o.calls
	l.elapsed += o.elapsed
	l.latency = append(l.latency, o.latency...)
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

// pidByArg finds the process whose command line has arg (a config path unique to the test):
// the harness starts the bastion and keeps its process to itself.
func pidByArg(b *testing.B, arg string) int {
	b.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		b.Fatal(err)
	}
	for _, path := range dirs {
		cmdline, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if string(a) == arg {
				pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
				if err != nil {
					b.Fatal(err)
				}
				return pid
			}
		}
	}
	b.Fatalf("no process has %s on its command line", arg)
	return 0
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
