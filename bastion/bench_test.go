package bastion_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// These benchmarks drive the engine in process (no MCP transport) against a real hostagent
// process, so a CPU profile (-cpuprofile) shows the bastion's own time.

// benchActor is the caller of every benchmark execution.
var benchActor = transport.Caller{Actor: "token:bench"}

// startHostagent runs a real postern-hostagent with postern-supervisor next to it. It builds them
// into the benchmark's temp dir (the go build cache makes that quick) rather than with
// harness.Binary, whose shared build dir needs a TestMain this package does not have.
func startHostagent(b testing.TB) *harness.Hostagent {
	b.Helper()
	dir := b.TempDir()
	for _, name := range []string{"postern-hostagent", "postern-supervisor"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), "./cmd/"+name)
		cmd.Dir = ".." // the module root: tests run in their package's directory
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", name, err, out)
		}
	}
	h := harness.NewHostagent(b)
	h.Bin = filepath.Join(dir, "postern-hostagent")
	h.Start(b)
	return h
}

// openBastion opens a bastion on a fresh state dir (no HTTP listener) that authenticates to
// h with h's authorized client key and has h enrolled as "h1". adjust changes its config.
func openBastion(b testing.TB, h *harness.Hostagent, adjust ...func(*config.Config)) *bastion.Bastion {
	b.Helper()
	cfg := config.DefaultConfig(b.TempDir())
	cfg.Listen = ""
	for _, f := range adjust {
		f(&cfg)
	}
	cfg.Actors = []policy.Actor{{Name: "bench", TokenSHA256: transport.HashToken("bench")}}
	h.ClientKey.WritePrivateKey(b, cfg.ClientKeyPath())
	if err := fleet.Enroll(cfg.InventoryPath(), fleet.Host{Name: "h1", Addr: h.Addr, Account: h.Account, HostKey: h.HostKey}); err != nil {
		b.Fatal(err)
	}
	bs, err := bastion.Open(bastion.Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bs.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := bs.Recover(ctx); err != nil {
		b.Fatal(err)
	}
	return bs
}

// execTrue runs `true` on h1 as a new intent of run and checks that it ran.
func execTrue(ctx context.Context, bs *bastion.Bastion, run string) error {
	c := benchActor
	c.RunID = run
	x, err := bs.Engine().Exec(ctx, c, api.ExecArgs{Host: "h1", Command: "true"}, nil)
	if err != nil {
		return fmt.Errorf("exec (run %s): %w", run, err)
	}
	if x.State != "completed" || x.ExitCode == nil || *x.ExitCode != 0 || x.Replayed {
		return fmt.Errorf("exec (run %s): %+v", run, x)
	}
	return nil
}

// dedupKinds are the lookups BenchmarkDedupLookup measures.
var dedupKinds = []string{"replay", "hit", "miss"}

// BenchmarkDedupLookup (P4) is the cost of recognizing a retry as the journal grows, at 10³
// and 10⁶ records (set POSTERN_BENCH_SMALL=1 to stop at 10⁵; filling 10⁶ takes about a
// minute). The journal holds one real execution of `true` on a real hostagent (completed,
// result not delivered, so a retry matches it) and n-1 others with distinct fingerprints.
// replay is Exec of the same call again — resolve, fingerprint, the matching rule, the stored
// result; no host is contacted. hit and miss are the index lookup alone, of that execution's
// fingerprint and of one no execution has (every new intent's path).
func BenchmarkDedupLookup(b *testing.B) {
	sizes := []int{1_000, 1_000_000}
	if os.Getenv("POSTERN_BENCH_SMALL") != "" {
		sizes = []int{1_000, 100_000}
	}
	h := startHostagent(b)
	nsPerOp := map[string]map[int]float64{}
	for _, kind := range dedupKinds {
		nsPerOp[kind] = map[int]float64{}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) { dedupAt(b, h, n, sizes[0], nsPerOp) })
	}
	big := sizes[len(sizes)-1]
	if len(nsPerOp["replay"]) < len(sizes) {
		return // -bench selected one size only
	}
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\tns/op at %d\tns/op at %d\tratio\t\n", sizes[0], big)
	for _, kind := range dedupKinds {
		small, large := nsPerOp[kind][sizes[0]], nsPerOp[kind][big]
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\t\n", kind, small, large, large/small)
	}
	tw.Flush()
	// A benchmark with sub-benchmarks shows its log only under -v: print the summary.
	fmt.Printf("dedup lookup, journal of %d vs %d records (goal: ratio ≤ 2)\n%s", sizes[0], big, sb.String())
}

// dedupAt fills a fresh journal to n records and measures each kind of lookup, recording its
// ns/op in nsPerOp (and its ratio to the one at base records, if measured).
func dedupAt(b *testing.B, h *harness.Hostagent, n, base int, nsPerOp map[string]map[int]float64) {
	ctx := context.Background()
	bs := openBastion(b, h)
	retry := benchActor
	retry.RunID = "dedup"
	args := api.ExecArgs{Host: "h1", Command: "true"}
	first, err := bs.Engine().Exec(ctx, retry, args, nil)
	if err != nil || first.State != "completed" || first.Replayed {
		b.Fatalf("first exec: %+v, %v", first, err)
	}
	rec, err := bs.Engine().Journal().Get(first.ExecutionID)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	fillJournal(b, bs.Engine().Journal(), n-1)
	fmt.Printf("records=%d: journal filled in %v\n", n, time.Since(t0).Round(time.Millisecond))
	// Let flushes and compactions of the fill settle, so this measures lookups rather
	// than the tail of the fill (as markers' BenchmarkFindByFingerprint does).
	time.Sleep(2 * time.Second)
	for _, kind := range dedupKinds {
		b.Run(kind, func(b *testing.B) {
			start := time.Now()
			for i := 0; i < b.N; i++ {
				switch kind {
				case "replay":
					x, err := bs.Engine().Exec(ctx, retry, args, nil)
					if err != nil || x.ExecutionID != first.ExecutionID || !x.Replayed {
						b.Fatalf("retry: %+v, %v; want %s replayed", x, err, first.ExecutionID)
					}
				case "hit":
					if got, err := bs.Engine().Journal().FindByFingerprint(rec.Actor, rec.IntentScope, rec.Fingerprint); err != nil || got.ID != rec.ID {
						b.Fatalf("lookup: %v", err)
					}
				case "miss":
					fp := fmt.Sprintf("hmac-sha256:%064x", i)
					if _, err := bs.Engine().Journal().FindByFingerprint(rec.Actor, rec.IntentScope, fp); !errors.Is(err, markers.ErrNotFound) {
						b.Fatalf("lookup of an absent fingerprint: %v", err)
					}
				}
			}
			ns := float64(time.Since(start).Nanoseconds()) / float64(b.N)
			nsPerOp[kind][n] = ns
			if baseNs, ok := nsPerOp[kind][base]; ok && n != base {
				b.ReportMetric(ns/baseNs, fmt.Sprintf("×records=%d", base))
			}
		})
	}
}

// fillJournal adds n executions to the journal with distinct fingerprints spread over 50
// actors, from 64 concurrent writers so group commit shares the fsyncs as under load. They
// stay in their initial state: a lookup reads the fingerprint index and the one record it
// names, whatever state the others are in, and journaling each to completed would triple the
// fill (every step's event carries the record) — minutes at 10⁶ on two cores.
func fillJournal(b *testing.B, j markers.JournalStore, n int) {
	b.Helper()
	ctx := context.Background()
	now := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				k := next.Add(1) - 1
				if k >= int64(n) || b.Failed() {
					return
				}
				id, err := markers.NewExecutionID(now)
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := j.Create(ctx, &markers.Record{
					ID: id, Actor: fmt.Sprintf("token:fill-%d", k%50), IntentScope: "run:fill",
					Fingerprint: fmt.Sprintf("hmac-sha256:%064d", k), Tool: "ssh_exec", Channel: "ssh",
					Target: "host:h1", Account: "deploy", Command: []string{"sh", "-c", "true"}, Class: "remote_command", Host: "h1",
				}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// BenchmarkExecTrue is one caller's Exec of `true` as a new intent, interleaved with the
// same command sent straight to the hostagent (hostproto.Run over its own connection): the
// difference is the engine's latency without MCP — its synced journal writes, the driver, the
// pool. It reports the journal's fsyncs per execution too.
func BenchmarkExecTrue(b *testing.B) {
	h := startHostagent(b)
	bs := openBastion(b, h)
	conn := h.Dial(b)
	ctx := context.Background()
	if err := execTrue(ctx, bs, "warm"); err != nil { // the pooled connection
		b.Fatal(err)
	}
	var engine, direct []time.Duration
	before := bs.Engine().Journal().Stats()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := execTrue(ctx, bs, fmt.Sprintf("p1-%d", i)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		id, err := markers.NewExecutionID(t1)
		if err != nil {
			b.Fatal(err)
		}
		res, err := hostproto.Run(ctx, conn, hostproto.Exec{ExecutionID: id, Command: "true", Stdout: io.Discard, Stderr: io.Discard, Protocol: hostproto.Version})
		if err != nil || res.ExitStatus != 0 {
			b.Fatalf("hostagent exec: %+v, %v", res, err)
		}
		engine, direct = append(engine, t1.Sub(t0)), append(direct, time.Since(t1))
	}
	b.StopTimer()
	after := bs.Engine().Journal().Stats()
	e50, d50 := testutil.Percentile(engine, 0.5), testutil.Percentile(direct, 0.5)
	b.ReportMetric(float64(e50.Microseconds())/1000, "exec-p50-ms")
	b.ReportMetric(float64(d50.Microseconds())/1000, "hostagent-p50-ms")
	b.ReportMetric(float64(e50-d50)/float64(time.Millisecond), "engine-added-p50-ms")
	b.ReportMetric(float64(after.Commits-before.Commits)/float64(b.N), "fsyncs/exec")
	b.ReportMetric(float64(after.Events-before.Events)/float64(b.N), "events/exec")
}

// BenchmarkExecConcurrent64 is BenchmarkBastionConcurrent64 (integration) without the MCP
// transport: 64 goroutines call Exec of `true` as new intents on one real hostagent. Its
// CPU profile is the engine's: journal writes, the driver, the pooled SSH connection.
func BenchmarkExecConcurrent64(b *testing.B) {
	h := startHostagent(b)
	bs := openBastion(b, h)
	ctx := context.Background()
	var runs atomic.Int64
	call := func() error { return execTrue(ctx, bs, fmt.Sprintf("c64-%d", runs.Add(1))) }
	if err := call(); err != nil { // the pooled connection
		b.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) && !b.Failed() {
				if err := call(); err != nil {
					b.Error(err)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "execs/s")
}

// BenchmarkMCPConcurrent64 is BenchmarkExecConcurrent64 through the MCP layer, in process:
// 64 go-sdk client sessions call ssh_exec over Streamable HTTP on loopback, so a CPU profile
// shows what the MCP transport costs next to the engine (the go-sdk server's share is under
// mcp.(*StreamableHTTPHandler).ServeHTTP; the clients' under mcp.(*ClientSession)).
func BenchmarkMCPConcurrent64(b *testing.B) {
	h := startHostagent(b)
	bs := openBastion(b, h, func(c *config.Config) { c.Listen = "127.0.0.1:0" })
	ctx, cancel := context.WithCancel(context.Background())
	endpoints := make(chan bastion.Endpoints, 1)
	served := make(chan error, 1)
	go func() { served <- bs.Serve(ctx, func(ep bastion.Endpoints) { endpoints <- ep }) }()
	defer func() {
		cancel()
		<-served
	}()
	var ep bastion.Endpoints
	select {
	case ep = <-endpoints:
	case err := <-served:
		b.Fatalf("serve: %v", err)
	}
	rt := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}
	defer rt.CloseIdleConnections()
	sessions := make([]*mcp.ClientSession, 64)
	for i := range sessions {
		sessions[i] = harness.ConnectMCP(b, ep.URL, harness.TokenHTTPClient("bench", nil, rt), nil)
	}
	var runs atomic.Int64
	call := func(cs *mcp.ClientSession) error {
		run := fmt.Sprintf("mcp64-%d", runs.Add(1))
		var x api.Execution
		res, err := harness.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "true", "run_id": run}, &x)
		if err != nil {
			return err
		}
		if res.IsError || x.State != "completed" || x.ExitCode == nil || *x.ExitCode != 0 {
			return fmt.Errorf("ssh_exec (run %s): %+v: %s", run, x, harness.ResultText(res))
		}
		return nil
	}
	if err := call(sessions[0]); err != nil { // the pooled connection
		b.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for _, cs := range sessions {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) && !b.Failed() {
				if err := call(cs); err != nil {
					b.Error(err)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "execs/s")
}
