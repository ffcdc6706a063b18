package hostagent

// The local control socket: the postern-control protocol on a unix socket, for operators on
// the host (who can query markers while the bastion is down) and for commands reporting
// their own checkpoints. Anyone may connect (mode 0666); what a peer may do follows from its
// SO_PEERCRED credentials: uid 0 or the hostagent's own uid is an operator, any other peer
// may only report checkpoints, which the executor accepts only from the execution's own
// process tree.

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

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/hostagent/client"
)

// maxLocalConns bounds concurrent connections to the local socket, which any local user can
// open.
const maxLocalConns = 64

// ErrSocketInUse: a live server already listens on the socket path.
var ErrSocketInUse = errors.New("hostagent: control socket in use")

// ListenLocal listens on the unix socket at path with mode 0666 (authorization is by peer
// credentials). A stale socket left by a previous run is removed; a live one is
// ErrSocketInUse, and a path that is not a socket is left alone and is an error.
func ListenLocal(path string) (net.Listener, error) {
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

// ServeLocal serves the control protocol on ln until ctx ends, then closes ln and every
// connection and returns once their goroutines have finished. It returns nil when ctx ended
// it and the accept error otherwise.
func ServeLocal(ctx context.Context, ln net.Listener, b controlBackend, logger *slog.Logger) error {
	return newControlServer(b, logger).serveLocal(ctx, ln)
}

func (cs *controlServer) serveLocal(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(ctx, func() { ln.Close() }) // ends Accept when ctx ends
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs first: closes every connection (serveLocalConn), so wg.Wait returns
	slots := make(chan struct{}, maxLocalConns)
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
		select {
		case slots <- struct{}{}:
		default:
			cs.refuseBusy(c)
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			cs.serveLocalConn(ctx, c)
		})
	}
}

func (cs *controlServer) refuseBusy(c net.Conn) {
	cw := &controlWriter{w: c}
	c.SetWriteDeadline(time.Now().Add(time.Second))
	cw.send(errorReply(client.CodeBusy, fmt.Sprintf("more than %d connections", maxLocalConns)))
	c.Close()
}

func (cs *controlServer) serveLocalConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	caller, err := localCaller(c)
	if err != nil {
		cs.logger.Warn("control socket: refusing peer", "err", err)
		return
	}
	if err := cs.serve(ctx, c, caller); err != nil && ctx.Err() == nil {
		cs.logger.Info("control connection ended", "peer_pid", caller.peerPID, "operator", caller.operator, "err", err)
	}
}

// localCaller derives the caller from the peer's credentials.
func localCaller(c net.Conn) (controlCaller, error) {
	cred, err := peerCredentials(c)
	if err != nil {
		return controlCaller{}, err
	}
	return controlCaller{
		transport: "local",
		operator:  cred.Uid == 0 || int(cred.Uid) == os.Geteuid(),
		peerPID:   int(cred.Pid),
	}, nil
}

// peerCredentials returns the credentials the peer had when it connected (SO_PEERCRED).
func peerCredentials(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("peer credentials: %T is not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, fmt.Errorf("peer credentials: %w", credErr)
	}
	return cred, nil
}
