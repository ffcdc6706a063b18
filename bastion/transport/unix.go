package transport

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/postern-dev/postern/internal/peercred"
	"github.com/postern-dev/postern/internal/unixpath"
)

// ErrSocketInUse is returned by ListenUnix when a live server already listens on the path.
var ErrSocketInUse = errors.New("socket in use by a running server")

// ListenUnix creates the socket at path and returns its listener, which admits peers by
// access (see UnixAccess): a stale socket (nothing listening) is removed, anything else at
// path is left alone and reported. A socket only the owners may use is made 0600 in a
// directory created 0700 if missing; one that other uids may use is made 0666 in a directory
// created 0755 if missing, and every directory above it must let other users search it.
func ListenUnix(path string, access UnixAccess) (*UnixListener, error) {
	if err := unixpath.Check(path, "state_dir"); err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	mode, dirMode := os.FileMode(0o600), os.FileMode(0o700)
	if access.Shared() {
		mode, dirMode = 0o666, 0o755
	}
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, fmt.Errorf("transport: socket dir: %w", err)
	}
	if access.Shared() {
		if err := checkReachable(path); err != nil {
			return nil, err
		}
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", path, err)
	}
	// The socket exists with umask permissions until this chmod; for a private socket the
	// 0700 directory keeps other users out during that window, for a shared one the uid check
	// at accept does.
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("transport: chmod %s: %w", path, err)
	}
	return newUnixListener(l, path, access), nil
}

func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("transport: %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("transport: %s exists and is not a socket; not removing it", path)
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("transport: %s: %w", path, ErrSocketInUse)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("transport: probing %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("transport: removing stale socket: %w", err)
	}
	return nil
}

// UnixOptions configures UnixServer.
type UnixOptions struct {
	// LocalActor names the actor for a peer uid. Default "local:<user name>" from os/user,
	// falling back to "local:uid<N>".
	LocalActor func(uid int) string
	// MaxBodyBytes bounds a request body (413 above it). Default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout and MaxBodiesPerActor are HTTPOptions'; the actor is the peer's uid's.
	BodyTimeout       time.Duration
	MaxBodiesPerActor int
	// Logger receives connection and refusal events (never a token). Default: discard.
	Logger *slog.Logger
	// CountRefusal is told of every refusal (WhereMCPSocket). Default: none.
	CountRefusal CountRefusal
}

// peerKey is the context key of the peer facts recorded for a unix connection.
type peerKey struct{}

// peer is what the kernel says about a unix-socket connection, read once when it is accepted.
type peer struct {
	actor   string
	uid     int
	process peerProcess
	err     error // why the peer could not be identified; its requests are refused
}

// localBearer is the synthetic token injected so that go-sdk's bearer middleware carries the
// kernel-derived Caller into tool handlers. It proves nothing: the verifier ignores it and
// reads the connection's credentials from the request context.
const localBearer = "unix-peer-credentials"

// UnixServer returns an *http.Server for the unix socket. Its ConnContext records each
// connection's peer credentials (SO_PEERCRED) and resolves the agent process from /proc; its
// handler attaches the Caller for every request from those kernel facts alone. Any
// Authorization header the client sends is discarded. Serve it with srv.Serve(ListenUnix(..)).
func UnixServer(mcpHandler http.Handler, opts UnixOptions) *http.Server {
	logger := loggerOrDiscard(opts.Logger)
	refusals := newRefusalLog(logger, WhereMCPSocket, opts.CountRefusal)
	actorFor := opts.LocalActor
	if actorFor == nil {
		actorFor = defaultLocalActor
	}
	procs := procFS{root: "/proc"}

	verifier := func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p, ok := ctx.Value(peerKey{}).(*peer)
		if !ok || p.err != nil {
			return nil, fmt.Errorf("%w: peer credentials unavailable", auth.ErrInvalidToken)
		}
		c, err := p.callerFor(r.Header.Values(BridgeParentHeader))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", auth.ErrInvalidToken, err)
		}
		return TokenInfoFor(c), nil
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Authorization")
		mcpHandler.ServeHTTP(w, r)
	})
	authenticated := auth.RequireBearerToken(verifier, &auth.RequireBearerTokenOptions{
		AllowMissingExpiration: true,
	})(limitBody(inner, bodyLimits{max: opts.MaxBodyBytes, timeout: opts.BodyTimeout, perActor: opts.MaxBodiesPerActor}, refusals))

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+localBearer)
		authenticated.ServeHTTP(w, r)
	})
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          ServerErrorLog(logger, WhereMCPSocket, opts.CountRefusal),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			p := identifyPeer(c, procs, actorFor)
			if p.err != nil {
				refusals.Log(slog.LevelWarn, ReasonPeerUnidentified, "unix peer not identified; its requests are refused", "error", p.err)
			} else {
				logger.Debug("unix peer", "actor", p.actor, "pid", p.process.self.PID, "scope", p.process.self.Scope)
			}
			return context.WithValue(ctx, peerKey{}, p)
		},
	}
}

// identifyPeer reads SO_PEERCRED and the peer process and its parent from /proc. Done at
// accept time, while the peer is connected, so the pid names the process that opened the
// connection.
func identifyPeer(c net.Conn, procs procFS, actorFor func(uid int) string) *peer {
	cred, err := peercred.Read(c)
	if err != nil {
		return &peer{err: err}
	}
	process, err := procs.resolvePeer(int(cred.Pid))
	if err != nil {
		return &peer{err: err}
	}
	uid := int(cred.Uid)
	return &peer{actor: actorFor(uid), uid: uid, process: process}
}

// callerFor is the Caller of one request on the peer's connection. claims are the request's
// BridgeParentHeader values: none, the peer is the agent; one, the peer is a stdio bridge
// and the agent is its parent, if the kernel agrees.
func (p *peer) callerFor(claims []string) (Caller, error) {
	var claim string
	switch len(claims) {
	case 0:
	case 1:
		claim = claims[0]
	default:
		return Caller{}, fmt.Errorf("%s given %d times; a bridge names one parent", BridgeParentHeader, len(claims))
	}
	agent, err := p.process.agent(claim)
	if err != nil {
		return Caller{}, err
	}
	return Caller{
		Actor:        p.actor,
		Scope:        agent.Scope,
		Local:        true,
		PID:          agent.PID,
		UID:          p.uid,
		Exe:          agent.Exe,
		Cmdline:      agent.Cmdline,
		StartTicks:   agent.StartTicks,
		Bridged:      claim != "",
		BridgeBinary: claim != "" && p.process.sameBinary,
	}, nil
}

func defaultLocalActor(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return "local:" + u.Username
	}
	return "local:uid" + strconv.Itoa(uid)
}
