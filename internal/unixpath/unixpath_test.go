package unixpath

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckMatchesTheKernel: a path Check accepts can be bound, and the first length it
// refuses is the first the kernel refuses.
func TestCheckMatchesTheKernel(t *testing.T) {
	dir := t.TempDir()
	if len(dir)+2 > Max {
		t.Skipf("TMPDIR is too long to build a %d-byte path under it", Max)
	}
	for _, n := range []int{Max, Max + 1} {
		name := strings.Repeat("s", n-len(dir)-1)
		path := filepath.Join(dir, name)
		if len(path) != n {
			t.Fatalf("built a %d-byte path, want %d", len(path), n)
		}
		checkErr := Check(path, "state_dir")
		l, listenErr := net.Listen("unix", path)
		if l != nil {
			l.Close()
		}
		if (checkErr == nil) != (listenErr == nil) {
			t.Errorf("%d bytes: Check says %v, the kernel %v", n, checkErr, listenErr)
		}
		if checkErr != nil && (!errors.Is(checkErr, ErrTooLong) || !strings.Contains(checkErr.Error(), "use a shorter state_dir")) {
			t.Errorf("%d bytes: %v: want ErrTooLong naming the remedy", n, checkErr)
		}
	}
}
