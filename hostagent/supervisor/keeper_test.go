package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
)

// TestSupervisorKillLosesNothing: kill -9 the supervisor while commands run — some writing
// far more than a pipe holds, some sleeping — and every one still finishes, with its real
// exit status and all of its output, recorded by the keeper.
func TestSupervisorKillLosesNothing(t *testing.T) {
	sup := testSupervisor(t)
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	type run struct {
		h      *Handle
		dir    string
		code   int
		stdout int64
		stderr int64
	}
	var runs []run
	for i := range 6 {
		dir := filepath.Join(root, strconv.Itoa(i))
		var cmd string
		var out, errOut int64
		switch i % 3 {
		case 0: // 2 MB of stdout, written before and after the kill
			cmd = "echo ready; head -c 1000000 /dev/zero; sleep 1; head -c 1000000 /dev/zero; exit " + strconv.Itoa(10+i)
			out = 6 + 2000000
		case 1: // stderr beyond a pipe buffer, blocked on it while nobody reads
			cmd = "echo ready; head -c 300000 /dev/zero >&2; sleep 1; exit " + strconv.Itoa(10+i)
			out, errOut = 6, 300000
		default: // sleeping
			cmd = "echo ready; sleep 1.5; echo after; exit " + strconv.Itoa(10+i)
			out = 12
		}
		h, err := sup.Start(ctx, dir, testSpec(cmd))
		if err != nil {
			t.Fatalf("Start %d = %v", i, err)
		}
		runs = append(runs, run{h, dir, 10 + i, out, errOut})
	}
	for _, r := range runs {
		waitForOutput(t, r.dir, "ready")
	}
	supervisorPID := runs[0].h.Process().SupervisorPID
	if err := syscall.Kill(supervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, r := range runs {
		st := mustWait(t, r.h)
		if st.Outcome != OutcomeExited || st.ExitCode != r.code || st.Signal != "" {
			t.Errorf("command %d: %s/%d %s (%s); want exited/%d", i, st.Outcome, st.ExitCode, st.Signal, st.Error, r.code)
		}
		if st.Stdout.Bytes != r.stdout || st.Stdout.Stored != r.stdout || st.Stderr.Bytes != r.stderr {
			t.Errorf("command %d: stdout %d/%d stderr %d bytes; want %d and %d", i, st.Stdout.Stored, st.Stdout.Bytes, st.Stderr.Bytes, r.stdout, r.stderr)
		}
		for _, f := range []struct {
			name string
			info StreamInfo
		}{{StdoutFile, st.Stdout}, {StderrFile, st.Stderr}} {
			data, _ := os.ReadFile(filepath.Join(r.dir, f.name))
			if int64(len(data)) != f.info.Stored || sha(string(data)) != f.info.SHA256 {
				t.Errorf("command %d %s: %d bytes stored, digest %s; the status says %d, %s", i, f.name, len(data), sha(string(data)), f.info.Stored, f.info.SHA256)
			}
		}
		if !strings.Contains(st.Error, "keeper") {
			t.Errorf("command %d: status error %q; want the keeper's note", i, st.Error)
		}
		// A later hostagent adopts the finished execution from its status file.
		if a, err := Adopt(r.dir); err != nil {
			t.Errorf("Adopt %d = %v", i, err)
		} else if st := mustWait(t, a); st.ExitCode != r.code {
			t.Errorf("adopted %d: exit %d", i, st.ExitCode)
		}
	}
}

// TestCancelAfterSupervisorDied: a cancel that comes after the supervisor died still
// terminates the command's group, through the keeper, and the outcome is cancelled.
func TestCancelAfterSupervisorDied(t *testing.T) {
	spec := testSpec("echo ready; sleep 60 & sleep 60; exit 0")
	h, dir := startTest(t, spec)
	waitForOutput(t, dir, "ready")
	p := h.Process()
	if err := syscall.Kill(p.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the supervisor to die", func() bool { return gone(p.SupervisorPID) })
	if gone(p.PID) {
		t.Fatal("the command died with its supervisor")
	}
	adopted, err := Adopt(dir)
	if err != nil {
		t.Fatalf("Adopt = %v", err)
	}
	for name, handle := range map[string]*Handle{"original": h, "adopted": adopted} {
		if err := handle.Cancel(); err != nil {
			t.Errorf("Cancel through the %s handle = %v", name, err)
		}
	}
	for name, handle := range map[string]*Handle{"original": h, "adopted": adopted} {
		if st := mustWait(t, handle); st.Outcome != OutcomeCancelled {
			t.Errorf("%s: outcome %s (%s); want cancelled", name, st.Outcome, st.Error)
		}
	}
	testutil.WaitFor(t, "the command's group to be gone", func() bool {
		return syscall.Kill(-p.PID, 0) == syscall.ESRCH
	})
}

// TestKeptTimeout: a command whose supervisor died still times out when its timeout says.
func TestKeptTimeout(t *testing.T) {
	spec := testSpec("echo ready; exec sleep 60")
	spec.Timeout = 2 * time.Second
	h, dir := startTest(t, spec)
	waitForOutput(t, dir, "ready")
	if err := syscall.Kill(h.Process().SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := mustWait(t, h); st.Outcome != OutcomeTimedOut || st.Signal != "SIGTERM" {
		t.Errorf("outcome %s/%s; want timed_out by SIGTERM", st.Outcome, st.Signal)
	}
}

// TestCommandsDoNotInheritTheLowOOMScore: the keeper and the supervisor run with a low
// oom_score_adj where that is permitted; the commands get the starter's back.
func TestCommandsDoNotInheritTheLowOOMScore(t *testing.T) {
	own, err := ownOOMScore()
	if err != nil {
		t.Skip("no oom_score_adj here")
	}
	h, dir := startTest(t, testSpec("cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"))
	st := mustWait(t, h)
	if st.ExitCode != 0 {
		t.Fatalf("exit %d", st.ExitCode)
	}
	if got, want := readSpool(t, dir, StdoutFile), own+"\n"+own+"\n"; got != want {
		t.Errorf("the command and its child have oom_score_adj %q; want the starter's %q", got, want)
	}
	supervisorScore, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", h.Process().SupervisorPID))
	switch got := strings.TrimSpace(string(supervisorScore)); got {
	case strconv.Itoa(supervisorOOMScore):
	case own:
		t.Logf("the supervisor kept oom_score_adj %s: lowering it is not permitted here", own)
	default:
		t.Errorf("the supervisor's oom_score_adj = %s; want %d, or the starter's %s where lowering is not permitted", got, supervisorOOMScore, own)
	}
}

// TestSupervisorKilledDuringStart: a supervisor killed after it recorded itself in the
// spool dir but before it answered the start leaves the command to its keeper. Start
// returns either a handle whose status is the command's real end, or — if the command never
// reached execve — a StartError, and then the command provably did not run.
func TestSupervisorKilledDuringStart(t *testing.T) {
	for i := range 5 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			sup := testSupervisor(t)
			root := t.TempDir()
			dir := filepath.Join(root, "spool")
			witness := filepath.Join(root, "witness")
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			if i%2 == 0 { // a supervisor already running, or one started for this command
				h, err := sup.Start(ctx, filepath.Join(root, "warm"), testSpec("true"))
				if err != nil {
					t.Fatal(err)
				}
				mustWait(t, h)
			}
			type result struct {
				h   *Handle
				err error
			}
			res := make(chan result, 1)
			go func() {
				h, err := sup.Start(ctx, dir, testSpec("touch "+witness+"; sleep 0.5; echo done; exit 6"))
				res <- result{h, err}
			}()
			var rec supervisorRecord
			testutil.WaitFor(t, "the supervisor record", func() bool {
				var err error
				rec, err = readSupervisorRecord(dir)
				return err == nil
			})
			time.Sleep(time.Duration(i) * 300 * time.Microsecond)
			if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			r := <-res
			var se *StartError
			switch {
			case errors.As(r.err, &se):
				time.Sleep(700 * time.Millisecond)
				if _, err := os.Stat(witness); err == nil {
					t.Errorf("Start = %v, yet the command ran", r.err)
				}
			case r.err != nil:
				t.Fatalf("Start = %v; want a handle on the kept command or a StartError", r.err)
			default:
				if r.h.Process().PID == 0 {
					t.Errorf("the kept command's handle names no process")
				}
				if st := mustWait(t, r.h); st.Outcome != OutcomeExited || st.ExitCode != 6 || st.Stdout.Bytes != 5 {
					t.Errorf("status = %+v; want exited 6 with its output", st)
				}
			}
		})
	}
}
