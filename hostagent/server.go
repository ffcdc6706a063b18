// Package hostagent is the SSH server that runs on every fleet machine: it authenticates the
// bastion (and operators) by public key or user certificate, accepts exactly one kind of
// work — an exec request carrying a valid execution id, or the postern-control subsystem —
// and hands it, validated and bounded, to a Handler that runs it under a marker.
//
// Invariants of the SSH layer: no session reaches the Handler without a verified key, an
// allowed account, an allowlisted and bounded environment, a bounded command and (for exec)
// a valid execution id; ptys, shells, forwarding of any kind, X11 and other subsystems are
// refused; every goroutine the server starts is waited for by Close.
package hostagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/ratelog"
	"github.com/postern-dev/postern/internal/version"
	"github.com/postern-dev/postern/markers"
)

// ErrServerClosed is returned by Serve when the server was closed before or while serving.
var ErrServerClosed = errors.New("hostagent: server closed")

// Handler runs validated work. The SSH layer has already authenticated the client, resolved
// the account and validated the request; the Handler owns the session from then on.
type Handler interface {
	// Exec runs the command and writes its output and exit status (s.Exit) to s. ctx is
	// cancelled when the session or connection closes or the server shuts down; that ends
	// the attachment, not necessarily the command.
	Exec(ctx context.Context, s gliderssh.Session, req ExecRequest)
	// Control serves the postern-control subsystem (JSON lines) to caller.
	Control(ctx context.Context, s gliderssh.Session, caller Identity)
}

// ExecRequest is a validated exec request.
type ExecRequest struct {
	Account Account
	Command string   // the exec string, run as Config.Shell -c Command
	Env     []string // allowlisted KEY=VALUE, sorted; includes POSTERN_EXECUTION_ID (also when assigned)
	// ExecutionID is "ex_" + a canonical ULID.
	ExecutionID string
	// Assigned reports that the client sent no id and the hostagent made one
	// (MissingExecutionID = "assign").
	Assigned     bool
	OperationKey string        // POSTERN_OPERATION_KEY, "" if none
	Timeout      time.Duration // POSTERN_TIMEOUT_S, 0 if none
	// Cwd is the working directory: POSTERN_CWD, or the account's home.
	Cwd        string
	RemoteAddr net.Addr
	// Identity is who asks: the execution belongs to it, and another identity's execution
	// under the same id is not this request's to see.
	Identity Identity
}

// Server is the hostagent SSH server. Create it with NewServer, run it with Serve, stop it
// with Shutdown or Close.
type Server struct {
	// cfg is the config the server started with: what a reload cannot change (listen, the
	// host key, idle_timeout) is read from it; what it can, from live.
	cfg      Config
	handler  Handler
	logger   *slog.Logger
	glider   *gliderssh.Server
	hostKey  gossh.Signer
	hostCert *hostCert // nil without a host certificate
	// live is what a reload may change (reload.go). A connection, a session and a request
	// each read it once, when they begin, and keep what they read.
	live atomic.Pointer[liveSettings]
	// refusals logs failed handshakes and logins, which anyone who reaches the port can
	// cause, within bounds (internal/ratelog); the summary at Close counts them all.
	refusals *ratelog.Logger

	// ctx is the parent of every handler context; cancelled by Close.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// wg counts every goroutine the server runs (connections, channel loops, handlers);
	// active counts handler goroutines only, which Shutdown lets finish.
	wg     sync.WaitGroup
	active sync.WaitGroup
	// keyChecks starts the key check loop (reload.go) with the first Serve.
	keyChecks sync.Once

	mu        sync.Mutex // guards closing, listeners, conns; wg.Add happens under mu
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
}

// serverConn is an accepted TCP connection; authenticated is set once a key signed the login,
// which stops the handshake timer from closing it; sessions counts its open session channels
// (Config.MaxSessions).
type serverConn struct {
	net.Conn
	authenticated atomic.Bool
	sessions      atomic.Int64
	// login is who signed in, with which key: checked again whenever the key files are
	// (reload.go). Set once, before authenticated.
	login atomic.Pointer[connLogin]
	// revoked is set, before the connection is closed, when its key is no longer
	// authorized: no new channel opens on it from then on.
	revoked atomic.Bool
}

type serverConnKey struct{}

// NewServer loads (or creates) the host key and prepares a server; it validates cfg first.
func NewServer(cfg Config, h Handler, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errors.New("hostagent: nil Handler")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	hostKey, err := LoadOrCreateHostKey(cfg.HostKeyPath())
	if err != nil {
		return nil, err
	}
	var cert *hostCert
	if cfg.HostCertificateFile != "" {
		if cert, err = newHostCert(cfg.HostCertificateFile, hostKey, logger); err != nil {
			return nil, err
		}
	}
	live, err := newLiveSettings(cfg, logger)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	srv := &Server{
		cfg:       cfg,
		handler:   h,
		logger:    logger,
		hostKey:   hostKey,
		hostCert:  cert,
		refusals:  ratelog.New(logger, ratelog.Options{Where: whereSSH}),
		ctx:       ctx,
		cancel:    cancel,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*serverConn]struct{}{},
	}
	srv.live.Store(live)
	srv.glider = &gliderssh.Server{
		Version:     "Postern",
		HostSigners: []gliderssh.Signer{hostKey},
		IdleTimeout: cfg.IdleTimeout,
		// Always set: with no auth handler at all gliderlabs sets NoClientAuth and lets
		// everyone in. Password and keyboard-interactive handlers stay nil, so x/crypto
		// offers only publickey.
		PublicKeyHandler: srv.publicKeyHandler,
		ServerConfigCallback: func(ctx gliderssh.Context) *gossh.ServerConfig {
			sc := &gossh.ServerConfig{
				VerifiedPublicKeyCallback: srv.verifiedKey(ctx),
				AuthLogCallback: func(conn gossh.ConnMetadata, method string, err error) {
					if err != nil && method != "none" {
						logger.Debug("authentication attempt failed", "user", boundForLog(conn.User()),
							"remote", conn.RemoteAddr(), "method", boundForLog(method), "err", err)
					}
				},
			}
			// Besides the plain key (HostSigners): its type differs, so both are offered and
			// the bastion asks for the one it trusts.
			if srv.hostCert != nil {
				sc.AddHostKey(srv.hostCert.current())
			}
			return sc
		},
		ConnCallback: func(ctx gliderssh.Context, c net.Conn) net.Conn {
			ctx.SetValue(serverConnKey{}, c)
			return c
		},
		ConnectionFailedCallback: func(c net.Conn, err error) {
			srv.refusals.Log(slog.LevelInfo, reasonHandshake, "ssh handshake failed", "remote", c.RemoteAddr(), "err", err)
		},
		// Explicit maps so that nothing registered in gliderlabs' global defaults applies:
		// of global requests only the hello (no tcpip-forward, …), only session channels.
		RequestHandlers: map[string]gliderssh.RequestHandler{hostproto.HelloRequest: srv.hello},
		ChannelHandlers: map[string]gliderssh.ChannelHandler{
			"session": srv.handleSessionChannel,
			"default": srv.rejectChannel,
		},
		SubsystemHandlers: map[string]gliderssh.SubsystemHandler{},
	}
	return srv, nil
}

// HostPublicKey is the server's host public key, the value clients pin.
func (srv *Server) HostPublicKey() gossh.PublicKey { return srv.hostKey.PublicKey() }

// HostKeyFingerprint is the SHA256 fingerprint of the server's host key.
func (srv *Server) HostKeyFingerprint() string { return HostKeyFingerprint(srv.hostKey) }

// Serve accepts connections on ln until ctx is done or the server is closed. When ctx is done
// it closes the server (see Close) and returns nil; after Close or Shutdown it returns nil;
// if called on a closed server it returns ErrServerClosed. Any other accept error closes the
// server and is returned.
func (srv *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv.mu.Lock()
	if srv.closing {
		srv.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	srv.listeners[ln] = struct{}{}
	srv.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	srv.logger.Info("serving ssh", "addr", ln.Addr().String(), "host_key", srv.HostKeyFingerprint())
	srv.startKeyChecks()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				srv.Close()
				return nil
			}
			srv.mu.Lock()
			closing := srv.closing
			srv.mu.Unlock()
			if closing {
				return nil
			}
			if isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				srv.logger.Warn("accept failed; retrying", "err", err, "backoff", backoff)
				select {
				case <-time.After(backoff):
					continue
				case <-ctx.Done():
					continue // the next Accept fails and takes the ctx.Err() branch
				}
			}
			srv.Close()
			return fmt.Errorf("hostagent: accept: %w", err)
		}
		backoff = 0
		srv.serveConn(c)
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (srv *Server) serveConn(c net.Conn) {
	sc := &serverConn{Conn: c}
	srv.mu.Lock()
	if srv.closing {
		srv.mu.Unlock()
		c.Close()
		return
	}
	srv.conns[sc] = struct{}{}
	srv.wg.Add(1)
	srv.mu.Unlock()
	go func() {
		defer srv.wg.Done()
		// gliderlabs resets the connection deadline on every read and write, so a handshake
		// deadline set on the conn would be overwritten; close it from a timer instead.
		timer := time.AfterFunc(srv.live.Load().cfg.HandshakeTimeout, func() {
			if !sc.authenticated.Load() {
				srv.refusals.Log(slog.LevelInfo, reasonHandshakeTimeout, "closing connection: handshake timeout", "remote", c.RemoteAddr())
				sc.Close()
			}
		})
		srv.glider.HandleConn(sc)
		timer.Stop()
		sc.Close()
		srv.mu.Lock()
		delete(srv.conns, sc)
		srv.mu.Unlock()
	}()
}

// verifiedKey runs after a key's signature checked out: it records the key and marks the
// connection authenticated.
func (srv *Server) verifiedKey(ctx gliderssh.Context) func(gossh.ConnMetadata, gossh.PublicKey, *gossh.Permissions, string) (*gossh.Permissions, error) {
	record := verifiedKeyCallback(ctx)
	return func(meta gossh.ConnMetadata, key gossh.PublicKey, perms *gossh.Permissions, algo string) (*gossh.Permissions, error) {
		perms, err := record(meta, key, perms, algo)
		if cert, ok := key.(*gossh.Certificate); ok && err == nil {
			// As sshd's "Accepted publickey … ID … (serial N) CA …": which certificate, of
			// which CA, each login used.
			srv.logger.Info("login with a user certificate", "user", boundForLog(meta.User()), "remote", meta.RemoteAddr(),
				"key_id", boundForLog(cert.KeyId), "serial", cert.Serial, "ca", gossh.FingerprintSHA256(cert.SignatureKey),
				"key", gossh.FingerprintSHA256(cert.Key))
		}
		if err == nil {
			if sc, ok := ctx.Value(serverConnKey{}).(*serverConn); ok {
				sc.login.Store(&connLogin{user: meta.User(), key: key})
				sc.authenticated.Store(true)
			}
		}
		return perms, err
	}
}

// startGoroutine registers a goroutine with wg (and active for handlers) unless the server is
// closing. Registering under mu orders every Add before Close's Wait.
func (srv *Server) startGoroutine(handler bool) bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.closing {
		return false
	}
	srv.wg.Add(1)
	if handler {
		srv.active.Add(1)
	}
	return true
}

// Close closes the listeners and every connection at once, cancels handler contexts, and
// waits for every goroutine the server started. Commands the Handler detached keep running.
func (srv *Server) Close() error {
	srv.mu.Lock()
	srv.closing = true
	var errs []error
	for ln := range srv.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
		delete(srv.listeners, ln)
	}
	for c := range srv.conns {
		c.Close()
	}
	srv.mu.Unlock()
	srv.cancel(ErrServerClosed)
	srv.wg.Wait()
	srv.refusals.Close()
	return errors.Join(errs...)
}

// Shutdown stops accepting connections and sessions, waits until the running handlers have
// returned or ctx is done, then closes the server. It returns ctx.Err() if it had to cut
// handlers short.
func (srv *Server) Shutdown(ctx context.Context) error {
	srv.mu.Lock()
	srv.closing = true
	for ln := range srv.listeners {
		ln.Close()
		delete(srv.listeners, ln)
	}
	srv.mu.Unlock()

	handlersDone := make(chan struct{})
	go func() {
		srv.active.Wait()
		close(handlersDone)
	}()
	var err error
	select {
	case <-handlersDone:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if cerr := srv.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	<-handlersDone // Close waited for every handler, so this is immediate; it reaps the waiter
	return err
}

// hello answers a client's HelloRequest with this release's protocol version. A client
// outside the window is hung up on: nothing it sends could be read right. A client that sends
// no hello is of the previous release (hostproto.MinVersion at the oldest) and is served.
func (srv *Server) hello(ctx gliderssh.Context, _ *gliderssh.Server, req *gossh.Request) (bool, []byte) {
	log := connLogger(srv.logger, ctx)
	v, reply, err := hostproto.AnswerHello(req.Payload, version.String())
	if err != nil {
		log.Warn("closing connection: protocol version", "err", err)
		if sc, ok := ctx.Value(serverConnKey{}).(*serverConn); ok {
			sc.Close()
		}
		return false, nil
	}
	log.Debug("hello", "protocol", v)
	return true, reply
}

func (srv *Server) rejectChannel(_ *gliderssh.Server, _ *gossh.ServerConn, newChan gossh.NewChannel, ctx gliderssh.Context) {
	connLogger(srv.logger, ctx).Info("refusing channel", "type", boundForLog(newChan.ChannelType()))
	newChan.Reject(gossh.Prohibited, "only session channels are served")
}

// runExec validates an exec request and hands it to the Handler.
func (srv *Server) runExec(ctx context.Context, s *session) {
	req, err := srv.execRequest(s)
	if err != nil {
		s.refuse(err)
		return
	}
	s.logger.Info("exec", "execution_id", req.ExecutionID, "assigned", req.Assigned, "account", req.Account.Name,
		"key", req.Identity.Fingerprint, "key_id", boundForLog(req.Identity.KeyID), "operation_key", req.OperationKey)
	srv.handler.Exec(ctx, s, req)
	s.finish()
}

func (srv *Server) runControl(ctx context.Context, s *session) {
	caller, err := sessionIdentity(s)
	if err == nil {
		_, err = srv.live.Load().accounts.resolve(s.User())
	}
	if err != nil {
		s.refuse(err)
		return
	}
	srv.handler.Control(ctx, s, caller)
	s.finish()
}

// sessionIdentity is who sent s: the SSH user and the key that signed the login.
func sessionIdentity(s *session) (Identity, error) {
	auth, ok := s.ctx.Value(authIdentityKey{}).(authIdentity)
	if !ok {
		return Identity{}, errors.New("no verified key for this connection")
	}
	return newIdentity(s.User(), auth)
}

func (srv *Server) execRequest(s *session) (ExecRequest, error) {
	caller, err := sessionIdentity(s)
	if err != nil {
		return ExecRequest{}, err
	}
	live := srv.live.Load()
	account, err := live.accounts.resolve(s.User())
	if err != nil {
		return ExecRequest{}, err
	}
	switch cmd := s.rawCommand; {
	case len(cmd) > live.cfg.MaxCommandBytes:
		return ExecRequest{}, fmt.Errorf("%w: command is %d bytes, the limit is %d", ErrInvalidRequest, len(cmd), live.cfg.MaxCommandBytes)
	case strings.TrimSpace(cmd) == "":
		return ExecRequest{}, fmt.Errorf("%w: empty command (this host runs commands, it has no interactive shell)", ErrInvalidRequest)
	case strings.IndexByte(cmd, 0) >= 0:
		return ExecRequest{}, fmt.Errorf("%w: command contains a NUL byte", ErrInvalidRequest)
	}
	if s.env.problem != nil {
		return ExecRequest{}, s.env.problem
	}
	req := ExecRequest{
		Account:    account,
		Command:    s.rawCommand,
		RemoteAddr: s.RemoteAddr(),
		Identity:   caller,
	}
	vars := s.env.vars
	req.ExecutionID = vars[hostproto.EnvExecutionID]
	switch {
	case req.ExecutionID == "" && live.cfg.MissingExecutionID == MissingIDAssign:
		if req.ExecutionID, err = markers.NewExecutionID(time.Now()); err != nil {
			return ExecRequest{}, err
		}
		req.Assigned = true
	case req.ExecutionID == "":
		return ExecRequest{}, ErrMissingExecutionID
	case !markers.ValidExecutionID(req.ExecutionID):
		return ExecRequest{}, ErrInvalidExecutionID
	}
	if req.OperationKey, err = parseOperationKey(vars[hostproto.EnvOperationKey]); err != nil {
		return ExecRequest{}, err
	}
	if req.Timeout, err = parseTimeout(vars[hostproto.EnvTimeout]); err != nil {
		return ExecRequest{}, err
	}
	if req.Cwd, err = parseCwd(vars[hostproto.EnvCwd], account.Home); err != nil {
		return ExecRequest{}, err
	}
	req.Env = s.env.environ()
	if req.Assigned {
		req.Env = append(req.Env, hostproto.EnvExecutionID+"="+req.ExecutionID)
		slices.Sort(req.Env)
	}
	return req, nil
}

func connLogger(logger *slog.Logger, ctx gliderssh.Context) *slog.Logger {
	sid := ctx.SessionID()
	if len(sid) > 16 {
		sid = sid[:16]
	}
	return logger.With("remote", ctx.RemoteAddr(), "user", boundForLog(ctx.User()), "ssh_session", sid)
}
