package hostagent_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestMain lets the test binary stand in for postern-hostagent when the executor re-executes
// it as the supervisor.
func TestMain(m *testing.M) {
	if supervisor.Invoked(os.Args) {
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// execAgent is an in-process hostagent: SSH server + executor on a given marker store.
type execAgent struct {
	client *gossh.Client
	dial   func() *gossh.Client
}

// startExecAgent serves an executor whose store useStore sets; the test binary is the
// supervisor.
func startExecAgent(t testing.TB, useStore func(*hostagent.ExecutorOptions)) *execAgent {
	t.Helper()
	dir := t.TempDir()
	key := testutil.NewSSHKey(t)
	testutil.WriteAuthorizedKeys(t, filepath.Join(dir, "authorized_keys"), key.AuthorizedLine())
	cfg := hostagent.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.AuthorizedKeysFile = filepath.Join(dir, "authorized_keys")
	account := currentUser(t)
	cfg.AllowedAccounts = []string{account}
	logger := discardLogger()
	opts := hostagent.ExecutorOptions{Config: cfg, Logger: logger}
	useStore(&opts)
	exe, err := hostagent.NewExecutor(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := hostagent.NewServer(cfg, exe, logger)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ctx, ln) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		exe.Close()
	})
	ea := &execAgent{dial: func() *gossh.Client {
		return testutil.MustDialSSH(t, ln.Addr().String(), account, srv.HostPublicKey(), gossh.PublicKeys(key.Signer))
	}}
	ea.client = ea.dial()
	return ea
}

func TestMarkerWriteFailureRefusesTheCommand(t *testing.T) {
	store := newMemStore()
	store.failCreate = errors.New("no space left on device")
	ea := startExecAgent(t, func(o *hostagent.ExecutorOptions) { o.Store = store })
	effects := filepath.Join(t.TempDir(), "effects")
	id, _ := markers.NewExecutionID(time.Now())
	var stderr strings.Builder
	res, err := hostproto.Run(context.Background(), ea.client, hostproto.Exec{ExecutionID: id, Command: "touch " + effects, Stderr: &stderr})
	if err != nil || res.ExitStatus != hostproto.ExitRefused || !strings.Contains(stderr.String(), "not started") {
		t.Fatalf("exec = %+v, %v, stderr %q; want 255 and not started", res, err, stderr.String())
	}
	if _, err := os.Stat(effects); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran although its marker was not written")
	}
}

func execOn(b testing.TB, c *gossh.Client, command string) {
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		b.Fatal(err)
	}
	res, err := hostproto.Run(context.Background(), c, hostproto.Exec{ExecutionID: id, Command: command})
	if err != nil || res.ExitStatus != 0 {
		b.Fatalf("exec: %+v, %v", res, err)
	}
}

// BenchmarkExecTrue runs `true` through the hostagent with markers and with markers off
// (an in-memory stand-in), interleaved so both see the same machine, and reports the p50 of
// each and the marker's cost — next to the floor of that cost, two 512-byte writes each
// followed by fdatasync on the same file system, timed in the same loop.
func BenchmarkExecTrue(b *testing.B) {
	store := testutil.OpenStore(b, markers.HostGraph)
	on := startExecAgent(b, func(o *hostagent.ExecutorOptions) { o.Store = store.Store })
	off := startExecAgent(b, func(o *hostagent.ExecutorOptions) { o.Store = newMemStore() })
	floor, err := os.OpenFile(filepath.Join(b.TempDir(), "floor"), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer floor.Close()
	block := make([]byte, 512)
	twoSyncs := func() {
		for range 2 {
			if _, err := floor.WriteAt(block, 0); err != nil {
				b.Fatal(err)
			}
			if err := unix.Fdatasync(int(floor.Fd())); err != nil {
				b.Fatal(err)
			}
		}
	}
	var withM, without, syncs []time.Duration
	// Counted over the loop only: starting the agent writes to the store too.
	before := store.Stats()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		execOn(b, on.client, "true")
		t1 := time.Now()
		execOn(b, off.client, "true")
		t2 := time.Now()
		twoSyncs()
		withM, without, syncs = append(withM, t1.Sub(t0)), append(without, t2.Sub(t1)), append(syncs, time.Since(t2))
	}
	b.StopTimer()
	p50on, p50off := testutil.Percentile(withM, 0.5), testutil.Percentile(without, 0.5)
	p50syncs := testutil.Percentile(syncs, 0.5)
	b.ReportMetric(float64(p50syncs.Microseconds()), "two-fdatasyncs-p50-µs")
	b.ReportMetric(float64((p50on - p50off - p50syncs).Microseconds()), "marker-cost-over-fdatasyncs-µs")
	b.ReportMetric(float64(p50on.Microseconds()), "markers-on-p50-µs")
	b.ReportMetric(float64(p50off.Microseconds()), "markers-off-p50-µs")
	b.ReportMetric(float64((p50on - p50off).Microseconds()), "marker-cost-µs")
	b.ReportMetric(float64(p50on)/float64(p50off), "on/off")
	b.ReportMetric(float64(store.Stats().Commits-before.Commits)/float64(b.N), "fsyncs/exec")
}

// BenchmarkExecConcurrent runs `true` from 64 concurrent sessions over 8 connections and
// reports executions/s and marker fsyncs per execution.
func BenchmarkExecConcurrent(b *testing.B) {
	store := testutil.OpenStore(b, markers.HostGraph)
	ea := startExecAgent(b, func(o *hostagent.ExecutorOptions) { o.Store = store.Store })
	clients := []*gossh.Client{ea.client}
	for len(clients) < 8 {
		clients = append(clients, ea.dial())
	}
	before := store.Stats()
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
	after := store.Stats()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "execs/s")
	b.ReportMetric(float64(after.Commits-before.Commits)/float64(b.N), "fsyncs/exec")
}

// TestStartFailureIsFinal: a command that cannot start (its cwd is missing) ends in
// start_failed with the real cause, exits 255 without running, and the same execution id
// sent again is answered from the marker — it is not tried again.
func TestStartFailureIsFinal(t *testing.T) {
	store := testutil.OpenStore(t, markers.HostGraph)
	ea := startExecAgent(t, func(o *hostagent.ExecutorOptions) { o.Store = store.Store })
	effects := filepath.Join(t.TempDir(), "effects")
	id, _ := markers.NewExecutionID(time.Now())
	const cwd = "/nonexistent/postern-driver"
	for attempt := range 2 {
		var stderr strings.Builder
		res, err := hostproto.Run(context.Background(), ea.client, hostproto.Exec{ExecutionID: id, Command: "echo ran >> " + effects, Cwd: cwd, Stderr: &stderr})
		if err != nil || res.ExitStatus != hostproto.ExitRefused || res.Final == nil {
			t.Fatalf("attempt %d: exec = %+v, %v; want 255 with a final marker", attempt, res, err)
		}
		m := res.Final.Marker
		want := "cwd " + cwd + " does not exist"
		if m.State != hostproto.MarkerStartFailed || m.StartError != want || !strings.Contains(stderr.String(), want) {
			t.Errorf("attempt %d: marker %s (%q), stderr %q; want start_failed: %q", attempt, m.State, m.StartError, stderr.String(), want)
		}
		if strings.Contains(stderr.String(), "/bin/") {
			t.Errorf("attempt %d: stderr %q blames the shell", attempt, stderr.String())
		}
	}
	if _, err := os.Stat(effects); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran")
	}
	events, err := store.Events(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 {
		t.Errorf("%d marker events; want 2 (created, start_failed): the second request must not restart it", len(events))
	}
}
