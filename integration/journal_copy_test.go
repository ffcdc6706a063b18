package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// A single node's Pebble journal grows into replicas: `postern journal copy --to etcd`, the
// copy verifies, a bastion on etcd knows the executions (a retry replays), and the journal
// copies back to Pebble, where it verifies too.
func TestJournalCopyPebbleToEtcdAndBack(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "copied")
	cs := f.session(t, "agent", "run-1")
	first := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd})
	for i := range 5 {
		mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": fmt.Sprintf("echo %d", i)})
	}
	// The first result's delivery is journaled once it settled, unsynced; the copy must carry
	// it (below, the same command is then a new intent), so the bastion is stopped cleanly
	// after that, as the README says to before a copy.
	testutil.WaitFor(t, "the first result journaled as delivered", func() bool {
		return journaled(t, f.bastion, first.ExecutionID).ResultDeliveredAt != nil
	})
	f.bastion.Stop(t)

	cluster := etcdtest.Start(t, 3)
	cfg, err := os.ReadFile(f.bastion.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	journal := fmt.Sprintf("\n[journal]\nbackend = \"etcd\"\nendpoints = [\"%s\"]\nprefix = \"/copy/\"\nlease_ttl = \"2s\"\n",
		strings.Join(cluster.Endpoints(), `", "`))
	if err := os.WriteFile(f.bastion.ConfigPath, append(cfg, journal...), 0o600); err != nil {
		t.Fatal(err)
	}
	postern := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(harness.Binary(t, "postern"), append(args, "--config", f.bastion.ConfigPath)...).CombinedOutput()
		if err != nil {
			t.Fatalf("postern %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := postern("journal", "copy", "--to", "etcd"); !strings.Contains(out, "the exports are identical") {
		t.Fatalf("copy to etcd: %s", out)
	}
	if out := postern("audit", "verify"); !strings.Contains(out, "the etcd journal: PASS") {
		t.Fatalf("verify on etcd: %s", out)
	}

	f.bastion.Start(t) // now on etcd
	cs = f.session(t, "agent", "run-1")
	if x := statusOf(t, ctx, cs, first.ExecutionID); x.State != "completed" || x.Stdout != "done\n" {
		t.Fatalf("the first execution on the etcd journal: %+v", x)
	}
	// Delivered, so the same command is a new intent: a new execution, on etcd.
	if again := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd}); again.ExecutionID == first.ExecutionID || again.State != "completed" {
		t.Fatalf("a new call on the etcd journal: %+v", again)
	}
	if n := effects(t, file); n != 2 {
		t.Fatalf("the command ran %d times, want 2", n)
	}
	if out := postern("audit", "verify", "--require-sealed"); !strings.Contains(out, "export: PASS") {
		t.Fatalf("verify the serving replica's export: %s", out)
	}
	f.bastion.Stop(t)

	dir := config.DefaultConfig(f.bastion.StateDir()).JournalDir()
	if err := os.Rename(dir, dir+".before"); err != nil {
		t.Fatal(err)
	}
	if out := postern("journal", "copy", "--to", "pebble"); !strings.Contains(out, "the exports are identical") {
		t.Fatalf("copy to pebble: %s", out)
	}
	if out := postern("audit", "verify", "--dir", dir); !strings.Contains(out, "PASS") {
		t.Fatalf("verify the copy back: %s", out)
	}
}
