package hostagent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

func TestRemoveOrphanSpools(t *testing.T) {
	store := testutil.OpenStore(t, markers.HostGraph)
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	e, err := NewExecutor(ExecutorOptions{Config: cfg, Store: store.Store, SupervisorExe: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := store.Create(context.Background(), &markers.Record{ID: "ex_kept"}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	for _, name := range []string{"ex_kept", "ex_orphan_old", "ex_orphan_new"} {
		dir := filepath.Join(e.spool, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if name != "ex_orphan_new" {
			os.Chtimes(dir, old, old)
		}
	}
	removed, err := e.removeOrphanSpools(time.Now().Add(-24 * time.Hour))
	if err != nil || removed != 1 {
		t.Fatalf("removed %d, %v; want 1", removed, err)
	}
	for name, want := range map[string]bool{"ex_kept": true, "ex_orphan_old": false, "ex_orphan_new": true} {
		_, err := os.Stat(filepath.Join(e.spool, name))
		if (err == nil) != want {
			t.Errorf("%s present = %v; want %v", name, err == nil, want)
		}
	}
}
