package markers_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestStoreFilesArePrivate: whatever the umask, Pebble's files are created 0600 and its
// directories 0700 (they hold commands and output tails).
func TestStoreFilesArePrivate(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	if _, err := s.Create(context.Background(), &markers.Record{ID: "ex_private", Command: []string{"/bin/sh", "-c", "secret"}}); err != nil {
		t.Fatal(err)
	}
	s.Reopen(t) // a flush, a new WAL, MANIFEST and OPTIONS
	n := 0
	filepath.WalkDir(s.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		info, _ := d.Info()
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v; want nothing for group or others", p, info.Mode())
		}
		n++
		return nil
	})
	if n < 5 {
		t.Fatalf("walked %d entries; want the store's files", n)
	}
}
