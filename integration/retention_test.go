package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// shortRetention: a remote command's record may go 2 s after it ended (attach window 1 s);
// the scheduled pass is off, the tests run it.
const shortRetention = "[[classes]]\nname = \"remote_command\"\nattach_window = \"1s\"\nretention = \"2s\""

// pastRetention waits until executions that ended now are removable (2 s, plus the margin
// of a tenth).
func pastRetention() { time.Sleep(2500 * time.Millisecond) }

func gcPass(t *testing.T, b *harness.Bastion, args ...string) api.RetentionPass {
	t.Helper()
	var p api.RetentionPass
	if err := json.Unmarshal(postern(t, b, append([]string{"journal", "gc", "--json"}, args...)...), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// A pass through the daemon removes the executions past their class's retention, and the
// chain verifies afterwards, with the export made before as its archive; a keyed call whose
// execution was removed after its retention is a new execution that says so; with the daemon
// down `journal gc` runs the pass on the journal itself.
func TestJournalGC(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{`retention_interval = "0s"`}, tables: []string{shortRetention}})
	ctx := testContext(t)
	cs := f.session(t, "agent", "run-1")
	keyedCmd, file := appendCommand(t, "keyed")
	keyed := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": keyedCmd, "idempotency_key": "deploy-1"})
	plain := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo plain"})
	pastRetention()

	if p := gcPass(t, f.bastion, "--dry-run"); !p.DryRun || p.Records != 2 {
		t.Fatalf("dry run = %+v; want 2 executions counted", p)
	}
	if _, err := readOperatorDetail(f.bastion, keyed.ExecutionID); err != nil {
		t.Fatalf("a dry run removed %s: %v", keyed.ExecutionID, err)
	}
	archive := filepath.Join(t.TempDir(), "archive.jsonl")
	p := gcPass(t, f.bastion, "--archive", archive)
	if p.Records != 2 || p.Tombstones != 2 || p.Events == 0 || !p.Compacted {
		t.Fatalf("pass = %+v; want both executions removed with their tombstones, the chain pruned", p)
	}
	for _, id := range []string{keyed.ExecutionID, plain.ExecutionID} {
		if _, err := readOperatorDetail(f.bastion, id); err == nil {
			t.Errorf("%s is still in the journal", id)
		}
	}
	out := string(postern(t, f.bastion, "audit", "verify"))
	if !strings.Contains(out, "PASS") || !strings.Contains(out, "pruned by retention") {
		t.Fatalf("verify after the pass:\n%s", out)
	}
	out = string(postern(t, f.bastion, "audit", "verify", "--archive", archive))
	if strings.Count(out, "PASS") != 2 || !strings.Contains(out, "reaches the start of the pruned log") {
		t.Fatalf("verify with the archive:\n%s", out)
	}
	if n := metric(t, f.bastion, `postern_retention_passes_total{result="ok"}`); n != 1 {
		t.Errorf("passes counted = %v; want 1", n)
	}
	if n := metric(t, f.bastion, `postern_retention_removed_total{what="executions"}`); n != 2 {
		t.Errorf("executions removed counted = %v; want 2", n)
	}
	if metric(t, f.bastion, "postern_journal_backend_bytes") <= 0 {
		t.Error("postern_journal_backend_bytes is not reported")
	}
	doctor := string(postern(t, f.bastion, "doctor"))
	if !strings.Contains(doctor, "pebble,") || !strings.Contains(doctor, "removed 2 executions") {
		t.Errorf("doctor does not show the journal and its last pass:\n%s", doctor)
	}

	// Its retention passed, so the key is free: the same call is a new execution, which says
	// what the key last named.
	again := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": keyedCmd, "idempotency_key": "deploy-1"})
	if again.ExecutionID == keyed.ExecutionID || effects(t, file) != 2 {
		t.Fatalf("the keyed call after its execution was removed: %s, ran %d times", again.ExecutionID, effects(t, file))
	}
	d := operatorDetail(t, f.bastion, again.ExecutionID)
	if !strings.Contains(strings.Join(d.Record.Evidence, "\n"), "last named "+keyed.ExecutionID) {
		t.Errorf("the new execution's evidence does not name the removed one: %q", d.Record.Evidence)
	}

	// With the daemon down, the pass runs on the journal itself.
	pastRetention()
	f.bastion.Stop(t)
	p = gcPass(t, f.bastion)
	if p.Records != 1 {
		t.Fatalf("pass with the daemon down = %+v; want the last execution removed", p)
	}
	out = string(postern(t, f.bastion, "audit", "verify"))
	if !strings.Contains(out, "PASS") {
		t.Fatalf("verify after the offline pass:\n%s", out)
	}
	f.bastion.Start(t)
}

// An execution removed before a call could stop matching it — here its class's retention was
// lengthened after the pass; a replica's clock ahead does the same — is not run again
// blindly: a keyed retry of it is refused (execution_removed), nothing dispatched.
func TestRemovedExecutionIsNotRunAgainBlindly(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{`retention_interval = "0s"`}, tables: []string{shortRetention}})
	ctx := testContext(t)
	cs := f.session(t, "agent", "run-1")
	cmd, file := appendCommand(t, "once")
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "idempotency_key": "migrate-7"})
	pastRetention()
	if p := gcPass(t, f.bastion); p.Records != 1 {
		t.Fatalf("pass = %+v", p)
	}
	f.bastion.Stop(t)
	cfg, err := os.ReadFile(f.bastion.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	longer := strings.Replace(string(cfg), `retention = "2s"`, `retention = "1h"`, 1)
	if err := os.WriteFile(f.bastion.ConfigPath, []byte(longer), 0o600); err != nil {
		t.Fatal(err)
	}
	f.bastion.Start(t)
	cs = f.session(t, "agent", "run-2")
	msg := mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "idempotency_key": "migrate-7"})
	if !strings.Contains(msg, api.CodeExecutionRemoved) || !strings.Contains(msg, x.ExecutionID) || !strings.Contains(msg, "Nothing was dispatched") {
		t.Fatalf("retry of a removed keyed execution: %s", msg)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
	// Another request under the key is still another request.
	msg = mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo other", "idempotency_key": "migrate-7"})
	if !strings.Contains(msg, api.CodeIdempotencyKeyReused) || !strings.Contains(msg, "removed by the journal's retention") {
		t.Fatalf("another request under the removed execution's key: %s", msg)
	}
}

// On replicas the scheduled pass runs on the elected replica only; an operator may run one
// through any replica's operator socket; from a machine whose replica is down, the pass is
// refused while another replica serves the journal (naming it).
func TestReplicasRetention(t *testing.T) {
	f := startHAFleet(t, 2, `retention_interval = "1s"`, shortRetention)
	ctx := testContext(t)
	var ids []string
	for i := range 4 {
		x := mustCall(t, ctx, f.session(t, i%2, "run-1"), "ssh_exec", map[string]any{"host": "h1", "command": "echo " + strings.Repeat("x", i+1)})
		ids = append(ids, x.ExecutionID)
	}
	testutil.WaitFor(t, "the scheduled pass removed every execution", func() bool {
		for _, id := range ids {
			if _, err := readOperatorDetail(f.replicas[0], id); err == nil {
				return false
			}
		}
		return true
	})
	passes := []float64{metric(t, f.replicas[0], `postern_retention_passes_total{result="ok"}`), metric(t, f.replicas[1], `postern_retention_passes_total{result="ok"}`)}
	if (passes[0] > 0) == (passes[1] > 0) {
		t.Fatalf("scheduled passes per replica = %v; want them on the elected one only", passes)
	}
	elected, other := 0, 1
	if passes[1] > 0 {
		elected, other = 1, 0
	}
	if p := gcPass(t, f.replicas[other]); p.Records != 0 || p.Error != "" {
		t.Fatalf("a pass asked of the other replica = %+v", p)
	}
	out := string(postern(t, f.replicas[other], "audit", "verify"))
	if !strings.Contains(out, "PASS") || !strings.Contains(out, "pruned by retention") {
		t.Fatalf("verify after the passes:\n%s", out)
	}
	if metric(t, f.replicas[elected], "postern_journal_backend_quota_bytes") != 2<<30 {
		t.Error("the etcd quota is not reported")
	}
	f.replicas[other].Stop(t)
	cmd := exec.Command(harness.Binary(t, "postern"), "journal", "gc", "--config", f.replicas[other].ConfigPath)
	msg, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), fmt.Sprintf("r%d, the elected one", elected)) {
		t.Fatalf("a pass from a stopped replica's machine while r%d serves = %v:\n%s", elected, err, msg)
	}
}
