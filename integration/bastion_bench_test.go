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

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
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
func benchFleet(b *testing.B) (*harness.Bastion, *harness.Hostagent) {
	b.Helper()
	harness.Binary(b, "postern") // build outside any timing
	h := harness.StartHostagent(b)
	bs := harness.NewBastion(b, h.ClientKey)
	bs.Enroll(b, "h1", h)
	bs.Start(b)
	return bs, h
}

// execTrue calls ssh_exec of `true` on h1 as a new intent (its own agent run) and checks
// that it ran and succeeded.
func execTrue(ctx context.Context, cs *mcp.ClientSession, run string) error {
	return execTrueArgs(ctx, cs, map[string]any{"host": "h1", "command": "true", "run_id": run})
}

// execTrueArgs calls ssh_exec with args, which must make it a new intent of `true`, and
// checks that it ran and succeeded.
func execTrueArgs(ctx context.Context, cs *mcp.ClientSession, args map[string]any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, "ssh_exec", args, &x)
	if err != nil {
		return fmt.Errorf("ssh_exec %v: %w", args, err)
	}
	if res.IsError || x.State != "completed" || x.ExitCode == nil || *x.ExitCode != 0 || x.Replayed {
		return fmt.Errorf("ssh_exec %v: %+v: %s", args, x, harness.ResultText(res))
	}
	return nil
}

// BenchmarkBastionExecTrue (P1) is the latency of one `true` end to end: a go-sdk MCP client
// over Streamable HTTP → `postern serve` (journal writes, pooled SSH connection) → the real
// hostagent (marker write, supervisor) and back; the same through the stdio bridge (`postern
// mcp` over the unix socket); the same hostagent reached directly (hostproto.Run, x/crypto, one
// SSH connection, markers on), which shows what the bastion adds; OpenSSH's multiplexed client
// (`ssh -o ControlPath=…`, master already up) running `true` on a local sshd; and the floor
// (newFloor: fork/exec of `sh -c true` plus four 512-byte fsyncs). All interleaved, and each
// reported as a ratio to the floor and to OpenSSH.
func BenchmarkBastionExecTrue(b *testing.B) {
	sshd := harness.StartSSHD(b)
	sshArgs := append(sshd.Multiplexed(b), "true")
	bs, h := benchFleet(b)
	cs := bs.Connect(b, "agent", nil)
	bridge := exec.Command(harness.Binary(b, "postern"), "mcp", "--socket", bs.Socket)
	bridge.Stderr = os.Stderr
	stdio, err := mcp.NewClient(&mcp.Implementation{Name: "postern-bench-stdio", Version: "0"}, nil).
		Connect(context.Background(), &mcp.CommandTransport{Command: bridge}, nil)
	if err != nil {
		b.Fatalf("connect through the stdio bridge: %v", err)
	}
	defer stdio.Close()
	ts := startTSStdio(b, harness.Binary(b, "postern"), "mcp", "--socket", bs.Socket)
	conn := h.Dial(b)
	ctx := context.Background()

	calls := 0
	postern := func() error {
		calls++
		return execTrue(ctx, cs, "p1-"+strconv.Itoa(calls))
	}
	// A local agent's intent scope is its process, whatever run_id says: each call gets an
	// idempotency key of its own to be a new intent (BenchmarkStdioRepeat measures the
	// identical call).
	bridged := func() error {
		calls++
		return execTrueArgs(ctx, stdio, map[string]any{"host": "h1", "command": "true", "idempotency_key": "p1-stdio-" + strconv.Itoa(calls)})
	}
	tsBridged := func() error {
		calls++
		return ts.call(map[string]any{"host": "h1", "command": "true", "idempotency_key": "p1-ts-" + strconv.Itoa(calls)})
	}
	direct := func() error {
		if got := execOn(b, conn, hostproto.Exec{ExecutionID: newID(b), Command: "true", Protocol: hostproto.Version}); got.err != nil || got.res.ExitStatus != 0 {
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
		{name: "postern (go-sdk, Streamable HTTP → bastion → hostagent)", call: postern},
		{name: "postern via the stdio bridge (postern mcp → unix socket)", call: bridged},
		{name: "postern via the stdio bridge, official TypeScript SDK client", call: tsBridged},
		{name: "hostagent direct (hostproto.Run, one SSH conn, markers on)", call: direct},
		{name: "openssh (multiplexed ssh → sshd)", call: openssh},
		{name: fmt.Sprintf("floor (fork/exec sh -c true + %d × 512 B fsync)", floorWrites), call: newFloor(b)},
	}
	sampleInterleaved(b, sides, execSamples, execBlock, func() string { return "bastion log:\n" + bs.Logs() })

	p50 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.5) }
	p99 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.99) }
	const posternSide, stdioSide, tsSide, directSide, opensshSide, floorSide = 0, 1, 2, 3, 4, 5
	b.ReportMetric(ms(p50(posternSide)), "postern-p50-ms")
	b.ReportMetric(ms(p99(posternSide)), "postern-p99-ms")
	b.ReportMetric(ms(p50(stdioSide)), "stdio-p50-ms")
	b.ReportMetric(ms(p99(stdioSide)), "stdio-p99-ms")
	b.ReportMetric(ms(p50(tsSide)), "ts-stdio-p50-ms")
	b.ReportMetric(ms(p99(tsSide)), "ts-stdio-p99-ms")
	b.ReportMetric(float64(p50(tsSide))/float64(p50(opensshSide)), "p50-ts-stdio/openssh")
	b.ReportMetric(float64(p50(tsSide))/float64(p50(floorSide)), "p50-ts-stdio/floor")
	b.ReportMetric(ms(p50(directSide)), "hostagent-p50-ms")
	b.ReportMetric(ms(p50(opensshSide)), "openssh-p50-ms")
	b.ReportMetric(ms(p99(opensshSide)), "openssh-p99-ms")
	b.ReportMetric(ms(p50(floorSide)), "floor-p50-ms")
	b.ReportMetric(float64(p50(posternSide))/float64(p50(opensshSide)), "p50-postern/openssh")
	b.ReportMetric(float64(p99(posternSide))/float64(p99(opensshSide)), "p99-postern/openssh")
	b.ReportMetric(float64(p50(posternSide))/float64(p50(floorSide)), "p50-postern/floor")
	b.ReportMetric(float64(p50(stdioSide))/float64(p50(floorSide)), "p50-stdio/floor")
	b.ReportMetric(float64(p99(stdioSide))/float64(p50(floorSide)), "p99-stdio/floor")
	b.ReportMetric(float64(p50(directSide))/float64(p50(floorSide)), "p50-hostagent/floor")
	rows := [][]string{{"", "p50 ms", "p99 ms", "p50 / floor", "p50 / openssh", "p99 / openssh"}}
	for i, side := range sides {
		rows = append(rows, []string{side.name, f2(ms(p50(i))), f2(ms(p99(i))), f2(float64(p50(i)) / float64(p50(floorSide))),
			f2(float64(p50(i)) / float64(p50(opensshSide))), f2(float64(p99(i)) / float64(p99(opensshSide)))})
	}
	rows = append(rows, []string{"bastion's share (postern − hostagent direct)", f2(ms(p50(posternSide) - p50(directSide))), f2(ms(p99(posternSide) - p99(directSide)))})
	table(b, fmt.Sprintf("ssh_exec `true`, %d samples each, alternating blocks of %d (goals: postern ≤ 1.5× floor, hostagent direct ≤ 1.3× floor; stretch: postern ≤ 0.2× openssh)", execSamples, execBlock), rows...)
}

// repeatSamples is how many calls each side of BenchmarkStdioRepeat makes, in blocks of
// repeatBlock.
const (
	repeatSamples = 100
	repeatBlock   = 10
)

// BenchmarkStdioRepeat is what an identical call costs right after the result of the same
// call was delivered, through the stdio bridge (`postern mcp`, a go-sdk client as a local
// agent's): a new execution of the same intent — delivery_settle is not waited for there,
// since the bridge forwards a cancel before it reads on — against a distinct call (another
// command line) that is a new intent anyway. Both must run: a replay would be no new
// execution and is an error here. The goal is an identical repeat at most 2× a distinct call.
func BenchmarkStdioRepeat(b *testing.B) {
	bs, _ := benchFleet(b)
	bridge := exec.Command(harness.Binary(b, "postern"), "mcp", "--socket", bs.Socket)
	bridge.Stderr = os.Stderr
	stdio, err := mcp.NewClient(&mcp.Implementation{Name: "postern-bench-repeat", Version: "0"}, nil).
		Connect(context.Background(), &mcp.CommandTransport{Command: bridge}, nil)
	if err != nil {
		b.Fatalf("connect through the stdio bridge: %v", err)
	}
	defer stdio.Close()
	ctx := context.Background()
	calls := 0
	repeat := func() error {
		return execTrueArgs(ctx, stdio, map[string]any{"host": "h1", "command": "true"})
	}
	distinct := func() error {
		calls++
		return execTrueArgs(ctx, stdio, map[string]any{"host": "h1", "command": "true " + strconv.Itoa(calls)})
	}
	sides := []*benchSide{
		{name: "identical repeat (same call again, after its result was delivered)", call: repeat},
		{name: "distinct call (another command line)", call: distinct},
	}
	sampleInterleaved(b, sides, repeatSamples, repeatBlock, func() string { return "bastion log:\n" + bs.Logs() })
	p50 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.5) }
	p99 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.99) }
	const repeatSide, distinctSide = 0, 1
	b.ReportMetric(ms(p50(repeatSide)), "repeat-p50-ms")
	b.ReportMetric(ms(p99(repeatSide)), "repeat-p99-ms")
	b.ReportMetric(ms(p50(distinctSide)), "distinct-p50-ms")
	b.ReportMetric(ms(p99(distinctSide)), "distinct-p99-ms")
	b.ReportMetric(float64(p50(repeatSide))/float64(p50(distinctSide)), "p50-repeat/distinct")
	rows := [][]string{{"", "p50 ms", "p99 ms", "p50 / distinct"}}
	for i, side := range sides {
		rows = append(rows, []string{side.name, f2(ms(p50(i))), f2(ms(p99(i))), f2(float64(p50(i)) / float64(p50(distinctSide)))})
	}
	table(b, fmt.Sprintf("ssh_exec `true` through postern mcp, %d samples each, alternating blocks of %d (goal: repeat ≤ 2× distinct)", repeatSamples, repeatBlock), rows...)
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
		sessions[i] = harness.ConnectMCP(b, bs.URL, bs.HTTPClient("agent", nil, rt), nil)
	}
	ctx := context.Background()
	var runs atomic.Int64
	viaBastion := func(worker int) error {
		return execTrue(ctx, sessions[worker], "p3-"+strconv.FormatInt(runs.Add(1), 10))
	}
	direct := func(int) error {
		got := execOn(b, ssh, hostproto.Exec{ExecutionID: newID(b), Command: "true", Protocol: hostproto.Version})
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
	// Found after the warm-up: a long-lived supervisor is started with the first command.
	sup := supervisorPID(h.DataDir)
	var baseline, bastion load
	b.ResetTimer()
	for range concurrentRounds {
		for _, side := range []struct {
			f   func(int) error
			out *load
		}{{direct, &baseline}, {viaBastion, &bastion}} {
			before := cpuSnapshot(b, pid, h.PID(), sup)
			got, err := hammer(concurrentCallers, concurrentCalls/concurrentRounds, side.f)
			if err != nil {
				b.Fatalf("%v\nbastion log:\n%s", err, bs.Logs())
			}
			got.cpu = cpuSnapshot(b, pid, h.PID(), sup).sub(before)
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
	// CPU per execution through the bastion, per process. Without a long-lived supervisor
	// (per-command shims) the commands' time is in the shims' (the hostagent's children).
	cpu := bastion.cpu
	b.ReportMetric(bastion.perCall(cpu.bastion), "bastion-cpu-ms/exec")
	b.ReportMetric(bastion.perCall(cpu.hostagent), "hostagent-cpu-ms/exec")
	if cpu.hasSupervisor {
		b.ReportMetric(bastion.perCall(cpu.supervisor), "supervisor-cpu-ms/exec")
		b.ReportMetric(bastion.perCall(cpu.commands), "command-cpu-ms/exec")
	}
	b.ReportMetric(bastion.perCall(cpu.shims), "shims-cpu-ms/exec")
	b.ReportMetric(bastion.perCall(cpu.callers), "callers-cpu-ms/exec")
	table(b, fmt.Sprintf("%d concurrent callers, %d calls of `true` each side, in %d alternating rounds (goal: postern ≥ 500 execs/s)", concurrentCallers, concurrentCalls, concurrentRounds),
		[]string{"", "execs/s", "p50 ms", "p99 ms", "CPU ms/exec: bastion", "hostagent", "supervisor", "commands", "shims+their commands", "callers"},
		append([]string{"postern (64 MCP sessions → bastion → hostagent)", f0(bastion.rate()), f2(ms(bastion.p(0.5))), f2(ms(bastion.p(0.99)))}, bastion.cpuPerCall()...),
		append([]string{"hostagent direct (64 hostproto.Run, one SSH conn)", f0(baseline.rate()), f2(ms(baseline.p(0.5))), f2(ms(baseline.p(0.99)))}, baseline.cpuPerCall()...),
		[]string{"postern / hostagent", f2(bastion.rate() / baseline.rate()), f2(float64(bastion.p(0.5)) / float64(baseline.p(0.5))), f2(float64(bastion.p(0.99)) / float64(baseline.p(0.99)))},
	)
	b.Logf("postern peak RSS (VmHWM) after the run: %.1f MB", float64(hwm)/1024)
}

// load is what a concurrent run measured.
type load struct {
	calls   int
	elapsed time.Duration
	latency []time.Duration
	// cpu is the CPU time each process used during the run.
	cpu execCPU
}

func (l *load) add(o load) {
	l.calls += o.calls
	l.elapsed += o.elapsed
	l.latency = append(l.latency, o.latency...)
	l.cpu = l.cpu.add(o.cpu)
}

// perCall is d per call, in ms.
func (l *load) perCall(d time.Duration) float64 { return ms(d) / float64(l.calls) }

// cpuPerCall is the table's CPU columns: bastion, hostagent, supervisor, commands (under the
// supervisor), per-command shims with their commands, callers.
func (l *load) cpuPerCall() []string {
	c := l.cpu
	sup, cmds := "—", "—"
	if c.hasSupervisor {
		sup, cmds = f2(l.perCall(c.supervisor)), f2(l.perCall(c.commands))
	}
	return []string{f2(l.perCall(c.bastion)), f2(l.perCall(c.hostagent)), sup, cmds, f2(l.perCall(c.shims)), f2(l.perCall(c.callers))}
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
