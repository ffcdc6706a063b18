package hostagent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestSpoolCapRefusesBeforeStart fills a small spool and checks that the next command is
// refused before it starts: exit 255 with the reason, a not_started marker that says why, no
// spool dir, and no side effect. Freeing the spool lets commands run again.
func TestSpoolCapRefusesBeforeStart(t *testing.T) {
	store := testutil.OpenStore(t, markers.HostGraph)
	ea := startExecAgent(t, func(o *hostagent.ExecutorOptions) {
		o.Store = store.Store
		o.Config.OutputCap = 1 << 10
		o.Config.SpoolCap = 4 << 10
	})
	effects := filepath.Join(t.TempDir(), "effects")
	// Each run stores 1 KiB of stdout (the cap) plus its records, so a few fill 4 KiB.
	command := "echo ran >> " + effects + "; head -c 3000 /dev/zero"
	run := func() (string, hostproto.Result, string) {
		t.Helper()
		id, err := markers.NewExecutionID(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		res, err := hostproto.Run(context.Background(), ea.client, hostproto.Exec{ExecutionID: id, Command: command, Stderr: &stderr})
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		return id, res, stderr.String()
	}
	lines := func() int {
		data, _ := os.ReadFile(effects)
		return strings.Count(string(data), "\n")
	}

	var ran []string
	var refused string
	for range 10 {
		id, res, stderr := run()
		if res.ExitStatus == 0 {
			ran = append(ran, id)
			continue
		}
		if res.ExitStatus != hostproto.ExitRefused || !strings.Contains(stderr, "spool is full") || !strings.Contains(stderr, "spool_cap") {
			t.Fatalf("exec %d: status %d, stderr %q; want 0, or 255 saying the spool is full", len(ran)+1, res.ExitStatus, stderr)
		}
		refused = id
		break
	}
	if refused == "" || len(ran) == 0 {
		t.Fatalf("%d commands ran and none was refused; want the spool to fill", len(ran))
	}
	if got := lines(); got != len(ran) {
		t.Errorf("%d side effects; want %d (one per command that ran, none from the refused one)", got, len(ran))
	}
	rec, err := store.Get(refused)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != markers.NotStarted || !strings.Contains(strings.Join(rec.Evidence, "; "), "spool is full") {
		t.Errorf("refused marker: %s %q; want not_started saying the spool is full", rec.State, rec.Evidence)
	}
	if _, err := os.Stat(rec.SpoolDir); !os.IsNotExist(err) {
		t.Errorf("refused execution has a spool dir (%v); want nothing created", err)
	}
	for _, id := range ran {
		if rec, err := store.Get(id); err != nil || rec.State != markers.Exited {
			t.Errorf("marker of %s: %v, %v; want exited, kept", id, rec, err)
		}
	}

	// Someone frees the spool behind the executor's back: a refusal measures afresh.
	first, err := store.Get(ran[0])
	if err != nil {
		t.Fatal(err)
	}
	spool := filepath.Dir(first.SpoolDir)
	entries, _ := os.ReadDir(spool)
	for _, ent := range entries {
		os.RemoveAll(filepath.Join(spool, ent.Name()))
	}
	if _, res, stderr := run(); res.ExitStatus != 0 {
		t.Fatalf("after freeing the spool: status %d, stderr %q; want the command to run", res.ExitStatus, stderr)
	}
	if got := lines(); got != len(ran)+1 {
		t.Errorf("%d side effects; want %d", got, len(ran)+1)
	}
}
