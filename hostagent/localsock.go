package hostagent

// The local control socket: the postern-control protocol on a unix socket, for operators on
// the host (who can query markers while the bastion is down) and for commands reporting
// their own checkpoints. Anyone may connect (mode 0666); what a peer may do follows from its
// SO_PEERCRED credentials: uid 0 or the hostagent's own uid is an operator, any other peer
// may only report checkpoints, which the executor accepts only from the execution's own
// process tree. How many connections a peer may hold follows from them too (LocalLimits):
// some are kept for operators, and each other account gets a share, so no account can lock
// operators or the other accounts' commands out.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/peercred"
	"github.com/postern-dev/postern/internal/ratelog"
	"github.com/postern-dev/postern/internal/unixpath"
)

// LocalLimits bound the connections to the local socket, which every local account can
// open. Config documents the defaults (control_socket_*), DefaultConfig sets them.
type LocalLimits struct {
	// MaxConns bounds every peer's connections together.
	MaxConns int
	// OperatorConns of MaxConns are only for operators; the other peers share the rest.
	OperatorConns int
	// MaxConnsPerUID bounds the connections of each peer account that is not an operator.
	MaxConnsPerUID int
}

// defaultLocalLimits are DefaultConfig's.
var defaultLocalLimits = LocalLimits{MaxConns: 64, OperatorConns: 16, MaxConnsPerUID: 8}

// connLimiter hands out connection slots by LocalLimits.
type connLimiter struct {
	limits LocalLimits

	mu     sync.Mutex // guards total, others and perUID
	total  int
	others int // connections of peers that are not operators
	perUID map[uint32]int
}

func newConnLimiter(limits LocalLimits) *connLimiter {
	return &connLimiter{limits: limits, perUID: map[uint32]int{}}
}

// acquire takes a slot for a peer (its uid, and whether it is an operator), or says why
// there is none; release gives it back.
func (l *connLimiter) acquire(uid uint32, operator bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total >= l.limits.MaxConns:
		return fmt.Errorf("%d connections are open, the limit", l.total)
	case operator:
	case l.others >= l.limits.MaxConns-l.limits.OperatorConns:
		return fmt.Errorf("the other %d connections are kept for operators", l.limits.OperatorConns)
	case l.perUID[uid] >= l.limits.MaxConnsPerUID:
		return fmt.Errorf("uid %d has %d connections open, the limit per account", uid, l.perUID[uid])
	default:
		l.others++
		l.perUID[uid]++
	}
	l.total++
	return nil
}

func (l *connLimiter) release(uid uint32, operator bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if operator {
		return
	}
	l.others--
	if l.perUID[uid]--; l.perUID[uid] == 0 {
		delete(l.perUID, uid)
	}
}

// ErrSocketInUse: a live server already listens on the socket path.
var ErrSocketInUse = errors.New("hostagent: control socket in use")

// ListenLocal listens on the unix socket at path with mode 0666 (authorization is by peer
// credentials). A stale socket left by a previous run is removed; a live one is
// ErrSocketInUse, and a path that is not a socket is left alone and is an error.
func ListenLocal(path string) (net.Listener, error) {
	if err := unixpath.Check(path, "data_dir"); err != nil {
		return nil, fmt.Errorf("hostagent: control socket: %w", err)
	}
	// The directory must let every account reach the socket (0755); the socket itself is
	// guarded by peer credentials.
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("hostagent: control socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("hostagent: control socket %s exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("hostagent: probe control socket %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("hostagent: remove stale control socket: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("hostagent: control socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("hostagent: listen on control socket: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("hostagent: control socket mode: %w", err)
	}
	return ln, nil
}

// ServeLocal serves the control protocol on ln within limits until ctx ends, then closes ln
// and every connection and returns once their goroutines have finished. It returns nil when
// ctx ended it and the accept error otherwise.
func ServeLocal(ctx context.Context, ln net.Listener, b controlBackend, limits LocalLimits, logger *slog.Logger) error {
	cs := newControlServer(b, logger)
	cs.localLimits = limits
	return cs.serveLocal(ctx, ln)
}

func (cs *controlServer) serveLocal(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(ctx, func() { ln.Close() }) // ends Accept when ctx ends
	defer ln.Close()
	// Every account can connect: refusals are logged within bounds; the summary when this
	// returns (after every connection ended) counts them all.
	refusals := ratelog.New(cs.logger, ratelog.Options{Where: whereControlSocket})
	defer refusals.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs first: closes every connection (serveLocalConn), so wg.Wait returns
	slots := newConnLimiter(cs.localLimits)
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				cs.logger.Warn("control socket accept failed; retrying", "err", err, "backoff", backoff)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
				}
				continue
			}
			return fmt.Errorf("hostagent: control socket accept: %w", err)
		}
		backoff = 0
		// The peer's credentials come with the connection (no I/O): the slot depends on them.
		caller, uid, err := localCaller(c)
		if err != nil {
			refusals.Log(slog.LevelWarn, reasonPeerCredentials, "control socket: refusing peer", "err", err)
			c.Close()
			continue
		}
		if err := slots.acquire(uid, caller.operator); err != nil {
			refusals.Log(slog.LevelWarn, reasonBusy, "control socket: refusing connection", "uid", uid, "peer_pid", caller.peerPID, "detail", err)
			cs.refuseBusy(c, err)
			continue
		}
		wg.Go(func() {
			defer slots.release(uid, caller.operator)
			cs.serveLocalConn(ctx, c, caller, refusals)
		})
	}
}

func (cs *controlServer) refuseBusy(c net.Conn, why error) {
	cw := &controlWriter{w: c}
	c.SetWriteDeadline(time.Now().Add(time.Second))
	cw.send(hostproto.NewErrorLine(hostproto.CodeBusy, "no connection slot: "+why.Error()+"; close a connection or retry later"))
	c.Close()
}

func (cs *controlServer) serveLocalConn(ctx context.Context, c net.Conn, caller controlCaller, refusals *ratelog.Logger) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := cs.serve(ctx, c, caller); err != nil && ctx.Err() == nil {
		if caller.operator {
			cs.logger.Info("control connection ended", "peer_pid", caller.peerPID, "operator", caller.operator, "err", err)
			return
		}
		refusals.Log(slog.LevelInfo, reasonConnectionError, "control connection ended", "peer_pid", caller.peerPID, "operator", caller.operator, "err", err)
	}
}

// localCaller derives the caller, and its uid, from the peer's credentials.
func localCaller(c net.Conn) (controlCaller, uint32, error) {
	cred, err := peercred.Read(c)
	if err != nil {
		return controlCaller{}, 0, err
	}
	return controlCaller{
		transport: "local",
		operator:  cred.Uid == 0 || int(cred.Uid) == os.Geteuid(),
		peerPID:   int(cred.Pid),
		peerUID:   cred.Uid,
	}, cred.Uid, nil
}
