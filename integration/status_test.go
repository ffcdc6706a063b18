package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// TestCrashThenLookBeforeRestart is an operator's bad day, end to end: the bastion is
// SIGKILLed while a command runs. With it down, `postern status` names the crash and what a
// start will do; every read command answers from the files, the state dir stays
// byte-for-byte as it was, and nothing reaches the host. A `serve --hold` start serves reads
// and refuses to send; a normal start then reconciles: the command ran once.
func TestCrashThenLookBeforeRestart(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	b := f.bastion
	dir := t.TempDir()
	started, gate, effect := filepath.Join(dir, "started"), filepath.Join(dir, "gate"), filepath.Join(dir, "effects")
	command := "echo s >> " + started + "; while [ ! -e " + gate + " ] && [ -d " + dir + " ]; do sleep 0.05; done; echo x >> " + effect + "; echo done"
	args := map[string]any{"host": "h1", "command": command, "wait_s": 0}
	x := mustCall(t, ctx, f.session(t, "agent", "crash"), "ssh_exec", args)
	waitForJournalState(t, b, x.ExecutionID, markers.Running)
	// Running is journaled once the host's marker exists, before the shell has run a line.
	testutil.WaitFor(t, "the command to start", func() bool { return effects(t, started) == 1 })
	pid := b.PID()
	b.Kill(t)
	// Running is journaled without waiting for the sync (nothing depends on it), so the
	// kill may have lost it: the crash left whatever the journal holds now.
	crashed := journaledOffline(t, b, x.ExecutionID)

	t.Run("daemon down", func(t *testing.T) {
		before := testutil.DirDigest(t, b.StateDir())
		status := string(postern(t, b, "status"))
		t.Logf("postern status:\n%s", status)
		for _, want := range []string{
			"The bastion is not running",
			"It did not stop cleanly: pid " + strconv.Itoa(pid),
			"In flight (1)", x.ExecutionID,
			"at start: asks the hostagent on h1 for its marker",
			"postern serve --hold",
		} {
			if !strings.Contains(status, want) {
				t.Errorf("status lacks %q:\n%s", want, status)
			}
		}
		var o struct {
			api.Overview
			UncleanStopPID int `json:"unclean_stop_pid"`
		}
		if err := json.Unmarshal(postern(t, b, "status", "--json"), &o); err != nil {
			t.Fatal(err)
		}
		if o.Daemon != api.DaemonDown || o.UncleanStopPID != pid || len(o.InFlight) != 1 || o.InFlight[0].AtStart == "" {
			t.Errorf("status --json = %+v; want down, pid %d, one execution in flight with what a start does", o, pid)
		}
		for _, args := range [][]string{
			{"executions", "list"}, {"executions", "show", x.ExecutionID}, {"investigate", x.ExecutionID},
			{"runs", "list"}, {"approvals", "list"}, {"hosts", "list"},
			{"markers", "--host", "h1", "list"}, {"markers", "--host", "h1", "show", x.ExecutionID},
		} {
			out := string(postern(t, b, args...))
			if args[0] != "runs" && args[0] != "approvals" && args[0] != "hosts" && !strings.Contains(out, x.ExecutionID) {
				t.Errorf("%v: stdout lacks %s:\n%s", args, x.ExecutionID, out)
			}
		}
		// follow says nothing carries it, instead of waiting for an end that cannot come.
		cmd := exec.CommandContext(ctx, harness.Binary(t, "postern"), "executions", "follow", x.ExecutionID, "--config", b.ConfigPath)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "nothing carries "+x.ExecutionID+" to its end") {
			t.Errorf("follow with the daemon down: %v, %q; want it to stop and say why", err, stderr.String())
		}
		if after := testutil.DirDigest(t, b.StateDir()); after != before {
			t.Errorf("the read commands changed the state dir:\nbefore %s\nafter  %s", before, after)
		}
	})
	if n := effects(t, started); n != 1 {
		t.Fatalf("the command started %d times with the daemon down; want 1", n)
	}

	t.Run("held", func(t *testing.T) {
		b.Start(t, "--hold")
		status := string(postern(t, b, "status"))
		if !strings.Contains(status, "held (--hold)") || !strings.Contains(status, "at start: asks the hostagent on h1") {
			t.Errorf("status of a held bastion:\n%s", status)
		}
		cs := f.session(t, "agent", "crash")
		refused := mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo new >> " + effect})
		if !strings.Contains(refused, "held") || !strings.Contains(refused, "--hold") {
			t.Errorf("a new call to a held bastion: %s; want it refused, saying why", refused)
		}
		// The retry of the call in flight answers from the journal and sends nothing.
		again := mustCall(t, ctx, cs, "ssh_exec", args)
		if again.ExecutionID != x.ExecutionID || !again.Replayed {
			t.Errorf("retry = %+v; want %s, replayed", again, x.ExecutionID)
		}
		if rec := journaled(t, b, x.ExecutionID); rec.State != crashed.State || len(rec.Evidence) != len(crashed.Evidence) {
			t.Errorf("held: %s is %s (%q); want it left as the crash left it, %s (%q): nothing reconciled", x.ExecutionID, rec.State, rec.Evidence, crashed.State, crashed.Evidence)
		}
		b.Stop(t)
		if out := string(postern(t, b, "status")); !strings.Contains(out, "It stopped cleanly.") {
			t.Errorf("status after a clean stop:\n%s", out)
		}
	})
	if n := effects(t, started); n != 1 {
		t.Fatalf("the command started %d times by a held bastion; want 1", n)
	}

	b.Start(t)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitForJournalState(t, b, x.ExecutionID, markers.Completed)
	if s, e := effects(t, started), effects(t, effect); s != 1 || e != 1 {
		t.Fatalf("started %d times, took effect %d times; want once each", s, e)
	}
}

// journaledOffline is execution id's record as `postern executions show` reads it from the
// files while the daemon is down.
func journaledOffline(t *testing.T, b *harness.Bastion, id string) *markers.Record {
	t.Helper()
	var d api.ExecutionDetail
	if err := json.Unmarshal(postern(t, b, "executions", "show", id, "--json"), &d); err != nil {
		t.Fatal(err)
	}
	return d.Record
}
