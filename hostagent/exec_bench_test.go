package hostagent_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostagent/client"
	"github.com/postern-dev/postern/hostagent/shim"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestMain lets the test binary stand in for postern-hostagent when the executor re-executes
// it as the shim.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		os.Exit(shim.Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// benchAgent is an in-process hostagent: SSH server + executor, with a real marker store
// or (markers off) an in-memory stand-in that writes nothing.
type benchAgent struct {
	client *gossh.Client
	store  *testutil.Store
	dial   func() *gossh.Client
}

func startBenchAgent(b *testing.B, withMarkers bool) *benchAgent {
	b.Helper()
	dir := b.TempDir()
	key := testutil.NewSSHKey(b)
	testutil.WriteAuthorizedKeys(b, filepath.Join(dir, "authorized_keys"), key.AuthorizedLine())
	cfg := hostagent.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.AuthorizedKeysFile = filepath.Join(dir, "authorized_keys")
	account := currentUser(b)
	cfg.AllowedAccounts = []string{account}
	logger := discardLogger()
	ba := &benchAgent{}
	opts := hostagent.ExecutorOptions{Config: cfg, Store: newMemStore(), Logger: logger}
	if withMarkers {
		ba.store = testutil.OpenStore(b, markers.Host)
		opts.Store = ba.store.Store
	}
	exe, err := hostagent.NewExecutor(opts)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := hostagent.NewServer(cfg, exe, logger)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ctx, ln) })
	b.Cleanup(func() {
		cancel()
		wg.Wait()
		exe.Close()
	})
	ba.dial = func() *gossh.Client {
		return testutil.MustDialSSH(b, ln.Addr().String(), account, srv.HostPublicKey(), gossh.PublicKeys(key.Signer))
	}
	ba.client = ba.dial()
	return ba
}

func (ba *benchAgent) exec(b *testing.B, command string) {
	execOn(b, ba.client, command)
}

func execOn(b *testing.B, c *gossh.Client, command string) {
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	res, err := client.Run(context.Background(), c, client.Exec{ExecutionID: id, Command: command})
	if err != nil || res.ExitStatus != 0 {
		b.Fatalf("exec: %+v, %v", res, err)
	}
}

// BenchmarkExecTrue runs `true` through the hostagent with markers and with markers off
// (an in-memory stand-in), interleaved so both see the same machine, and reports the p50 of
// each and the marker's cost.
func BenchmarkExecTrue(b *testing.B) {
	on, off := startBenchAgent(b, true), startBenchAgent(b, false)
	var withM, without []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		on.exec(b, "true")
		t1 := time.Now()
		off.exec(b, "true")
		withM, without = append(withM, t1.Sub(t0)), append(without, time.Since(t1))
	}
	b.StopTimer()
	p50on, p50off := p50(withM), p50(without)
	b.ReportMetric(float64(p50on.Microseconds()), "markers-on-p50-µs")
	b.ReportMetric(float64(p50off.Microseconds()), "markers-off-p50-µs")
	b.ReportMetric(float64((p50on - p50off).Microseconds()), "marker-cost-µs")
	b.ReportMetric(float64(p50on)/float64(p50off), "on/off")
	st := on.store.Stats()
	b.ReportMetric(float64(st.Commits)/float64(b.N), "fsyncs/exec")
}

// BenchmarkExecConcurrent runs `true` from 64 concurrent sessions over 8 connections and
// reports executions/s and marker fsyncs per execution.
func BenchmarkExecConcurrent(b *testing.B) {
	ba := startBenchAgent(b, true)
	clients := []*gossh.Client{ba.client}
	for len(clients) < 8 {
		clients = append(clients, ba.dial())
	}
	before := ba.store.Stats()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				execOn(b, clients[w%len(clients)], "true")
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	after := ba.store.Stats()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "execs/s")
	b.ReportMetric(float64(after.Commits-before.Commits)/float64(b.N), "fsyncs/exec")
}

func p50(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
