package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/anmitsu/go-shlex"
	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
)

// ControlSubsystem is the only SSH subsystem the hostagent serves.
const ControlSubsystem = hostproto.ControlSubsystem

// maxBufferedSignals bounds the signals kept while no handler listens.
const maxBufferedSignals = 16

var (
	errSessionClosed    = errors.New("ssh session closed")
	errConnectionClosed = errors.New("ssh connection closed")
)

// session is the hostagent's implementation of gliderssh.Session. It replaces gliderlabs'
// DefaultSessionHandler, which accepts every env variable without a bound, says yes to
// agent forwarding, offers a pty unless told otherwise, and reports exit status 0 when a
// handler returns without calling Exit.
type session struct {
	gossh.Channel
	srv    *Server
	conn   *gossh.ServerConn
	ctx    gliderssh.Context
	logger *slog.Logger

	// Written only by the request loop before the command starts, read-only afterwards (the
	// go statement that starts the handler orders the two).
	env        sessionEnv
	rawCommand string
	subsystem  string
	started    bool
	// envRefused: an EnvRequest sent without want-reply (protocol 3) did not take every
	// variable. Its client learns that only from the exec that follows, which is refused:
	// a command never starts without an environment its client believes was set.
	envRefused bool

	mu     sync.Mutex // guards exited, sigCh, sigBuf
	exited bool
	sigCh  chan<- gliderssh.Signal
	sigBuf []gliderssh.Signal
}

var _ gliderssh.Session = (*session)(nil)

func (s *session) User() string         { return s.conn.User() }
func (s *session) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }
func (s *session) LocalAddr() net.Addr  { return s.conn.LocalAddr() }

// Environ returns only the allowlisted variables the client sent, sorted.
func (s *session) Environ() []string          { return s.env.environ() }
func (s *session) RawCommand() string         { return s.rawCommand }
func (s *session) Subsystem() string          { return s.subsystem }
func (s *session) Context() gliderssh.Context { return s.ctx }

// Command splits the command with POSIX shell rules (informational: commands run through
// Config.Shell with RawCommand).
func (s *session) Command() []string {
	args, _ := shlex.Split(s.rawCommand, true)
	return args
}

func (s *session) PublicKey() gliderssh.PublicKey {
	key, _ := s.ctx.Value(gliderssh.ContextKeyPublicKey).(gliderssh.PublicKey)
	return key
}

func (s *session) Permissions() gliderssh.Permissions {
	return *s.ctx.Permissions()
}

// Pty always reports no pty: pty requests are refused.
func (s *session) Pty() (gliderssh.Pty, <-chan gliderssh.Window, bool) {
	return gliderssh.Pty{}, nil, false
}

// Break ignores c: break requests are refused.
func (s *session) Break(c chan<- bool) {}

// Signals registers c for signals from the client. Delivery never blocks the request loop:
// c should be buffered, and a signal c cannot take at once is dropped and logged.
func (s *session) Signals(c chan<- gliderssh.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sigCh = c
	if c == nil {
		return
	}
	for _, sig := range s.sigBuf {
		s.deliverLocked(sig)
	}
	s.sigBuf = nil
}

func (s *session) signal(sig gliderssh.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sigCh == nil {
		if len(s.sigBuf) < maxBufferedSignals {
			s.sigBuf = append(s.sigBuf, sig)
		}
		return
	}
	s.deliverLocked(sig)
}

func (s *session) deliverLocked(sig gliderssh.Signal) {
	select {
	case s.sigCh <- sig:
	default:
		s.logger.Warn("dropping signal from client: handler not receiving", "signal", boundForLog(string(sig)))
	}
}

// Exit sends the exit status and closes the channel.
func (s *session) Exit(code int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited {
		return errors.New("session: Exit called twice")
	}
	s.exited = true
	status := struct{ Status uint32 }{uint32(code)}
	if _, err := s.SendRequest("exit-status", false, gossh.Marshal(&status)); err != nil {
		s.Channel.Close()
		return fmt.Errorf("session: send exit status: %w", err)
	}
	return s.Channel.Close()
}

// refuse tells the client why its request was not run and ends the session with status 255.
func (s *session) refuse(err error) {
	s.logger.Info("request refused", "err", err)
	fmt.Fprintf(s.Stderr(), "postern: %v\n", err)
	s.Exit(hostproto.ExitRefused)
}

// finish closes a session whose handler returned without an exit status. The client sees no
// exit status (an unknown outcome) rather than a made-up 0.
func (s *session) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.exited {
		s.exited = true
		s.logger.Warn("handler returned without an exit status")
		s.Channel.Close()
	}
}

// handleSessionChannel is the "session" channel handler. It owns the channel's request loop
// and starts the Handler in a goroutine the Server tracks.
func (srv *Server) handleSessionChannel(_ *gliderssh.Server, conn *gossh.ServerConn, newChan gossh.NewChannel, ctx gliderssh.Context) {
	sc, ok := ctx.Value(serverConnKey{}).(*serverConn)
	if !ok {
		newChan.Reject(gossh.ConnectionFailed, "connection not tracked")
		return
	}
	if sc.revoked.Load() {
		newChan.Reject(gossh.Prohibited, errKeyRevoked.Error())
		return
	}
	live := srv.live.Load()
	if n := sc.sessions.Add(1); n > int64(live.cfg.MaxSessions) {
		sc.sessions.Add(-1)
		connLogger(srv.logger, ctx).Warn("refusing session: too many on this connection", "max_sessions", live.cfg.MaxSessions)
		newChan.Reject(gossh.ResourceShortage, fmt.Sprintf("too many sessions on this connection (max_sessions %d); close one or open another connection", live.cfg.MaxSessions))
		return
	}
	defer sc.sessions.Add(-1)
	if !srv.startGoroutine(false) {
		newChan.Reject(gossh.ResourceShortage, "server shutting down")
		return
	}
	defer srv.wg.Done()
	ch, reqs, err := newChan.Accept()
	if err != nil {
		return
	}
	sess := &session{
		Channel: ch,
		srv:     srv,
		conn:    conn,
		ctx:     ctx,
		logger:  connLogger(srv.logger, ctx),
		env:     sessionEnv{filter: live.env},
	}
	sessCtx, cancel := context.WithCancelCause(srv.ctx)
	defer cancel(errSessionClosed)
	stop := context.AfterFunc(ctx, func() { cancel(errConnectionClosed) })
	defer stop()

	for req := range reqs {
		ok, start := sess.handleRequest(req)
		if req.WantReply {
			req.Reply(ok, nil)
		}
		if start == nil {
			continue
		}
		if !srv.startGoroutine(true) {
			sess.refuse(errors.New("server shutting down"))
			continue
		}
		go func() {
			defer srv.wg.Done()
			defer srv.active.Done()
			start(sessCtx)
		}()
	}
}

// addEnv takes one variable of an env or EnvRequest request and reports whether it was
// accepted. A limit violation is reported when the command is refused.
func (s *session) addEnv(name, value string) bool {
	if !s.env.add(name, value) && s.env.problem == nil {
		// The name only: values may be secrets. A client that asked for a reply (the
		// bastion) learns the variable was dropped and sends nothing; OpenSSH's SetEnv asks
		// for none and goes on, as with sshd's AcceptEnv.
		s.logger.Info("dropping environment variable not in the allowlist", "name", boundForLog(name))
		return false
	}
	return true
}

// handleRequest answers one channel request. It returns the reply and, for an accepted exec
// or subsystem request, the work to start once the reply is sent.
func (s *session) handleRequest(req *gossh.Request) (ok bool, start func(context.Context)) {
	switch req.Type {
	case "env":
		var kv struct{ Name, Value string }
		if s.started || gossh.Unmarshal(req.Payload, &kv) != nil {
			return false, nil
		}
		return s.addEnv(kv.Name, kv.Value), nil
	case hostproto.EnvRequest:
		var batch struct{ Env string }
		var vars []hostproto.EnvVar
		accepted := !s.started && gossh.Unmarshal(req.Payload, &batch) == nil && json.Unmarshal([]byte(batch.Env), &vars) == nil
		if accepted {
			for _, kv := range vars {
				accepted = s.addEnv(kv.Name, kv.Value) && accepted
			}
		}
		if !accepted && !req.WantReply {
			s.envRefused = true
		}
		return accepted, nil
	case "exec":
		var cmd struct{ Command string }
		if s.started || gossh.Unmarshal(req.Payload, &cmd) != nil {
			return false, nil
		}
		if s.envRefused {
			s.logger.Info("refusing exec: its environment was not taken whole")
			return false, nil
		}
		s.started, s.rawCommand = true, cmd.Command
		return true, func(ctx context.Context) { s.srv.runExec(ctx, s) }
	case "subsystem":
		var sub struct{ Name string }
		if s.started || gossh.Unmarshal(req.Payload, &sub) != nil {
			return false, nil
		}
		if sub.Name != ControlSubsystem {
			s.logger.Info("refusing subsystem", "subsystem", boundForLog(sub.Name))
			return false, nil
		}
		s.started, s.subsystem = true, sub.Name
		return true, func(ctx context.Context) { s.srv.runControl(ctx, s) }
	case "signal":
		var sig struct{ Signal string }
		if gossh.Unmarshal(req.Payload, &sig) == nil {
			s.signal(gliderssh.Signal(sig.Signal))
		}
		return false, nil
	default:
		// shell, pty-req, x11-req, auth-agent-req@openssh.com, window-change, break and
		// anything unknown: exec of a single command is the only way in.
		s.logger.Info("refusing session request", "request", boundForLog(req.Type))
		return false, nil
	}
}
