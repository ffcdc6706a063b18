// Package sockdir makes temporary directories for tests whose paths leave room for the unix
// sockets made inside them. A socket path must fit in sun_path (108 bytes, 104 on some
// systems) or bind fails with EINVAL; t.TempDir names its directory after the test, so a
// subtest with a long name, under a TMPDIR longer than /tmp, overflows it. It imports
// nothing of Postern, so the bastion's and the hostagent's own tests can use it
// (the harness imports it).
package sockdir

import (
	"os"
	"testing"
)

// New returns a new directory (0700) whose path is TMPDIR plus a dozen bytes whatever the
// test's name. It is removed at cleanup, after every cleanup registered later (such as the
// processes that listen in it).
func New(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "p")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove socket dir: %v", err)
		}
	})
	return dir
}
