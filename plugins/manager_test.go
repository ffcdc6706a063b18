package plugins_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/plugins"
)

const secret = "plugin-secret-5d1c9e"

// pluginBinary is the real postern-plugin-http, built once for the package's tests.
var pluginBinary string

func TestMain(m *testing.M) {
	if os.Getenv(hostHelperEnv) != "" {
		os.Exit(runHostHelper())
	}
	os.Exit(run(m))
}

// hostHelperEnv makes the test binary act as a bastion: it starts the plugin named by the
// variable's value, prints the plugin's pid and waits to be killed.
const hostHelperEnv = "POSTERN_TEST_PLUGIN_HOST"

func runHostHelper() int {
	path := os.Getenv(hostHelperEnv)
	sum, err := plugins.FileSHA256(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := plugins.NewManager(plugins.ManagerOptions{Path: path, SHA256: sum})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// An action the plugin refuses before dialing: enough to start it.
	if _, err := m.Perform(context.Background(), plugins.HTTPAction{ExecutionID: "ex_helper", Method: "GET", URL: "ftp://x/"}, &hostJournal{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("pid %d\n", m.PID())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test kills us
	return 0
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "postern-plugin-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	pluginBinary = filepath.Join(dir, "postern-plugin-http")
	build := exec.Command("go", "build", "-o", pluginBinary, "github.com/postern-dev/postern/cmd/postern-plugin-http")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the plugin:", err)
		return 1
	}
	return m.Run()
}

// hostJournal records journal calls made by the plugin over the broker.
type hostJournal struct {
	failDispatched error

	mu     sync.Mutex
	events []string
}

func (j *hostJournal) add(e string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, e)
}

func (j *hostJournal) kinds() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return strings.Join(j.events, ",")
}

func (j *hostJournal) Dispatched(_ context.Context, id string) error {
	if j.failDispatched != nil {
		return j.failDispatched
	}
	j.add("dispatched")
	return nil
}

func (j *hostJournal) Completed(_ context.Context, id string, resp plugins.HTTPResponse) error {
	j.add(fmt.Sprintf("completed:%d", resp.Status))
	return nil
}

func (j *hostJournal) Failed(_ context.Context, id, reason string) error {
	j.add("failed")
	return nil
}

func (j *hostJournal) Unknown(_ context.Context, id, reason string) error {
	j.add("unknown")
	return nil
}

// newManager starts a manager on the real plugin binary at path. When the test ends it closes
// the manager and fails the test if the secret appears in any log line.
func newManager(t *testing.T, path string) (*plugins.Manager, *testutil.LockedBuffer) {
	t.Helper()
	sum, err := plugins.FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.LockedBuffer{}
	m, err := plugins.NewManager(plugins.ManagerOptions{
		Path:   path,
		SHA256: sum,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		_ = m.Close()
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the secret appears in the logs:\n%s", logs.String())
		}
	})
	return m, logs
}

func httpAction(id, url string) plugins.HTTPAction {
	return plugins.HTTPAction{
		ExecutionID:      id,
		Method:           http.MethodPost,
		URL:              url,
		Body:             []byte(`{"n":1}`),
		Credential:       &plugins.Credential{Kind: plugins.CredentialBearer, Secret: secret},
		Timeout:          30 * time.Second,
		MaxResponseBytes: 1 << 16,
		KeepHeaders:      []string{"X-Request-Id"},
	}
}

func TestManagerPerformEndToEnd(t *testing.T) {
	journal := &hostJournal{}
	type arrival struct{ journal, key, auth string }
	arrivals := make(chan arrival, 2)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrivals <- arrival{journal.kinds(), r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization")}
		w.Header().Set("X-Request-Id", "r-7")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, "accepted")
	}))
	t.Cleanup(target.Close)
	m, logs := newManager(t, pluginBinary)
	if pid := m.PID(); pid != 0 {
		t.Errorf("PID before the first Perform = %d; want 0", pid)
	}

	out, err := m.Perform(context.Background(), httpAction("ex_e2e", target.URL), journal)
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	got := <-arrivals
	if want := (arrival{"dispatched", `"ex_e2e"`, "Bearer " + secret}); got != want {
		t.Errorf("at the target: %+v; want %+v", got, want)
	}
	if out.State != plugins.StateCompleted || out.Response.Status != http.StatusAccepted ||
		string(out.Response.Body) != "accepted" || out.Response.Header["X-Request-Id"][0] != "r-7" {
		t.Errorf("outcome = %+v, response %+v; want completed 202 accepted with X-Request-Id", out, out.Response)
	}
	if k := journal.kinds(); k != "dispatched,completed:202" {
		t.Errorf("journal = %q; want dispatched,completed:202", k)
	}

	pid := m.PID()
	if pid == 0 {
		t.Fatal("PID = 0 after a Perform; want the running plugin")
	}
	if _, err := m.Perform(context.Background(), httpAction("ex_e2e_2", target.URL), &hostJournal{}); err != nil {
		t.Fatalf("second Perform: %v", err)
	}
	<-arrivals
	if again := m.PID(); again != pid {
		t.Errorf("second Perform ran on pid %d; want the same plugin %d", again, pid)
	}
	// The plugin's own log lines reach the manager's logger, so the secret check covers them.
	if !strings.Contains(logs.String(), "http action completed") {
		t.Errorf("the plugin's log lines did not reach the manager's logger:\n%s", logs.String())
	}
}

func TestManagerJournalRefusesDispatched(t *testing.T) {
	var hits int
	var mu sync.Mutex
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	t.Cleanup(target.Close)
	m, _ := newManager(t, pluginBinary)
	journal := &hostJournal{failDispatched: errors.New("journal is read-only")}
	out, err := m.Perform(context.Background(), httpAction("ex_refused", target.URL), journal)
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	if out.State != plugins.StateFailed || !strings.Contains(out.Reason, "journal is read-only") {
		t.Errorf("outcome = %s %q; want failed naming the journal error", out.State, out.Reason)
	}
	if k := journal.kinds(); k != "failed" {
		t.Errorf("journal = %q; want failed", k)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Errorf("target saw %d requests; want 0", hits)
	}
}

func TestManagerChecksumMismatch(t *testing.T) {
	sum, err := plugins.FileSHA256(pluginBinary)
	if err != nil {
		t.Fatal(err)
	}
	wrong := strings.Repeat("ab", 32)
	_, err = plugins.NewManager(plugins.ManagerOptions{Path: pluginBinary, SHA256: wrong})
	if !errors.Is(err, plugins.ErrChecksumMismatch) || !strings.Contains(err.Error(), sum) || !strings.Contains(err.Error(), wrong) {
		t.Errorf("NewManager with a wrong sum: err = %v; want ErrChecksumMismatch naming %s and %s", err, sum, wrong)
	}

	// A binary replaced after the manager was configured is refused at start.
	path := filepath.Join(t.TempDir(), "postern-plugin-http")
	copyFile(t, pluginBinary, path)
	m, _ := newManager(t, path)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write([]byte("tampered"))
	_ = f.Close()
	journal := &hostJournal{}
	_, err = m.Perform(context.Background(), httpAction("ex_tampered", "http://127.0.0.1:1/"), journal)
	if !errors.Is(err, plugins.ErrChecksumMismatch) || !strings.Contains(err.Error(), sum) {
		t.Errorf("Perform on a tampered binary: err = %v; want ErrChecksumMismatch naming the configured sum", err)
	}
	if pid := m.PID(); pid != 0 {
		t.Errorf("PID = %d after a refused start; want 0", pid)
	}
	if k := journal.kinds(); k != "" {
		t.Errorf("journal = %q; want nothing", k)
	}
}

func TestManagerInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opts plugins.ManagerOptions
		want string
	}{
		{name: "no path", opts: plugins.ManagerOptions{SHA256: strings.Repeat("00", 32)}, want: "Path is empty"},
		{name: "short sum", opts: plugins.ManagerOptions{Path: pluginBinary, SHA256: "abc"}, want: "not a hex SHA-256"},
		{name: "missing binary", opts: plugins.ManagerOptions{Path: "/nonexistent/plugin", SHA256: strings.Repeat("00", 32)}, want: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := plugins.NewManager(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v; want one containing %q", err, tt.want)
			}
		})
	}
}

func TestManagerPluginKilledMidRequest(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(target.Close)
	t.Cleanup(func() { close(release) })
	m, _ := newManager(t, pluginBinary)

	journal := &hostJournal{}
	type result struct {
		out plugins.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := m.Perform(context.Background(), httpAction("ex_killed", target.URL+"/hold"), journal)
		done <- result{out, err}
	}()
	select {
	case <-arrived:
	case r := <-done:
		t.Fatalf("Perform returned before the target held the request: %+v, %v", r.out, r.err)
	case <-time.After(60 * time.Second):
		t.Fatal("the request never reached the target")
	}
	pid := m.PID()
	if pid == 0 {
		t.Fatal("PID = 0 during a request")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill plugin %d: %v", pid, err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Perform did not return after the plugin was killed")
	}
	t.Logf("Perform after SIGKILL: %v", r.err)
	if !errors.Is(r.err, plugins.ErrPluginCrashed) {
		t.Errorf("Perform after SIGKILL: err = %v; want ErrPluginCrashed", r.err)
	}
	// The journal says what the caller must conclude: dispatched, no terminal point → unknown.
	if k := journal.kinds(); k != "dispatched" {
		t.Errorf("journal = %q; want dispatched only", k)
	}

	out, err := m.Perform(context.Background(), httpAction("ex_after_crash", target.URL+"/ok"), &hostJournal{})
	if err != nil || out.State != plugins.StateCompleted {
		t.Fatalf("Perform after the crash = %+v, %v; want completed", out, err)
	}
	if newPID := m.PID(); newPID == 0 || newPID == pid {
		t.Errorf("plugin pid after restart = %d; want a new process (old %d)", newPID, pid)
	}
}

func TestManagerClose(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(target.Close)
	m, _ := newManager(t, pluginBinary)
	if _, err := m.Perform(context.Background(), httpAction("ex_close", target.URL), &hostJournal{}); err != nil {
		t.Fatalf("Perform: %v", err)
	}
	pid := m.PID()
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Kill waits for the process, so it is gone (signal 0 reports ESRCH).
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("plugin %d after Close: kill -0 = %v; want ESRCH", pid, err)
	}
	if _, err := m.Perform(context.Background(), httpAction("ex_closed", target.URL), &hostJournal{}); err == nil {
		t.Error("Perform after Close succeeded; want an error")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// processGone reports whether pid no longer runs (absent, or a zombie nobody reaped yet).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the parenthesized command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z'
	}
	return false
}

func TestPluginDiesWithTheBastion(t *testing.T) {
	host := exec.Command(os.Args[0], "-test.run=^$")
	host.Env = append(os.Environ(), hostHelperEnv+"="+pluginBinary)
	stdin, err := host.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close() })
	var stdout bytes.Buffer
	pr, pw := io.Pipe()
	host.Stdout = pw
	host.Stderr = os.Stderr
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })
	lines := make(chan string, 1)
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := pr.Read(buf)
			stdout.Write(buf[:n])
			if i := bytes.IndexByte(stdout.Bytes(), '\n'); i >= 0 {
				lines <- stdout.String()[:i]
				return
			}
			if err != nil {
				lines <- ""
				return
			}
		}
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(60 * time.Second):
		t.Fatal("the helper bastion never reported its plugin's pid")
	}
	var pid int
	if _, err := fmt.Sscanf(line, "pid %d", &pid); err != nil || pid == 0 {
		t.Fatalf("helper said %q; want \"pid N\"", line)
	}
	if err := host.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	_ = pw.Close()
	defer func() {
		if !processGone(pid) { // the wait failed: leave no plugin behind
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	testutil.WaitFor(t, fmt.Sprintf("plugin %d to exit after its bastion was killed", pid), func() bool { return processGone(pid) })
}

func TestManagerConcurrentPerforms(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(target.Close)
	m, _ := newManager(t, pluginBinary)
	const callers = 16
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("ex_c%02d", i)
			journal := &hostJournal{}
			out, err := m.Perform(context.Background(), httpAction(id, target.URL), journal)
			switch {
			case err != nil:
				errs <- fmt.Errorf("%s: %w", id, err)
			case string(out.Response.Body) != `"`+id+`"`:
				errs <- fmt.Errorf("%s: target saw key %s", id, out.Response.Body)
			case journal.kinds() != "dispatched,completed:200":
				errs <- fmt.Errorf("%s: journal %q", id, journal.kinds())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestManagerLargeBodies(t *testing.T) {
	const size = 6 << 20 // above gRPC's default 4 MiB message limit, both ways
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Received", fmt.Sprint(n))
		_, _ = w.Write(bytes.Repeat([]byte("r"), size))
	}))
	t.Cleanup(target.Close)
	m, _ := newManager(t, pluginBinary)
	a := httpAction("ex_large", target.URL)
	a.Body = bytes.Repeat([]byte("q"), size)
	a.MaxResponseBytes = 8 << 20
	a.KeepHeaders = []string{"X-Received"}
	out, err := m.Perform(context.Background(), a, &hostJournal{})
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	if got := out.Response.Header["X-Received"]; len(got) != 1 || got[0] != fmt.Sprint(size) {
		t.Errorf("target received %v bytes; want %d", got, size)
	}
	if len(out.Response.Body) != size || out.Response.BodyTruncated {
		t.Errorf("response body %d bytes, truncated %v; want %d, not truncated", len(out.Response.Body), out.Response.BodyTruncated, size)
	}
}

func TestManagerCallerCancels(t *testing.T) {
	arrived := make(chan struct{}, 1)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server notice the client going away (r.Context ends).
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/hold" {
			arrived <- struct{}{}
			<-r.Context().Done()
		}
	}))
	t.Cleanup(target.Close)
	m, _ := newManager(t, pluginBinary)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	journal := &hostJournal{}
	done := make(chan error, 1)
	go func() {
		_, err := m.Perform(ctx, httpAction("ex_cancel", target.URL+"/hold"), journal)
		done <- err
	}()
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatal("the request never reached the target")
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Perform did not return after its context was canceled")
	}
	if !errors.Is(err, context.Canceled) || errors.Is(err, plugins.ErrPluginCrashed) {
		t.Errorf("err = %v; want context.Canceled, not a crash", err)
	}
	// Perform has returned, so the journal is final: dispatched, and no later point arrives.
	if k := journal.kinds(); k != "dispatched" {
		t.Errorf("journal = %q; want dispatched", k)
	}
	pid := m.PID()
	if _, err := m.Perform(context.Background(), httpAction("ex_after_cancel", target.URL+"/ok"), &hostJournal{}); err != nil {
		t.Fatalf("Perform after a canceled call: %v", err)
	}
	if again := m.PID(); again != pid {
		t.Errorf("pid changed from %d to %d after a cancel; want the same plugin", pid, again)
	}
}
