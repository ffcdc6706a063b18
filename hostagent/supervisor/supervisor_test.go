package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
	"github.com/postern-dev/postern/internal/testutil"
)

// shimTestEnv makes the test binary act as the supervisor when Start re-executes it.
const shimTestEnv = "POSTERN_SHIM_TEST"

// testPath is the PATH given to commands, whose environment is otherwise empty.
const testPath = "PATH=/usr/local/bin:/usr/bin:/bin"

// waitLimit bounds every wait in these tests; generous for a busy 2-core machine.
const waitLimit = 60 * time.Second

// connectRoleEnv makes the test binary a client of another user (TestSupervisorRefusesOtherUsers).
const connectRoleEnv = "POSTERN_SHIM_TEST_CONNECT"

func TestMain(m *testing.M) {
	if addr := os.Getenv(connectRoleEnv); addr != "" {
		os.Exit(connectAs(addr, os.Getenv("POSTERN_SHIM_TEST_DIR")))
	}
	if os.Getenv(shimTestEnv) == "1" && Invoked(os.Args) {
		os.Exit(Main(os.Args[2:]))
	}
	os.Setenv(shimTestEnv, "1")
	// Under -race every process sleeps 1s at exit by default; supervisors are processes too.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

func testExe(tb testing.TB) string {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("os.Executable: %v", err)
	}
	return exe
}

// testSupervisor returns a client of a supervisor of its own, which ends with the test.
func testSupervisor(tb testing.TB) *Client {
	tb.Helper()
	s, err := NewClient(testExe(tb), filepath.Join(tb.TempDir(), "supervisor"), slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// testSpec returns a spec running command with a minimal environment.
func testSpec(command string) Spec {
	return Spec{ExecutionID: "ex_test", Command: command, Env: []string{testPath}, KillGrace: 500 * time.Millisecond}
}

// startTest starts spec in a fresh spool directory and makes sure the execution is over when
// the test ends.
func startTest(tb testing.TB, spec Spec) (*Handle, string) {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "spool")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	h, err := testSupervisor(tb).Start(ctx, dir, spec)
	if err != nil {
		tb.Fatalf("Start(%q) = %v", spec.Command, err)
	}
	tb.Cleanup(func() {
		h.Cancel()
		waitStatus(tb, h)
	})
	return h, dir
}

// waitStatus waits (bounded) for h's outcome.
func waitStatus(tb testing.TB, h *Handle) (Status, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	st, err := h.Wait(ctx)
	if ctx.Err() != nil {
		tb.Fatalf("Wait did not return within %v", waitLimit)
	}
	return st, err
}

func mustWait(tb testing.TB, h *Handle) Status {
	tb.Helper()
	st, err := waitStatus(tb, h)
	if err != nil {
		tb.Fatalf("Wait = %v", err)
	}
	return st
}

// waitForOutput waits until the spooled stdout contains want.
func waitForOutput(tb testing.TB, dir, want string) {
	tb.Helper()
	testutil.WaitFor(tb, "output "+strconv.Quote(want), func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, StdoutFile))
		return strings.Contains(string(data), want)
	})
}

func readSpool(tb testing.TB, dir, name string) string {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		tb.Fatalf("read %s: %v", name, err)
	}
	return string(data)
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// gone reports whether pid no longer runs (absent, or a zombie nobody reaps).
func gone(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err != nil || st.State == 'Z'
}

func TestExitOutcomes(t *testing.T) {
	tests := []struct {
		name       string
		command    string
		wantCode   int
		wantSignal string
	}{
		{name: "success", command: "exit 0", wantCode: 0},
		{name: "failure", command: "exit 3", wantCode: 3},
		{name: "killed", command: "kill -KILL $$", wantCode: -1, wantSignal: "SIGKILL"},
		{name: "terminated", command: "kill -TERM $$", wantCode: -1, wantSignal: "SIGTERM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := startTest(t, testSpec(tt.command))
			st := mustWait(t, h)
			if st.Outcome != OutcomeExited || st.ExitCode != tt.wantCode || st.Signal != tt.wantSignal {
				t.Errorf("status = %s/%d/%q; want %s/%d/%q", st.Outcome, st.ExitCode, st.Signal, OutcomeExited, tt.wantCode, tt.wantSignal)
			}
			if st.ExecutionID != "ex_test" {
				t.Errorf("ExecutionID = %q; want ex_test", st.ExecutionID)
			}
			p := h.Process()
			if st.PID != p.PID || st.PIDStart != p.PIDStart || p.PID == 0 || p.SupervisorPID == 0 {
				t.Errorf("status pid %d/%d, process %+v; want matching non-zero pids", st.PID, st.PIDStart, p)
			}
			if st.StartedAt.IsZero() || st.EndedAt.Before(st.StartedAt) {
				t.Errorf("StartedAt %v EndedAt %v; want ordered non-zero times", st.StartedAt, st.EndedAt)
			}
			if got, err := ReadStatus(h.Dir()); err != nil || got.Outcome != st.Outcome {
				t.Errorf("ReadStatus = %+v, %v; want the waited status", got, err)
			}
		})
	}
}

func TestStreamsAreSeparated(t *testing.T) {
	h, dir := startTest(t, testSpec("printf 'to out\\n'; printf 'to err' >&2; printf 'more out\\n'"))
	st := mustWait(t, h)
	wantOut, wantErr := "to out\nmore out\n", "to err"
	if got := readSpool(t, dir, StdoutFile); got != wantOut {
		t.Errorf("stdout = %q; want %q", got, wantOut)
	}
	if got := readSpool(t, dir, StderrFile); got != wantErr {
		t.Errorf("stderr = %q; want %q", got, wantErr)
	}
	wantInfo := func(s string) StreamInfo {
		return StreamInfo{Bytes: int64(len(s)), Stored: int64(len(s)), SHA256: sha(s)}
	}
	if st.Stdout != wantInfo(wantOut) {
		t.Errorf("Stdout = %+v; want %+v", st.Stdout, wantInfo(wantOut))
	}
	if st.Stderr != wantInfo(wantErr) {
		t.Errorf("Stderr = %+v; want %+v", st.Stderr, wantInfo(wantErr))
	}
}

func TestOutputCapTruncatesButHashesEverything(t *testing.T) {
	const total, limit = 200000, 1000
	spec := testSpec("yes abcdefgh | head -c " + strconv.Itoa(total))
	spec.OutputCap = limit
	h, dir := startTest(t, spec)
	st := mustWait(t, h)
	full := strings.Repeat("abcdefgh\n", total/9+1)[:total]
	want := StreamInfo{Bytes: total, Stored: limit, Truncated: true, SHA256: sha(full)}
	if st.Stdout != want {
		t.Errorf("Stdout = %+v; want %+v", st.Stdout, want)
	}
	if got := readSpool(t, dir, StdoutFile); got != full[:limit] {
		t.Errorf("stored stdout = %d bytes %q...; want the first %d bytes", len(got), got[:min(len(got), 20)], limit)
	}
	if st.ExitCode != 0 {
		t.Errorf("ExitCode = %d; want 0 (the writer must not block or die at the cap)", st.ExitCode)
	}
}

func TestDirAndEnv(t *testing.T) {
	workDir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec(`pwd; echo "$GREETING"; echo "${` + shimTestEnv + `:-unset}" "${` + EnvSpoolDir + `:-unset}"`)
	spec.Dir = workDir
	spec.Env = append(spec.Env, "GREETING=hello world")
	h, dir := startTest(t, spec)
	mustWait(t, h)
	want := workDir + "\nhello world\nunset unset\n"
	if got := readSpool(t, dir, StdoutFile); got != want {
		t.Errorf("stdout = %q; want %q (cwd, given env, nothing inherited)", got, want)
	}
}

// TestSupervisorArgumentsNameNoExecution: every local user can read a process's arguments,
// so the supervisor's carry neither the spool directory nor the execution id.
func TestSupervisorArgumentsNameNoExecution(t *testing.T) {
	spec := testSpec("sleep 60")
	spec.ExecutionID = "ex_01J3Z5V8Q4K7M2N9P0R6S8ARGV"
	h, dir := startTest(t, spec)
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(h.Process().SupervisorPID) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if len(args) != 2 || args[1] != Subcommand {
		t.Errorf("supervisor arguments = %q; want the executable and %q only", args, Subcommand)
	}
	if strings.Contains(string(cmdline), dir) || strings.Contains(string(cmdline), spec.ExecutionID) {
		t.Errorf("supervisor arguments %q name the spool directory or the execution", args)
	}
}

func TestStartFailedNeverRuns(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	private := t.TempDir() // 0700, owned by this process's user
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	tests := []struct {
		name      string
		modify    func(spec *Spec)
		wantCause string // the start error names the real cause, never the shell for a cwd
	}{
		{name: "missing cwd", modify: func(s *Spec) { s.Dir = "/nonexistent/postern" },
			wantCause: "cwd /nonexistent/postern does not exist"},
		{name: "missing cwd as another user", modify: func(s *Spec) { s.Dir = "/nonexistent/postern"; s.Credential = nobody },
			wantCause: "cwd /nonexistent/postern does not exist"},
		{name: "cwd under a file", modify: func(s *Spec) { s.Dir = file + "/sub" },
			wantCause: "cwd " + file + "/sub does not exist (a parent is not a directory)"},
		{name: "cwd is a file", modify: func(s *Spec) { s.Dir = file },
			wantCause: "cwd " + file + " is not a directory"},
		{name: "cwd not accessible", modify: func(s *Spec) { s.Dir = private; s.Credential = nobody },
			wantCause: "cwd " + private + " is not accessible to uid 65534 (no search permission on "},
		{name: "missing shell", modify: func(s *Spec) { s.Shell = "/nonexistent/sh" },
			wantCause: "shell /nonexistent/sh does not exist"},
		{name: "shell not executable", modify: func(s *Spec) { s.Shell = file },
			wantCause: "shell " + file + " is not executable by uid "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if spec := (Spec{}); os.Geteuid() != 0 {
				if tt.modify(&spec); spec.Credential != nil {
					t.Skip("needs root to run a command as another user")
				}
			}
			witness := filepath.Join(t.TempDir(), "ran")
			spec := testSpec("touch " + witness)
			tt.modify(&spec)
			dir := filepath.Join(t.TempDir(), "spool")
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			h, err := testSupervisor(t).Start(ctx, dir, spec)
			var se *StartError
			if !errors.Is(err, ErrStartFailed) || !errors.As(err, &se) {
				t.Fatalf("Start = %v, %v; want a StartError", h, err)
			}
			if !strings.HasPrefix(se.Cause, tt.wantCause) {
				t.Errorf("cause = %q; want %q", se.Cause, tt.wantCause)
			}
			st, err := ReadStatus(dir)
			if err != nil || st.Outcome != OutcomeStartFailed || st.Error != se.Cause || st.PID != 0 {
				t.Errorf("ReadStatus = %+v, %v; want start_failed with the cause and no pid", st, err)
			}
			if _, err := os.Stat(witness); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("witness file: %v; want it absent (the command must not run)", err)
			}
			if _, err := os.Stat(filepath.Join(dir, ProcessFile)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("process record: %v; want none", err)
			}
			adopted, err := Adopt(dir)
			if err != nil {
				t.Fatalf("Adopt = %v", err)
			}
			if got := mustWait(t, adopted); got.Outcome != OutcomeStartFailed {
				t.Errorf("adopted Wait outcome = %s; want start_failed", got.Outcome)
			}
		})
	}
}

func TestSpoolDirRunsOnce(t *testing.T) {
	h, dir := startTest(t, testSpec("exit 0"))
	mustWait(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, err := testSupervisor(t).Start(ctx, dir, testSpec("exit 0")); !errors.Is(err, ErrAlreadyUsed) {
		t.Errorf("second Start in %s = %v; want ErrAlreadyUsed", dir, err)
	}
}

func TestInvalidSpec(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{name: "no command", spec: Spec{ExecutionID: "x"}, want: "command is empty"},
		{name: "no id", spec: Spec{Command: "true"}, want: "execution id is empty"},
		{name: "relative shell", spec: Spec{ExecutionID: "x", Command: "true", Shell: "sh"}, want: "not an absolute path"},
		{name: "negative timeout", spec: Spec{ExecutionID: "x", Command: "true", Timeout: -1}, want: "timeout"},
		{name: "huge command", spec: Spec{ExecutionID: "x", Command: strings.Repeat("x", maxCommandBytes+1)}, want: "command is longer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "spool")
			_, err := testSupervisor(t).Start(context.Background(), dir, tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start = %v; want an error mentioning %q", err, tt.want)
			}
			if _, err := Adopt(dir); !errors.Is(err, ErrNeverStarted) {
				t.Errorf("Adopt after invalid spec = %v; want ErrNeverStarted", err)
			}
		})
	}
}

// groupGone reports whether no live (non-zombie) process is left in process group pgid;
// zombies count for kill(2) but may linger if init does not reap them.
func groupGone(tb testing.TB, pgid int) bool {
	tb.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a pid
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.State != 'Z' && st.PGID == pgid {
			return false
		}
	}
	return true
}

func TestTimeoutEscalatesToKill(t *testing.T) {
	spec := testSpec("trap '' TERM; echo trapped; sleep 60; echo survived")
	spec.Timeout = 2 * time.Second
	spec.KillGrace = 300 * time.Millisecond
	h, dir := startTest(t, spec)
	st := mustWait(t, h)
	if st.Outcome != OutcomeTimedOut || st.ExitCode != -1 {
		t.Errorf("status = %s/%d; want timed_out/-1", st.Outcome, st.ExitCode)
	}
	out := readSpool(t, dir, StdoutFile)
	// Only once the trap is in place is the TERM ignored; on a very slow machine the shell
	// may still have died of the TERM itself.
	if out == "trapped\n" && st.Signal != "SIGKILL" {
		t.Errorf("Signal = %q; want SIGKILL for a command ignoring SIGTERM", st.Signal)
	}
	if strings.Contains(out, "survived") {
		t.Errorf("stdout = %q; the command outlived its timeout", out)
	}
	if !groupGone(t, h.Process().PID) {
		t.Errorf("process group %d still has members after the status was written", h.Process().PID)
	}
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name       string
		command    string
		wantSignal string
	}{
		{name: "obeys TERM", command: "echo ready; sleep 60", wantSignal: "SIGTERM"},
		{name: "ignores TERM", command: "trap '' TERM; echo ready; sleep 60", wantSignal: "SIGKILL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, dir := startTest(t, testSpec(tt.command))
			waitForOutput(t, dir, "ready")
			if err := h.Cancel(); err != nil {
				t.Fatalf("Cancel = %v", err)
			}
			st := mustWait(t, h)
			if st.Outcome != OutcomeCancelled || st.Signal != tt.wantSignal {
				t.Errorf("status = %s/%q; want cancelled/%q", st.Outcome, st.Signal, tt.wantSignal)
			}
			if !groupGone(t, h.Process().PID) {
				t.Errorf("process group %d still has members", h.Process().PID)
			}
			if err := h.Cancel(); !errors.Is(err, ErrNotRunning) {
				t.Errorf("Cancel after the end = %v; want ErrNotRunning", err)
			}
		})
	}
}

func TestStragglersAreTerminated(t *testing.T) {
	h, dir := startTest(t, testSpec("sleep 60 & echo $!"))
	st := mustWait(t, h)
	if st.Outcome != OutcomeExited || st.ExitCode != 0 {
		t.Errorf("status = %s/%d; want exited/0", st.Outcome, st.ExitCode)
	}
	straggler, err := strconv.Atoi(strings.TrimSpace(readSpool(t, dir, StdoutFile)))
	if err != nil {
		t.Fatalf("straggler pid: %v", err)
	}
	testutil.WaitFor(t, "background process to die", func() bool { return gone(straggler) })
}

func TestAdoptWhileRunning(t *testing.T) {
	workDir := t.TempDir()
	spec := testSpec("echo ready; while [ ! -e proceed ]; do sleep 0.02; done; echo done; exit 7")
	spec.Dir = workDir
	h, dir := startTest(t, spec)
	waitForOutput(t, dir, "ready")

	adopted, err := Adopt(dir)
	if err != nil {
		t.Fatalf("Adopt = %v", err)
	}
	defer adopted.Close()
	if adopted.Process() != h.Process() {
		t.Errorf("adopted Process = %+v; want %+v", adopted.Process(), h.Process())
	}
	if err := os.WriteFile(filepath.Join(workDir, "proceed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Both handles wait at once, as a restarted hostagent and a stale one might.
	var wg sync.WaitGroup
	results := make([]Status, 2)
	errs := make([]error, 2)
	for i, handle := range []*Handle{adopted, h} {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			results[i], errs[i] = handle.Wait(ctx)
		})
	}
	wg.Wait()
	for i, name := range []string{"adopted", "original"} {
		if errs[i] != nil || results[i].Outcome != OutcomeExited || results[i].ExitCode != 7 {
			t.Errorf("%s Wait = %s/%d, %v; want exited/7", name, results[i].Outcome, results[i].ExitCode, errs[i])
		}
	}
	if err := adopted.Cancel(); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Cancel of the finished adopted handle = %v; want ErrNotRunning", err)
	}
}

func TestAdoptCancel(t *testing.T) {
	h, dir := startTest(t, testSpec("echo ready; sleep 60"))
	waitForOutput(t, dir, "ready")
	adopted, err := Adopt(dir)
	if err != nil {
		t.Fatalf("Adopt = %v", err)
	}
	if err := adopted.Cancel(); err != nil {
		t.Fatalf("Cancel through the adopted handle = %v", err)
	}
	if st := mustWait(t, adopted); st.Outcome != OutcomeCancelled {
		t.Errorf("adopted outcome = %s; want cancelled", st.Outcome)
	}
	if st := mustWait(t, h); st.Outcome != OutcomeCancelled {
		t.Errorf("original outcome = %s; want cancelled", st.Outcome)
	}
}

// TestKilledSupervisorAndKeeperVanish: with its keeper gone first, nothing can record the
// end of a command whose supervisor dies: ErrVanished, the outcome unknown.
func TestKilledSupervisorAndKeeperVanish(t *testing.T) {
	h, dir := startTest(t, testSpec("echo ready; exec sleep 60"))
	waitForOutput(t, dir, "ready")
	p := h.Process()
	t.Cleanup(func() { syscall.Kill(-p.PID, syscall.SIGKILL) })
	rec, err := readSupervisorRecord(dir)
	if err != nil || rec.Keeper == 0 {
		t.Fatalf("supervisor record = %+v, %v; want one naming its keeper", rec, err)
	}
	for _, pid := range []int{rec.Keeper, p.SupervisorPID} {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", pid, err)
		}
		testutil.WaitFor(t, "the process to die", func() bool { return gone(pid) })
	}

	check := func(when string) {
		t.Helper()
		if _, err := Adopt(dir); !errors.Is(err, ErrVanished) {
			t.Errorf("Adopt %s = %v; want ErrVanished", when, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		var buf bytes.Buffer
		if _, err := Follow(ctx, dir, StreamStdout, 0, &buf, nil); !errors.Is(err, ErrVanished) || buf.String() != "ready\n" {
			t.Errorf("Follow %s = %q, %v; want the spooled output and ErrVanished", when, buf.String(), err)
		}
	}
	check("before the supervisor is reaped")
	if _, err := waitStatus(t, h); !errors.Is(err, ErrVanished) {
		t.Errorf("Wait = %v; want ErrVanished", err)
	}
	check("after the supervisor is reaped")
}

func TestAdoptNeverStarted(t *testing.T) {
	tests := []struct {
		name  string
		files []string
	}{
		{name: "empty dir"},
		{name: "spec only", files: []string{SpecFile}},
		{name: "spec and log", files: []string{SpecFile, LogFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := Adopt(dir); !errors.Is(err, ErrNeverStarted) {
				t.Errorf("Adopt = %v; want ErrNeverStarted", err)
			}
		})
	}
}

func TestWaitHonoursContext(t *testing.T) {
	h, _ := startTest(t, testSpec("sleep 60"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait(cancelled ctx) = %v; want context.Canceled", err)
	}
}

func TestFollowFromOffsetWhileWriting(t *testing.T) {
	workDir := t.TempDir()
	spec := testSpec("echo first; while [ ! -e proceed ]; do sleep 0.02; done; echo second")
	spec.Dir = workDir
	h, dir := startTest(t, spec)
	waitForOutput(t, dir, "first\n")

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	type result struct {
		offset int64
		err    error
	}
	var buf bytes.Buffer
	done := make(chan result, 1)
	go func() {
		off, err := Follow(ctx, dir, StreamStdout, 3, &buf, nil)
		done <- result{off, err}
	}()
	if err := os.WriteFile(filepath.Join(workDir, "proceed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.offset != int64(len("first\nsecond\n")) || buf.String() != "st\nsecond\n" {
		t.Errorf("Follow = %d, %q, %v; want 13, %q, nil", res.offset, buf.String(), res.err, "st\nsecond\n")
	}
	mustWait(t, h)

	// Once finished, Follow returns at once with whatever is left.
	buf.Reset()
	off, err := Follow(ctx, dir, StreamStderr, 0, &buf, nil)
	if err != nil || off != 0 || buf.Len() != 0 {
		t.Errorf("Follow(stderr) after the end = %d, %q, %v; want 0, empty, nil", off, buf.String(), err)
	}
	if _, err := Follow(ctx, dir, "stdin", 0, &buf, nil); err == nil {
		t.Error("Follow(stdin) = nil error; want unknown stream")
	}
}

func TestIsDescendant(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	h, dir := startTest(t, testSpec("echo ready; sleep 60"))
	waitForOutput(t, dir, "ready")
	p := h.Process()
	self := os.Getpid()

	tests := []struct {
		name          string
		pid, ancestor int
		want          bool
	}{
		{name: "self", pid: self, ancestor: self, want: true},
		{name: "child", pid: child.Process.Pid, ancestor: self, want: true},
		{name: "parent is not a descendant", pid: self, ancestor: child.Process.Pid, want: false},
		{name: "command under supervisor", pid: p.PID, ancestor: p.SupervisorPID, want: true},
		// The supervisor is detached (nobody's child but init's), so commands are not the
		// agent's descendants: only the supervisor's.
		{name: "command is not the starter's descendant", pid: p.PID, ancestor: self, want: false},
		{name: "sibling", pid: child.Process.Pid, ancestor: p.SupervisorPID, want: false},
		{name: "init", pid: 1, ancestor: self, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IsDescendant(tt.pid, tt.ancestor)
			if err != nil || got != tt.want {
				t.Errorf("IsDescendant(%d, %d) = %v, %v; want %v", tt.pid, tt.ancestor, got, err, tt.want)
			}
		})
	}
	if _, err := IsDescendant(0, self); err == nil {
		t.Error("IsDescendant(0, self) = nil error; want out of range")
	}
}

func TestMainMisuse(t *testing.T) {
	if got := Main(nil); got != 2 {
		t.Errorf("Main(nil) = %d; want 2", got)
	}
}

func TestStartContextEnded(t *testing.T) {
	witness := filepath.Join(t.TempDir(), "ran")
	dir := filepath.Join(t.TempDir(), "spool")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := testSupervisor(t).Start(ctx, dir, testSpec("sleep 60; touch "+witness))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start(cancelled ctx) = %v; want context.Canceled", err)
	}
	// Start has already waited for the supervisor: whatever happened is on record.
	h, err := Adopt(dir)
	switch {
	case errors.Is(err, ErrNeverStarted):
	case err != nil:
		t.Fatalf("Adopt = %v; want a finished handle or ErrNeverStarted", err)
	default:
		st := mustWait(t, h)
		if st.Outcome != OutcomeStartFailed && st.Outcome != OutcomeCancelled {
			t.Errorf("outcome = %s; want start_failed or cancelled", st.Outcome)
		}
	}
	if _, err := os.Stat(witness); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("witness: %v; want absent", err)
	}
}

func TestCredential(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	spec := testSpec("id -u; id -g; id -G")
	spec.Dir = "/"
	spec.Credential = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534}}
	h, dir := startTest(t, spec)
	if st := mustWait(t, h); st.ExitCode != 0 {
		t.Fatalf("exit code = %d; stderr %q", st.ExitCode, readSpool(t, dir, StderrFile))
	}
	if got, want := readSpool(t, dir, StdoutFile), "65534\n65534\n65534\n"; got != want {
		t.Errorf("stdout = %q; want %q", got, want)
	}
}

// TestFenceStopsASupervisorOnItsWay: a supervisor whose parent died while starting it may
// still be about to record itself; once Fence succeeded it cannot, and the command never
// runs. Fence of a dir a supervisor recorded itself in is refused.
func TestFenceStopsASupervisorOnItsWay(t *testing.T) {
	dir := t.TempDir()
	witness := filepath.Join(t.TempDir(), "ran")
	spec, err := json.Marshal(testSpec("touch " + witness))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SpecFile), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Fence(dir); err != nil {
		t.Fatalf("Fence = %v; want nil", err)
	}
	if err := Fence(dir); err != nil {
		t.Fatalf("second Fence = %v; want nil (already fenced)", err)
	}
	// The late supervisor, as Start would have run it.
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer readyR.Close()
	cmd := exec.Command(testExe(t), legacySubcommand, dir) // an older hostagent's per-command start
	cmd.ExtraFiles = []*os.File{readyW}
	if err := cmd.Run(); err == nil {
		t.Error("the late supervisor succeeded in a fenced dir")
	}
	readyW.Close()
	if _, err := os.Stat(witness); !errors.Is(err, os.ErrNotExist) {
		t.Error("the command ran in a fenced dir")
	}
	if _, err := Adopt(dir); !errors.Is(err, ErrNeverStarted) {
		t.Errorf("Adopt of a fenced dir = %v; want ErrNeverStarted", err)
	}

	h, started := startTest(t, testSpec("true"))
	waitStatus(t, h)
	if err := Fence(started); !errors.Is(err, ErrAlreadyUsed) {
		t.Errorf("Fence of a dir a supervisor ran in = %v; want ErrAlreadyUsed", err)
	}
}

// inheritFile opens path without close-on-exec, as a shell leaves a redirection open for the
// processes it starts, and closes it at cleanup.
func inheritFile(tb testing.TB, path string) int {
	tb.Helper()
	fd, err := syscall.Open(path, syscall.O_RDONLY, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	return fd
}

// TestCommandInheritsOnlyStdio: a descriptor the supervisor's parent leaked reaches neither
// the supervisor's children nor the command. ls lists its own descriptors: stdin, stdout,
// stderr and the one it opens to read the list.
func TestCommandInheritsOnlyStdio(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	leaked := inheritFile(t, secret)
	h, dir := startTest(t, testSpec("ls /proc/self/fd; cat <&"+strconv.Itoa(leaked)))
	st := mustWait(t, h)
	fds := strings.Fields(readSpool(t, dir, StdoutFile))
	if strings.Join(fds, " ") != "0 1 2 3" {
		t.Errorf("the command has descriptors %v; want 0 1 2 and ls's own 3 (fd %d leaked?)", fds, leaked)
	}
	if st.ExitCode == 0 || strings.Contains(readSpool(t, dir, StdoutFile), "root only") {
		t.Errorf("the command read the leaked descriptor %d: exit %d", leaked, st.ExitCode)
	}
}

func TestCloseOnExecFromProc(t *testing.T) {
	fd := inheritFile(t, "/dev/null")
	if err := closeOnExecFromProc(); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("fd %d flags %#x, %v; want FD_CLOEXEC", fd, flags, err)
	}
	// Still open: marking is not closing.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Errorf("fd %d was closed: %v", fd, err)
	}
}

// TestPerCommandShimStillServes: a hostagent of the previous release, still running while
// its package is upgraded, starts each command as `exe shim` of the new binary; that works,
// and this release adopts what it started.
func TestPerCommandShimStillServes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	h, err := startPerCommand(ctx, testExe(t), dir, testSpec("echo ready; while [ ! -e "+dir+"/proceed ]; do sleep 0.02; done; exit 3"))
	if err != nil {
		t.Fatalf("startPerCommand = %v", err)
	}
	waitForOutput(t, dir, "ready")
	adopted, err := Adopt(dir)
	if err != nil {
		t.Fatalf("Adopt = %v", err)
	}
	defer adopted.Close()
	if err := os.WriteFile(filepath.Join(dir, "proceed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, handle := range map[string]*Handle{"adopted": adopted, "original": h} {
		if st := mustWait(t, handle); st.Outcome != OutcomeExited || st.ExitCode != 3 {
			t.Errorf("%s: status = %s/%d; want exited/3", name, st.Outcome, st.ExitCode)
		}
	}
}

// TestSupervisorOutlivesItsAgent: an agent that lets go (or dies) leaves the supervisor and
// its command running; the command's end is still recorded and adoptable.
func TestSupervisorOutlivesItsAgent(t *testing.T) {
	sup, err := NewClient(testExe(t), filepath.Join(t.TempDir(), "supervisor"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "spool")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	h, err := sup.Start(ctx, dir, testSpec("echo ready; while [ ! -e "+dir+"/proceed ]; do sleep 0.02; done; exit 4"))
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	waitForOutput(t, dir, "ready")
	p := h.Process()
	h.Close()
	sup.Close() // the agent goes away
	if gone(p.SupervisorPID) || gone(p.PID) {
		t.Fatalf("supervisor or command ended with the agent's lease")
	}
	adopted, err := Adopt(dir)
	if err != nil {
		t.Fatalf("Adopt = %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "proceed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if st := mustWait(t, adopted); st.Outcome != OutcomeExited || st.ExitCode != 4 {
		t.Errorf("status = %s/%d; want exited/4", st.Outcome, st.ExitCode)
	}
	// With no lease and no command left, it exits on its own.
	testutil.WaitFor(t, "the idle supervisor to exit", func() bool { return gone(p.SupervisorPID) })
}

// TestDeadSupervisorIsReplaced: a supervisor killed while it runs a command is replaced at
// the next Start; the command it had runs on, and its keeper records its real end.
func TestDeadSupervisorIsReplaced(t *testing.T) {
	sup := testSupervisor(t)
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	first, err := sup.Start(ctx, filepath.Join(root, "1"), testSpec("echo ready; sleep 1; echo after; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	waitForOutput(t, filepath.Join(root, "1"), "ready")
	old := first.Process().SupervisorPID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second, err := sup.Start(ctx, filepath.Join(root, "2"), testSpec("exit 5"))
	if err != nil {
		t.Fatalf("Start after the supervisor died = %v", err)
	}
	if st := mustWait(t, second); st.ExitCode != 5 || second.Process().SupervisorPID == old {
		t.Errorf("second: exit %d under supervisor %d; want 5 under a new supervisor (old %d)", st.ExitCode, second.Process().SupervisorPID, old)
	}
	if st := mustWait(t, first); st.Outcome != OutcomeExited || st.ExitCode != 3 || st.Stdout.Bytes != int64(len("ready\nafter\n")) {
		t.Errorf("the killed supervisor's command = %+v; want exited 3 with all its output", st)
	}
	if got := readSpool(t, filepath.Join(root, "1"), StdoutFile); got != "ready\nafter\n" {
		t.Errorf("stdout = %q", got)
	}
}

// connectAs asks the supervisor at addr to run `touch DIR/witness` in DIR and prints what
// came back ("closed" when the connection ended without an answer).
func connectAs(addr, dir string) int {
	conn, err := net.Dial("unix", addr)
	if err != nil {
		fmt.Println("dial:", err)
		return 0
	}
	defer conn.Close()
	spec := testSpec("touch " + dir + "/witness")
	writeMessage(conn, request{V: protocolVersion, Op: opStart, Dir: dir, Spec: &spec})
	msg, err := readMessage[reply](bufio.NewReader(conn))
	if err != nil {
		fmt.Println("closed")
		return 0
	}
	fmt.Printf("reply: %+v\n", msg)
	return 0
}

// TestSupervisorRefusesOtherUsers: another uid cannot reach the supervisor's socket (a path
// in the private supervisor directory); where the supervisor falls back to an abstract name
// (a directory others may enter), its peer check hangs up on another uid before anything
// runs.
func TestSupervisorRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	// The test binary, where nobody may run it; the spool dir it asks for, where nobody
	// could write (only the supervisor could).
	bin, err := os.MkdirTemp("", "postern-supervisor-test-") // t.TempDir's parent is private
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(testExe(t))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, "supervisor.test")
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		dirMode  os.FileMode
		abstract bool
		want     string
	}{
		{name: "path socket in the private directory", dirMode: 0o700, want: "permission denied"},
		{name: "abstract fallback", dirMode: 0o755, abstract: true, want: "closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Short, so that a path socket fits in sun_path.
			dir, err := os.MkdirTemp("", "sup-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, tc.dirMode); err != nil {
				t.Fatal(err)
			}
			sup, err := NewClient(testExe(t), dir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sup.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			h, err := sup.Start(ctx, filepath.Join(t.TempDir(), "spool"), testSpec("sleep 60"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Cancel(); waitStatus(t, h) })
			if got := strings.HasPrefix(h.sup.Socket, "@"); got != tc.abstract {
				t.Fatalf("socket %q; want abstract %v", h.sup.Socket, tc.abstract)
			}
			target := filepath.Join(t.TempDir(), "target")
			if err := os.Mkdir(target, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(exe)
			cmd.Env = []string{connectRoleEnv + "=" + h.sup.Socket, "POSTERN_SHIM_TEST_DIR=" + target}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			// The verdict is on stdout alone: stderr is the runtime's too (a -cover build warns
			// there that the client, with no GOCOVERDIR, writes no coverage).
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("another uid's request = %q, %v (stderr %q); want %q", out, err, stderr.String(), tc.want)
			}
			for _, name := range []string{"witness", SupervisorFile} {
				if _, err := os.Stat(filepath.Join(target, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after another uid's request (%v): it ran", name, err)
				}
			}
		})
	}
}
