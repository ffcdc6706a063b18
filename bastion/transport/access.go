package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/postern-dev/postern/internal/peercred"
	"github.com/postern-dev/postern/internal/ratelog"
)

// Who may connect to a local socket is decided at accept, from the kernel's word on the peer
// (SO_PEERCRED), before a byte of the connection is read: the owners (root and the daemon's
// own uid) always, the uids of configured local actors on the MCP socket, nobody else. Each
// uid also has a bound on its open connections, and the last slots of the socket's total are
// kept for the owners, so other users together cannot lock the operator out.

// Defaults of UnixAccess.
const (
	DefaultMaxLocalConns       = 1024
	DefaultMaxLocalConnsPerUID = 128
)

// UnixAccess says who may connect to a local socket and how many connections each may hold.
type UnixAccess struct {
	// UIDs may connect besides the owners (root and the daemon's effective uid). With any, the
	// socket is made 0666 and the uid check at accept is what keeps other users out; without,
	// it is 0600.
	UIDs []int
	// MaxConns bounds the socket's open connections. Default DefaultMaxLocalConns. The last
	// MaxConns/16 of them (at least one) only the owners may take.
	MaxConns int
	// MaxConnsPerUID bounds the open connections of one uid other than the owners. Default
	// DefaultMaxLocalConnsPerUID.
	MaxConnsPerUID int
	// Logger receives refusals (a few lines per reason and minute, then a summary with the
	// count of those not logged; see internal/ratelog). Default: discard.
	Logger *slog.Logger
	// Where names the socket in refusal logs and counts. Default WhereMCPSocket.
	Where string
	// CountRefusal is told of every refused connection. Default: none.
	CountRefusal CountRefusal
}

// ErrSocketDirClosed is returned by ListenUnix when other uids may connect but a directory
// above the socket does not let them reach it.
var ErrSocketDirClosed = errors.New("socket directory not searchable by other users")

// Shared reports whether uids other than the owners may connect.
func (a UnixAccess) Shared() bool {
	return slices.ContainsFunc(a.UIDs, func(uid int) bool { return !isOwner(uid) })
}

func isOwner(uid int) bool { return uid == 0 || uid == os.Geteuid() }

// UnixListener is a local socket's listener: it admits connections by peer uid and bounds
// them per uid.
type UnixListener struct {
	net.Listener
	path     string
	allowed  atomic.Pointer[map[int]bool] // besides the owners; replaced by AllowUIDs
	max      int
	reserved int // of max, for the owners
	perUID   int
	refusals *ratelog.Logger

	mu    sync.Mutex // guards open and byUID
	open  map[net.Conn]int
	byUID map[int]int
}

func newUnixListener(l net.Listener, path string, a UnixAccess) *UnixListener {
	where := a.Where
	if where == "" {
		where = WhereMCPSocket
	}
	g := &UnixListener{
		Listener: l, path: path, max: a.MaxConns, perUID: a.MaxConnsPerUID,
		refusals: newRefusalLog(loggerOrDiscard(a.Logger), where, a.CountRefusal),
		open:     map[net.Conn]int{}, byUID: map[int]int{},
	}
	if g.max <= 0 {
		g.max = DefaultMaxLocalConns
	}
	if g.perUID <= 0 {
		g.perUID = DefaultMaxLocalConnsPerUID
	}
	g.reserved = max(1, g.max/16)
	g.allowed.Store(uidSet(a.UIDs))
	return g
}

func uidSet(uids []int) *map[int]bool {
	m := make(map[int]bool, len(uids))
	for _, uid := range uids {
		m[uid] = true
	}
	return &m
}

// AllowUIDs replaces the uids that may connect besides the owners (a config reload): new
// connections are admitted by the new set; open ones stay (they were admitted, and a
// removed local actor's calls are refused by policy, which knows no such actor). The
// socket's mode follows: 0666 once other uids may connect — if every directory above it
// lets them search it, else nothing changes and the error says why —, 0600 once none may.
func (g *UnixListener) AllowUIDs(uids []int) error {
	shared := UnixAccess{UIDs: uids}.Shared()
	mode := os.FileMode(0o600)
	if shared {
		if err := checkReachable(g.path); err != nil {
			return err
		}
		mode = 0o666
	}
	if err := os.Chmod(g.path, mode); err != nil {
		return fmt.Errorf("transport: chmod %s: %w", g.path, err)
	}
	g.allowed.Store(uidSet(uids))
	return nil
}

// CheckUIDs reports what AllowUIDs would refuse, changing nothing.
func (g *UnixListener) CheckUIDs(uids []int) error {
	if (UnixAccess{UIDs: uids}).Shared() {
		return checkReachable(g.path)
	}
	return nil
}

// Accept returns the next admitted connection. A refused one is closed before anything is
// read from it, logged, and Accept waits for the next.
func (g *UnixListener) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := peercred.Read(c)
		if err != nil {
			c.Close()
			g.refused(ReasonPeerCredentials, -1, -1, err.Error())
			continue
		}
		uid := int(cred.Uid)
		if reason, detail := g.admit(c, uid); reason != "" {
			c.Close()
			g.refused(reason, uid, int(cred.Pid), detail)
			continue
		}
		return c, nil
	}
}

// Close closes the listener and logs the summary of the refusals not logged yet.
func (g *UnixListener) Close() error {
	err := g.Listener.Close()
	g.refusals.Close()
	return err
}

// admit takes a slot for c, or says why not: a Reason constant and the details.
func (g *UnixListener) admit(c net.Conn, uid int) (reason, detail string) {
	owner := isOwner(uid)
	if !owner && !(*g.allowed.Load())[uid] {
		return ReasonUIDNotAllowed, "the uid is neither root, the daemon's user nor a configured local actor"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	full := func() (string, string) {
		switch {
		case len(g.open) >= g.max:
			return ReasonSocketFull, fmt.Sprintf("the socket has %d connections open", len(g.open))
		case !owner && len(g.open) >= g.max-g.reserved:
			return ReasonKeptForOwners, fmt.Sprintf("the last %d of %d connections are kept for root and the daemon's user", g.reserved, g.max)
		case !owner && g.byUID[uid] >= g.perUID:
			return ReasonUIDLimit, fmt.Sprintf("the uid has %d connections open (max_local_conns_per_uid)", g.byUID[uid])
		}
		return "", ""
	}
	if reason, _ := full(); reason != "" {
		g.pruneLocked()
	}
	if reason, detail := full(); reason != "" {
		return reason, detail
	}
	g.open[c] = uid
	g.byUID[uid]++
	return "", ""
}

// pruneLocked forgets the connections the server has closed. A closed connection refuses
// Control, which is how they are told apart: slots are counted without wrapping the
// connection (the server's handlers need the *net.UnixConn itself).
func (g *UnixListener) pruneLocked() {
	for c, uid := range g.open {
		if !isOpen(c) {
			delete(g.open, c)
			if g.byUID[uid]--; g.byUID[uid] == 0 {
				delete(g.byUID, uid)
			}
		}
	}
}

func isOpen(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	return raw.Control(func(uintptr) {}) == nil
}

// refused logs and counts a refusal (internal/ratelog bounds the lines).
func (g *UnixListener) refused(reason string, uid, pid int, detail string) {
	g.refusals.Log(slog.LevelWarn, reason, "local connection refused", "socket", g.path, "uid", uid, "pid", pid, "detail", detail)
}

// checkReachable verifies that other users can search every directory above path (the
// execute bit for others or for the group): otherwise the uids the socket admits could not
// reach it, and would be told only "permission denied".
func checkReachable(path string) error {
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("transport: %s: %w", dir, err)
		}
		if fi.Mode().Perm()&0o011 == 0 {
			return fmt.Errorf("transport: %s (mode %04o): %w: configured local actors of other uids cannot reach %s; use a directory they can search, such as /run/postern (0755)",
				dir, fi.Mode().Perm(), ErrSocketDirClosed, path)
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}
