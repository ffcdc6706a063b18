package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// spoolDir makes root/name holding a stdout of size bytes, final (with a status file) or not.
func spoolDir(t *testing.T, root, name string, size int, final bool) {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StdoutFile), make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if final {
		if err := os.WriteFile(filepath.Join(dir, StatusFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestQuota(t *testing.T) {
	root := t.TempDir()
	spoolDir(t, root, "ex_done", 600, true)
	spoolDir(t, root, "ex_running", 300, false)
	q := NewQuota(root, 1000)

	// 900 of 1000 used: room for one more.
	if err := q.Admit("ex_new"); err != nil {
		t.Fatalf("Admit at 900/1000 = %v; want room", err)
	}
	// The running one grows, and the admitted one appears: 600 + 350 + 100 = 1050.
	spoolDir(t, root, "ex_running", 350, false)
	spoolDir(t, root, "ex_new", 100, false)
	// Running directories are measured again once the last measurement is older than
	// quotaMeasureEvery; until then the growth is not seen (the start still counts).
	q.measuredAt = q.measuredAt.Add(-quotaMeasureEvery)
	err := q.Admit("ex_next")
	if !errors.Is(err, ErrSpoolFull) || !errors.Is(err, ErrStartFailed) || !strings.Contains(err.Error(), "1050 of 1000") {
		t.Fatalf("Admit at 1050/1000 = %v; want ErrSpoolFull (and ErrStartFailed) with the numbers", err)
	}
	if _, err := os.Stat(filepath.Join(root, "ex_next")); !os.IsNotExist(err) {
		t.Errorf("a refused Admit created something: %v", err)
	}

	// A final dir is measured once: a change behind the quota's back (ex_done emptied) is
	// seen when a would-be refusal measures afresh...
	spoolDir(t, root, "ex_done", 0, true)
	if err := q.Admit("ex_after_shrink"); err != nil {
		t.Fatalf("Admit after ex_done shrank to 0 = %v; want the refusal's rescan to see it", err)
	}
	// ...and Forget drops what the caller removed.
	os.RemoveAll(filepath.Join(root, "ex_running"))
	q.Forget("ex_running")
	if used, err := q.usedLocked(true); err != nil || used != 100 {
		t.Errorf("used = %d, %v; want 100 (ex_new only)", used, err)
	}
}
