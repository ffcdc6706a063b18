package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/procfs"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

func TestMain(m *testing.M) {
	switch testutil.Role() {
	case holdConnsRole:
		count, _ := strconv.Atoi(os.Getenv("POSTERN_TEST_COUNT"))
		holdControlConnections(os.Getenv("POSTERN_TEST_SOCKET"), count)
		os.Exit(0)
	case roleSoakClient:
		os.Exit(runSoakClientProcess())
	}
	code := m.Run()
	harness.CleanupBinaries()
	cleanupPrevious()
	os.Exit(code)
}

func newID(t testing.TB) string {
	t.Helper()
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

type outcome struct {
	stdout, stderr string
	res            hostproto.Result
	err            error
}

func execOn(t testing.TB, c *gossh.Client, x hostproto.Exec) outcome {
	t.Helper()
	var stdout, stderr bytes.Buffer
	x.Stdout, x.Stderr = &stdout, &stderr
	res, err := hostproto.Run(context.Background(), c, x)
	return outcome{stdout.String(), stderr.String(), res, err}
}

// execInBackground starts x and returns once its first marker arrived (the command runs);
// wait returns the outcome.
func execInBackground(t testing.TB, c *gossh.Client, x hostproto.Exec) (wait func() outcome) {
	t.Helper()
	started := make(chan struct{})
	var once sync.Once
	x.OnMarker = func(hostproto.MarkerMessage) { once.Do(func() { close(started) }) }
	done := make(chan outcome, 1)
	go func() { done <- execOn(t, c, x) }()
	select {
	case <-started:
	case got := <-done:
		t.Fatalf("exec ended before its marker arrived: %+v", got)
	}
	return func() outcome { return <-done }
}

// ranOnce checks that the command's side effect (one line appended to effects) happened
// exactly once.
func ranOnce(t testing.TB, effects string) {
	t.Helper()
	if n := lines(t, effects); n != 1 {
		t.Errorf("side effect happened %d times; want 1", n)
	}
}

func lines(t testing.TB, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func TestExecUnderMarker(t *testing.T) {
	h := harness.StartHostagent(t)
	c := h.Dial(t)
	id := newID(t)
	got := execOn(t, c, hostproto.Exec{ExecutionID: id, Command: "echo out; echo err >&2; exit 3", Fingerprint: "hmac-sha256:abc"})
	if got.err != nil || got.res.ExitStatus != 3 || got.stdout != "out\n" || got.stderr != "err\n" {
		t.Fatalf("exec = %+v; want exit 3, out, err", got)
	}
	first, final := got.res.First, got.res.Final
	if first == nil || first.Replayed || first.Marker.State != hostproto.MarkerStarted || first.Marker.Fingerprint != "hmac-sha256:abc" {
		t.Errorf("first marker = %+v; want a fresh started marker carrying the fingerprint", first)
	}
	if final == nil || final.Marker.State != hostproto.MarkerExited || *final.Marker.ExitCode != 3 || final.Marker.Output.StdoutBytes != 4 || final.Marker.PID == 0 {
		t.Errorf("final marker = %+v; want exited 3 with output sizes and pid", final)
	}
}

func TestSameIDRunsOnce(t *testing.T) {
	h := harness.StartHostagent(t)
	c := h.Dial(t)
	effects := filepath.Join(t.TempDir(), "effects")
	id := newID(t)
	cmd := "echo applied >> " + effects + "; echo migrated; exit 5"
	first := execOn(t, c, hostproto.Exec{ExecutionID: id, Command: cmd})
	second := execOn(t, c, hostproto.Exec{ExecutionID: id, Command: cmd})
	for i, got := range []outcome{first, second} {
		if got.err != nil || got.res.ExitStatus != 5 || got.stdout != "migrated\n" {
			t.Errorf("run %d = %+v; want exit 5 and the output", i+1, got)
		}
	}
	if !second.res.Replayed() || !strings.Contains(second.stderr, "already ran") {
		t.Errorf("second run: replayed=%v stderr=%q; want a replay", second.res.Replayed(), second.stderr)
	}
	ranOnce(t, effects)
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	h := harness.StartHostagent(t)
	effects := filepath.Join(t.TempDir(), "effects")
	id := newID(t)
	cmd := "echo applied >> " + effects + "; sleep 0.5; echo done"
	const n = 50
	clients := make([]*gossh.Client, 5)
	for i := range clients {
		clients[i] = h.Dial(t)
	}
	results := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = execOn(t, clients[i%len(clients)], hostproto.Exec{ExecutionID: id, Command: cmd}) })
	}
	wg.Wait()
	replayed := 0
	for i, got := range results {
		if got.err != nil || got.res.ExitStatus != 0 || got.stdout != "done\n" {
			t.Errorf("call %d = %+v; want exit 0 and the output", i, got)
		}
		if got.res.Replayed() {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d calls attached or replayed; want %d", replayed, n-1)
	}
	ranOnce(t, effects)
}

func TestClientDisconnectDoesNotStopCommand(t *testing.T) {
	h := harness.StartHostagent(t)
	effects := filepath.Join(t.TempDir(), "effects")
	id := newID(t)
	cmd := "sleep 1; echo applied >> " + effects + "; echo finished"
	ctx, cancel := context.WithCancel(context.Background())
	c := h.Dial(t)
	_, err := hostproto.Run(ctx, c, hostproto.Exec{ExecutionID: id, Command: cmd, OnMarker: func(hostproto.MarkerMessage) { cancel(); c.Close() }})
	if err == nil {
		t.Fatal("run survived the dropped connection")
	}
	testutil.WaitFor(t, "the command to finish", func() bool { return lines(t, effects) == 1 })
	again := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: cmd})
	if again.err != nil || again.res.ExitStatus != 0 || again.stdout != "finished\n" || !again.res.Replayed() {
		t.Fatalf("re-issue = %+v; want the replayed result", again)
	}
	ranOnce(t, effects)
}

func TestHostagentKilledMidCommand(t *testing.T) {
	h := harness.StartHostagent(t)
	effects := filepath.Join(t.TempDir(), "effects")
	id := newID(t)
	cmd := "sleep 2; echo applied >> " + effects + "; echo done; exit 7"
	waitFirst := execInBackground(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: cmd})
	h.Kill(t)
	first := waitFirst()
	if !errors.Is(first.err, hostproto.ErrExitMissing) {
		t.Fatalf("first run after the kill: %v; want ErrExitMissing", first.err)
	}
	h.Start(t)
	again := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: cmd})
	if again.err != nil || again.res.ExitStatus != 7 || again.stdout != "done\n" || !again.res.Replayed() {
		t.Fatalf("re-issue after restart = %+v; want exit 7 from the re-adopted command", again)
	}
	if fm := again.res.Final; fm == nil || fm.Marker.State != hostproto.MarkerExited || *fm.Marker.ExitCode != 7 {
		t.Errorf("final marker = %+v; want exited 7", fm)
	}
	ranOnce(t, effects)
}

// TestSupervisorKilledCommandsFinish: a command whose supervisor is killed runs on; its
// keeper records its real exit and all its output (more than a pipe holds), and a re-issue
// replays that — no unknown outcome. A cancel after the supervisor died still ends a
// command, as cancelled.
func TestSupervisorKilledCommandsFinish(t *testing.T) {
	h := harness.StartHostagent(t)
	c := h.Dial(t)
	effects := filepath.Join(t.TempDir(), "effects")
	id, cancelled := newID(t), newID(t)
	cmd := "echo begun; sleep 1; head -c 200000 /dev/zero | tr '\\0' x; echo applied >> " + effects + "; exit 7"
	waitFirst := execInBackground(t, c, hostproto.Exec{ExecutionID: id, Command: cmd})
	waitCancelled := execInBackground(t, c, hostproto.Exec{ExecutionID: cancelled, Command: "echo begun; sleep 30"})
	for _, x := range []string{id, cancelled} {
		testutil.WaitFor(t, "the command to run", func() bool {
			out, _ := os.ReadFile(filepath.Join(h.DataDir, "spool", x, supervisor.StdoutFile))
			return string(out) == "begun\n"
		})
	}
	supervisorPID := readSupervisorPID(t, filepath.Join(h.DataDir, "spool", id))
	if exe, _ := os.Readlink("/proc/" + strconv.Itoa(supervisorPID) + "/exe"); filepath.Base(exe) != hostagent.SupervisorBinary {
		t.Errorf("the supervisor runs %q; want the dedicated %s next to the agent", exe, hostagent.SupervisorBinary)
	}
	if err := syscall.Kill(supervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	want := "begun\n" + strings.Repeat("x", 200000)
	first := waitFirst()
	if first.err != nil || first.res.ExitStatus != 7 || first.stdout != want {
		t.Fatalf("attached run = exit %d, %d bytes of stdout, %v; want exit 7 and all %d bytes", first.res.ExitStatus, len(first.stdout), first.err, len(want))
	}
	if fm := first.res.Final; fm == nil || fm.Marker.State != hostproto.MarkerExited || *fm.Marker.ExitCode != 7 {
		t.Errorf("final marker = %+v; want exited 7", fm)
	}
	again := execOn(t, c, hostproto.Exec{ExecutionID: id, Command: cmd})
	if again.res.ExitStatus != 7 || again.stdout != want || !again.res.Replayed() {
		t.Errorf("re-issue = exit %d, %d bytes, replayed %v; want the replayed result", again.res.ExitStatus, len(again.stdout), again.res.Replayed())
	}
	ranOnce(t, effects)

	cc, err := hostproto.DialControl(c)
	if err != nil {
		t.Fatalf("DialControl: %v", err)
	}
	defer cc.Close()
	rec, err := cc.Cancel(context.Background(), cancelled)
	if err != nil || rec.State != hostproto.MarkerCancelled {
		t.Fatalf("cancel after the supervisor died = %+v, %v; want cancelled", rec, err)
	}
	if got := waitCancelled(); got.res.ExitStatus != 128+int(syscall.SIGTERM) || got.stdout != "begun\n" {
		t.Errorf("cancelled run = %+v; want 143 after the output", got)
	}
}

// readSupervisorPID waits for the supervisor record of an execution's spool dir and returns
// the supervisor's pid.
func readSupervisorPID(t testing.TB, spool string) int {
	t.Helper()
	var rec struct {
		PID int `json:"pid"`
	}
	testutil.WaitFor(t, "the supervisor record", func() bool {
		b, err := os.ReadFile(filepath.Join(spool, supervisor.SupervisorFile))
		return err == nil && json.Unmarshal(b, &rec) == nil && rec.PID > 0
	})
	return rec.PID
}

func TestOperationKey(t *testing.T) {
	tests := []struct {
		name        string
		config      string
		firstCmd    string
		wantSecond  int
		wantStderr  string
		wantEffects int
	}{
		{"second id refused", "", "echo x >> EFFECTS", 253, "belongs to", 1},
		{"failed first is not retried by default", "", "echo x >> EFFECTS; exit 1", 253, "belongs to", 1},
		{"failed first retried when allowed", "retry_failed_operations = true", "echo x >> EFFECTS; exit 1", 0, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := harness.StartHostagent(t, tt.config)
			c := h.Dial(t)
			effects := filepath.Join(t.TempDir(), "effects")
			first := execOn(t, c, hostproto.Exec{ExecutionID: newID(t), OperationKey: "migration:2026_07_22", Command: strings.ReplaceAll(tt.firstCmd, "EFFECTS", effects)})
			if first.err != nil {
				t.Fatal(first.err)
			}
			second := execOn(t, c, hostproto.Exec{ExecutionID: newID(t), OperationKey: "migration:2026_07_22", Command: "echo x >> " + effects})
			if second.res.ExitStatus != tt.wantSecond || !strings.Contains(second.stderr, tt.wantStderr) {
				t.Errorf("second = %+v; want exit %d mentioning %q", second, tt.wantSecond, tt.wantStderr)
			}
			if n := lines(t, effects); n != tt.wantEffects {
				t.Errorf("side effects = %d; want %d", n, tt.wantEffects)
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	h := harness.StartHostagent(t)
	got := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: newID(t), Command: "trap '' TERM; sleep 30", Timeout: time.Second})
	if got.res.ExitStatus != 124 || got.res.Final == nil || got.res.Final.Marker.State != hostproto.MarkerTimedOut {
		t.Fatalf("exec = %+v; want 124 and a timed_out marker", got)
	}
}

func TestOpenSSHClient(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("OpenSSH client not installed (apt-get install openssh-client)")
	}
	h := harness.StartHostagent(t)
	dir := t.TempDir()
	knownHosts := testutil.WriteKnownHosts(t, filepath.Join(dir, "known_hosts"), h.Addr, h.HostKey)
	identity := h.ClientKey.WritePrivateKey(t, filepath.Join(dir, "id"))
	_, port, _ := strings.Cut(h.Addr, ":")
	effects := filepath.Join(dir, "effects")
	ssh := func(env string, command string) (string, string, int) {
		args := append(testutil.OpenSSHArgs(knownHosts, identity, port), "-o", "SetEnv="+env, h.Account+"@127.0.0.1", command)
		cmd := exec.Command("ssh", args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			code = exitErr.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	id := newID(t)
	for i := range 2 {
		out, errOut, code := ssh("POSTERN_EXECUTION_ID="+id, "echo applied >> "+effects+"; echo hi; exit 4")
		if out != "hi\n" || code != 4 {
			t.Errorf("run %d: stdout %q, exit %d, stderr %q; want hi and 4", i+1, out, code, errOut)
		}
		if i == 1 && !strings.Contains(errOut, "already ran") {
			t.Errorf("second run stderr %q; want the replay notice", errOut)
		}
	}
	ranOnce(t, effects)
	if _, errOut, code := ssh("LANG=C", "true"); code != 255 || !strings.Contains(errOut, "POSTERN_EXECUTION_ID") {
		t.Errorf("without an id: exit %d, stderr %q; want 255 and the reason", code, errOut)
	}
	if _, _, code := ssh("POSTERN_EXECUTION_ID=ex_bogus", "true"); code != 255 {
		t.Errorf("with a bad id: exit %d; want 255", code)
	}
}

func TestCheckpointsFromTheCommand(t *testing.T) {
	h := harness.StartHostagent(t)
	bin := harness.Binary(t, "postern-hostagent")
	cmd := bin + ` marker checkpoint "schema applied" && ` + bin + ` marker validated && echo ok`
	got := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: newID(t), Command: cmd})
	if got.err != nil || got.res.ExitStatus != 0 || got.stdout != "ok\n" {
		t.Fatalf("exec = %+v; want exit 0", got)
	}
	final := got.res.Final.Marker
	if len(final.Checkpoints) != 1 || final.Checkpoints[0].Note != "schema applied" || !final.Validated {
		t.Errorf("final marker checkpoints %+v validated %v; want the checkpoint and validated", final.Checkpoints, final.Validated)
	}
	// A process outside the execution cannot report for it.
	out, err := exec.Command(bin, "marker", "checkpoint", "forged").CombinedOutput()
	if err == nil {
		t.Errorf("checkpoint without an execution succeeded: %s", out)
	}
}

func TestControlOverSSH(t *testing.T) {
	h := harness.StartHostagent(t)
	c := h.Dial(t)
	ctx := context.Background()
	id := newID(t)
	waitAttached := execInBackground(t, c, hostproto.Exec{ExecutionID: id, Command: "echo begun; sleep 30"})
	cc, err := hostproto.DialControl(c)
	if err != nil {
		t.Fatalf("DialControl: %v", err)
	}
	defer cc.Close()
	testutil.WaitFor(t, "the marker to be running", func() bool {
		found, _, err := cc.Status(ctx, []string{id})
		return err == nil && len(found) == 1 && found[0].State == hostproto.MarkerRunning
	})
	running, _, err := cc.List(ctx, hostproto.ControlListQuery{State: hostproto.MarkerRunning})
	if err != nil || len(running) != 1 || running[0].ID != id {
		t.Fatalf("list running = %v, %v; want %s", running, err, id)
	}
	rec, err := cc.Cancel(ctx, id)
	if err != nil || rec.State != hostproto.MarkerCancelled {
		t.Fatalf("cancel = %+v, %v; want cancelled", rec, err)
	}
	attached := waitAttached()
	if attached.res.ExitStatus != 128+int(syscall.SIGTERM) || attached.stdout != "begun\n" {
		t.Errorf("attached run = %+v; want 143 after the output", attached)
	}
	var out bytes.Buffer
	if _, err := cc.Attach(ctx, id, 0, 0, func(stream string, _ int64, data []byte) error {
		if stream == "stdout" {
			out.Write(data)
		}
		return nil
	}); err != nil || out.String() != "begun\n" {
		t.Errorf("attach after the end = %q, %v; want the stored output", out.String(), err)
	}
	var export bytes.Buffer
	if _, err := cc.Export(ctx, &export); err != nil {
		t.Fatal(err)
	}
	vkey, err := os.ReadFile(filepath.Join(h.DataDir, "audit.key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := markers.VerifyJSONL(&export, string(vkey), markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.Events < 3 {
		t.Errorf("verify export = %v, %v; want PASS", rep, err)
	}
}

func TestMarkersCLI(t *testing.T) {
	h := harness.StartHostagent(t)
	id := newID(t)
	if got := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: "echo hello"}); got.err != nil {
		t.Fatal(got.err)
	}
	bin := harness.Binary(t, "postern-hostagent")
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append(args, "--config", h.ConfigPath)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, out, stderr.String())
		}
		return string(out)
	}
	for _, agentUp := range []bool{true, false} {
		if !agentUp {
			h.Kill(t)
		}
		if out := cli("markers", "list"); !strings.Contains(out, id) || !strings.Contains(out, "exited") {
			t.Errorf("agent up %v: markers list = %q; want %s exited", agentUp, out, id)
		}
		if out := cli("markers", "show", id, "--json"); !strings.Contains(out, `"exit_code": 0`) && !strings.Contains(out, `"exit_code":0`) {
			t.Errorf("agent up %v: markers show = %q; want the exit code", agentUp, out)
		}
		if out := cli("markers", "verify"); !strings.Contains(out, "PASS") {
			t.Errorf("agent up %v: markers verify = %q; want PASS", agentUp, out)
		}
	}
	if out := cli("markers", "tail", id); out != "hello\n" {
		t.Errorf("markers tail = %q; want the output", out)
	}
}

// TestNeverStartedRunsOnRetry: a marker left started with no supervisor record (the agent
// died between the marker write and the command's start) provably never ran; recovery marks it
// not_started, and a retry of the same command runs it once — a different command under
// that id is refused.
func TestNeverStartedRunsOnRetry(t *testing.T) {
	h := harness.StartHostagent(t)
	effects := filepath.Join(t.TempDir(), "effects")
	cmd := "echo applied >> " + effects
	shell := loginShell(t, h)
	h.Kill(t)
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(h.DataDir, "audit.key"), "unused")
	if err != nil {
		t.Fatal(err)
	}
	store, err := markers.Open(filepath.Join(h.DataDir, "markers"), markers.Options{Graph: markers.HostGraph, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	same, other := newID(t), newID(t)
	for _, id := range []string{same, other} {
		// Owned by the key the test logs in with, as the agent would have recorded it.
		owner := "key:" + gossh.FingerprintSHA256(h.ClientKey.Public())
		if _, err := store.Create(context.Background(), &markers.Record{ID: id, Account: h.Account, Actor: owner, Command: []string{shell, "-c", cmd}}); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()
	h.Start(t)
	c := h.Dial(t)
	got := execOn(t, c, hostproto.Exec{ExecutionID: same, Command: cmd})
	if got.res.ExitStatus != 0 || !strings.Contains(got.stderr, "never ran") || got.res.Final.Marker.State != hostproto.MarkerExited {
		t.Errorf("retry of the never-started execution = %+v; want it run now", got)
	}
	ranOnce(t, effects)
	if got := execOn(t, c, hostproto.Exec{ExecutionID: other, Command: "echo something else"}); got.res.ExitStatus != 255 || !strings.Contains(got.stderr, "another command") {
		t.Errorf("another command under a never-started id = %+v; want 255", got)
	}
}

// loginShell is the shell the agent runs commands with for its account.
func loginShell(t testing.TB, h *harness.Hostagent) string {
	t.Helper()
	got := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: newID(t), Command: "true"})
	if got.res.First == nil {
		t.Fatalf("no marker: %+v", got)
	}
	return got.res.First.Marker.Command[0]
}

// TestHarnessReapsDetachedCommands: a hostagent's test cleanup ends the commands its
// supervisor still runs (and their children) before the temp dir is removed, so nothing outlives the
// test or writes into a directory being deleted.
func TestHarnessReapsDetachedCommands(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Run("leaves a command running", func(t *testing.T) {
		h := harness.StartHostagent(t)
		c := h.Dial(t)
		// The grandchild writes its pid, then outlives the shell's exec window.
		execInBackground(t, c, hostproto.Exec{ExecutionID: newID(t), Command: "sleep 300 & echo $! > " + pidFile + "; wait"})
		testutil.WaitFor(t, "the command's child to start", func() bool { return lines(t, pidFile) == 1 })
	})
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	// Gone, or a zombie waiting for init to reap it.
	if st, err := procfs.ReadStat(pid); err == nil && st.State != 'Z' {
		t.Errorf("the command's child %d outlived its test: %+v", pid, st)
	}
}

// TestUpgradeKeepsCommandsRunning: a package upgrade replaces the binaries (by rename, as
// dpkg does) and restarts the agent while a command runs. The command goes on under the
// supervisor the old agent started, the new agent adopts it through that supervisor and
// starts its own for new commands; nothing runs twice.
func TestUpgradeKeepsCommandsRunning(t *testing.T) {
	installed := t.TempDir()
	install := func() {
		for _, name := range []string{"postern-hostagent", "postern-supervisor"} {
			data, err := os.ReadFile(harness.Binary(t, name))
			if err != nil {
				t.Fatal(err)
			}
			tmp := filepath.Join(installed, "."+name+".dpkg-new")
			if err := os.WriteFile(tmp, data, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(installed, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	install()
	h := harness.NewHostagent(t)
	h.Bin = filepath.Join(installed, "postern-hostagent")
	h.Start(t)
	effects := filepath.Join(t.TempDir(), "effects")
	proceed := filepath.Join(t.TempDir(), "proceed")
	id := newID(t)
	cmd := "while [ ! -e " + proceed + " ]; do sleep 0.05; done; echo applied >> " + effects + "; echo done; exit 6"
	waitFirst := execInBackground(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: cmd})
	oldSupervisor := readSupervisorPID(t, filepath.Join(h.DataDir, "spool", id))

	install() // the upgrade: new files under the same names
	h.Kill(t) // the unit restarts the agent (KillMode=process: the agent only)
	waitFirst()
	h.Start(t)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", oldSupervisor)); err != nil {
		t.Fatalf("the supervisor of the running command ended with the upgrade: %v", err)
	}
	freshID := newID(t)
	fresh := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: freshID, Command: "true"})
	if fresh.err != nil || fresh.res.ExitStatus != 0 {
		t.Fatalf("a new command after the upgrade = %+v", fresh)
	}
	if pid := readSupervisorPID(t, filepath.Join(h.DataDir, "spool", freshID)); pid == oldSupervisor {
		t.Errorf("the new agent ran a new command under the old release's supervisor %d", pid)
	}
	if err := os.WriteFile(proceed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	again := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: cmd})
	if again.err != nil || again.res.ExitStatus != 6 || again.stdout != "done\n" || !again.res.Replayed() {
		t.Fatalf("re-issue after the upgrade = %+v; want exit 6 from the adopted command", again)
	}
	ranOnce(t, effects)
}
