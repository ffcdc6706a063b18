package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// The restore drill (docs/operations.md, "Backup and restore"): a backup taken while the
// bastion serves, with calls in flight, restores into a fresh state dir, where `audit verify`
// passes and the export holds the same events as the live journal's up to the backup point.
// A second restore refuses to replace the journal without --replace, and sets it aside with
// it.
func TestBackupRestoreDrill(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	long := mustCall(t, ctx, f.session(t, "agent", "long"), "ssh_exec", map[string]any{"host": "h1", "command": "sleep 2; echo long", "wait_s": 0})

	// Load: clients sending commands while the backup is taken.
	var done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 3 {
		cs := f.session(t, "agent", fmt.Sprint("load-", c))
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": fmt.Sprintf("echo %d-%d", c, i)}); err != nil {
					t.Errorf("call during the backup: %v", err)
					return
				}
				done.Add(1)
			}
		})
	}
	testutil.WaitFor(t, "calls under way", func() bool { return done.Load() >= 10 })
	backup := filepath.Join(t.TempDir(), "backup")
	out := string(postern(t, f.bastion, "journal", "backup", backup))
	during := done.Load()
	testutil.WaitFor(t, "calls after the backup", func() bool { return done.Load() >= during+5 })
	close(stop)
	wg.Wait()
	if !strings.Contains(out, "from the running bastion") || !strings.Contains(out, "verified PASS") {
		t.Fatalf("backup: %s", out)
	}
	t.Logf("backup with %d calls done, then %d: %s", during, done.Load(), out)
	checkPrivate(t, backup)
	var m struct {
		Head struct{ Seq uint64 } `json:"head"`
	}
	data, err := os.ReadFile(filepath.Join(backup, "backup.json"))
	if err != nil || json.Unmarshal(data, &m) != nil || m.Head.Seq == 0 {
		t.Fatalf("backup.json: %s, %v", data, err)
	}
	waitForState(t, ctx, f.session(t, "agent", "long"), long.ExecutionID, "completed")
	live := postern(t, f.bastion, "audit", "export")

	fresh := filepath.Join(t.TempDir(), "restored")
	out = posternIn(t, fresh, "journal", "restore", backup)
	if !strings.Contains(out, "restored the journal into") || !strings.Contains(out, "restored "+filepath.Join(fresh, "fingerprint.key")) ||
		!strings.Contains(out, "the restored journal's export is the backup's") {
		t.Fatalf("restore: %s", out)
	}
	if out := posternIn(t, fresh, "audit", "verify"); !strings.Contains(out, "PASS") {
		t.Fatalf("verify the restored journal: %s", out)
	}
	restored := []byte(posternIn(t, fresh, "audit", "export"))
	got, want := eventsThrough(restored, m.Head.Seq), eventsThrough(live, m.Head.Seq)
	if len(got) != int(m.Head.Seq) || !slices.Equal(got, want) {
		t.Fatalf("the restored export has %d events up to the backup point %d, the live one %d; identical: %v", len(got), m.Head.Seq, len(want), slices.Equal(got, want))
	}
	if extra := eventsThrough(restored, ^uint64(0)); len(extra) != len(got) {
		t.Fatalf("the restored export has %d events; want the backup's %d", len(extra), len(got))
	}
	// The execution in flight at the backup point is in flight in the restored journal.
	if out := posternIn(t, fresh, "executions", "show", long.ExecutionID); !strings.Contains(out, "dispatched") && !strings.Contains(out, "running") {
		t.Fatalf("the long command in the restored journal: %s", out)
	}

	msg := posternFails(t, fresh, "journal", "restore", backup)
	if !strings.Contains(msg, "holds a journal: --replace sets it aside") {
		t.Fatalf("a restore over a journal without --replace: %s", msg)
	}
	out = posternIn(t, fresh, "journal", "restore", backup, "--replace")
	if !strings.Contains(out, "set the journal "+filepath.Join(fresh, "journal")+" aside as") || !strings.Contains(out, "kept "+filepath.Join(fresh, "audit.key")) {
		t.Fatalf("restore --replace: %s", out)
	}
}

// The bastion down: the backup reads the journal files itself.
func TestBackupWithTheBastionDown(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	x := mustCall(t, ctx, f.session(t, "agent", "run"), "ssh_exec", map[string]any{"host": "h1", "command": "echo one"})
	f.bastion.Stop(t)
	backup := filepath.Join(t.TempDir(), "backup")
	out := string(postern(t, f.bastion, "journal", "backup", backup))
	if !strings.Contains(out, "from the journal files in") || !strings.Contains(out, "verified PASS") {
		t.Fatalf("backup with the bastion down: %s", out)
	}
	fresh := filepath.Join(t.TempDir(), "restored")
	posternIn(t, fresh, "journal", "restore", backup)
	if out := posternIn(t, fresh, "executions", "show", x.ExecutionID); !strings.Contains(out, "completed") {
		t.Fatalf("the execution in the restored journal: %s", out)
	}
	f.bastion.Start(t)
	msg := posternFails(t, f.bastion.StateDir(), "journal", "restore", backup, "--replace")
	if !strings.Contains(msg, "stop it first") {
		t.Fatalf("a restore under a running bastion: %s", msg)
	}
}

// posternIn runs the operator CLI on the state dir dir (default config) and returns its
// stdout; it fails the test on a non-zero exit.
func posternIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, stderr, err := runPostern(t, dir, args...)
	if err != nil {
		t.Fatalf("postern %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr)
	}
	return out
}

// posternFails runs the operator CLI on the state dir dir, which must fail, and returns its
// stderr.
func posternFails(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, stderr, err := runPostern(t, dir, args...)
	if err == nil {
		t.Fatalf("postern %s succeeded: %s", strings.Join(args, " "), out)
	}
	return stderr
}

func runPostern(t *testing.T, dir string, args ...string) (string, string, error) {
	cmd := exec.Command(harness.Binary(t, "postern"), append(args, "--state-dir", dir)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// checkPrivate checks that every file under dir is 0600 and every directory 0700.
func checkPrivate(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = fs.ModeDir | 0o700
		}
		if info.Mode() != want {
			t.Errorf("%s is %v; want %v", path, info.Mode(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// eventsThrough are the event lines of an export with seq at most last.
func eventsThrough(export []byte, last uint64) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(export))
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		var ev struct {
			Type string `json:"type"`
			Seq  uint64 `json:"seq"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Type == "event" && ev.Seq <= last {
			out = append(out, sc.Text())
		}
	}
	return out
}

// On etcd: a backup taken through a serving replica (the journal read at one revision) is
// refused by a restore while any replica serves the prefix, and replaces the prefix once
// they all stopped; a replica started on it knows the executions, and it verifies.
func TestBackupRestoreOnEtcd(t *testing.T) {
	f := startHAFleet(t, 2)
	ctx := testContext(t)
	cs := f.session(t, 0, "run-1")
	first := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo one"})
	backup := filepath.Join(t.TempDir(), "backup")
	if out := string(postern(t, f.replicas[0], "journal", "backup", backup)); !strings.Contains(out, "from the running bastion") {
		t.Fatalf("backup: %s", out)
	}
	mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo after the backup"})

	f.replicas[1].Stop(t)
	msg := posternFails(t, f.replicas[1].StateDir(), "journal", "restore", backup, "--replace", "--config", f.replicas[1].ConfigPath)
	if !strings.Contains(msg, "replicas [r0] serve the journal in etcd: stop every replica first") {
		t.Fatalf("a restore while r0 serves: %s", msg)
	}
	f.replicas[0].Stop(t)
	out := string(postern(t, f.replicas[0], "journal", "restore", backup, "--replace"))
	if !strings.Contains(out, "deleted the journal in etcd under") || !strings.Contains(out, "restored the journal into etcd under") {
		t.Fatalf("restore on etcd: %s", out)
	}
	if out := string(postern(t, f.replicas[0], "audit", "verify")); !strings.Contains(out, "PASS") {
		t.Fatalf("verify the restored etcd journal: %s", out)
	}
	f.replicas[0].Start(t)
	if x := statusOf(t, ctx, f.session(t, 0, "run-1"), first.ExecutionID); x.State != "completed" {
		t.Fatalf("the execution before the backup, on the restored journal: %+v", x)
	}
}
