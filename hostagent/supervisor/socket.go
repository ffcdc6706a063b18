package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/unixpath"
)

// The supervisor's socket. The previous release listened on the abstract name
// @postern-supervisor-<pid>-<start time>: abstract names have no permissions and every
// local user reads them in /proc/net/unix, so anyone could bind the names the next
// supervisors would take (they could not start, and neither could any command) or flood one
// with connections. A supervisor now listens on a path socket with a random name in its
// supervisor directory, which only the hostagent's user can reach (0700, in the 0700 data
// dir); only if that directory is not private or the path does not fit in sun_path, on an
// abstract name with 128 random bits. A name it cannot bind is tried again under another.
// The name travels in the supervisor record, so an agent reaches a supervisor of either
// kind — the previous release's included — by what its records say.

const (
	// socketFilePrefix and socketFileSuffix frame a path socket's random name.
	socketFilePrefix = "s-"
	socketFileSuffix = ".sock"
	// abstractSocketPrefix starts the abstract fallback's name.
	abstractSocketPrefix = "@postern-supervisor-"
	// listenAttempts bounds the names a supervisor tries before it gives up.
	listenAttempts = 8
)

// listenSupervisor listens on a new socket for the supervisor keeping its records in dir.
func listenSupervisor(dir string) (*net.UnixListener, string, error) {
	private := privateDir(dir)
	var errs []error
	for range listenAttempts {
		name := socketCandidate(dir, private)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
		if err == nil {
			return ln, name, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, syscall.EADDRINUSE) {
			private = false // the directory is in the way: the abstract name next
		}
	}
	return nil, "", fmt.Errorf("supervisor: listen: no socket after %d names: %w", listenAttempts, errors.Join(errs...))
}

// socketCandidate is a new random name: a path in dir if private allows and it fits, else
// an abstract one.
func socketCandidate(dir string, private bool) string {
	var b [16]byte
	rand.Read(b[:])
	if private {
		if path := filepath.Join(dir, socketFilePrefix+hex.EncodeToString(b[:8])+socketFileSuffix); unixpath.Check(path, "") == nil {
			return path
		}
	}
	return abstractSocketPrefix + hex.EncodeToString(b[:])
}

// privateDir reports whether only this process's user can reach into dir: a directory it
// owns that grants nothing to group or others.
func privateDir(dir string) bool {
	var st unix.Stat_t
	if unix.Lstat(dir, &st) != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == os.Geteuid() && st.Mode&0o077 == 0
}

// removeStaleSockets removes the socket files in dir nobody listens on: those of
// supervisors that were killed (one that exits removes its own).
func removeStaleSockets(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if e.Type() != os.ModeSocket || !strings.HasPrefix(name, socketFilePrefix) || !strings.HasSuffix(name, socketFileSuffix) {
			continue
		}
		path := filepath.Join(dir, name)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		cancel()
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			os.Remove(path)
		}
	}
}
