package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
)

// SupervisorLogFile, in the supervisor directory, receives the long-lived supervisors'
// warnings and errors (never command output).
const SupervisorLogFile = "supervisor.log"

// Bounds on starting and leaving a supervisor.
const (
	supervisorStartLimit = 30 * time.Second
	supervisorExitLimit  = 10 * time.Second
	// launchAttempts bounds the supervisors started for one Start that exit before they
	// report (one that cannot get a socket, say): the next one is tried at once.
	launchAttempts = 3
)

// Client is the hostagent's side of the long-lived supervisor (daemon.go): it starts one
// the first time a command needs it, holds a lease on it while this agent runs, and starts
// executions through it. A supervisor that died is replaced at the next Start. Its methods
// are safe for concurrent use.
type Client struct {
	exe string // started as `exe supervise`
	dir string // the supervisors' records and log
	log *slog.Logger

	mu  sync.Mutex // guards cur; held while a supervisor starts, so one starts at a time
	cur *daemonLease

	wg sync.WaitGroup // lease watchers and first-stage reapers
}

// daemonLease is a lease on one running supervisor.
type daemonLease struct {
	rec   supervisorRecord
	lease *net.UnixConn
	gone  chan struct{} // closed when the lease connection ends (the supervisor died, or Close)
	// exiting is the supervisor's answer to the lease's end: it had no command left. Set
	// before gone is closed.
	exiting bool
}

// NewClient returns the client of the supervisors that keep their records in dir (made
// 0700 if missing), started as `exe supervise`. It starts nothing until the first Start.
func NewClient(exe, dir string, logger *slog.Logger) (*Client, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("supervisor: supervisor dir: %w", err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	removeStaleSockets(dir)
	return &Client{exe: exe, dir: dir, log: logger}, nil
}

// Start runs spec in the spool directory dir (created if missing; it must not have been
// used before) under the supervisor, and returns once the command is running.
//
// If the command could not be started the error is a *StartError (wrapping ErrStartFailed)
// and the status file says why; the command provably did not run. If ctx ends before the
// command is reported running, Start cancels the execution, waits for it to end and returns
// ctx's cause; the spool directory then tells whether anything ran. Other errors mean the
// supervisor failed before it reported: whether it recorded itself in dir (and so may have
// started the command) is for the caller to settle with Fence.
func (s *Client) Start(ctx context.Context, dir string, spec Spec) (*Handle, error) {
	// Not synced, nor its parent: what proves a start on a later boot is the host marker, not
	// the spool (daemon.go, Durability).
	dir, spec, err := prepare(dir, spec)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		link, err := s.link(ctx)
		if err != nil {
			return nil, err
		}
		h, err := s.start(ctx, link, dir, spec)
		if errors.Is(err, errSupervisorGone) && attempt == 0 {
			// Nothing reached it (it died, or was exiting and took nothing): use a new one.
			s.drop(link)
			continue
		}
		return h, err
	}
}

// prepare defaults and checks spec and makes the spool directory dir (absolute, as the
// supervisor and later adopters may not share this process's working directory).
func prepare(dir string, spec Spec) (string, Spec, error) {
	spec = spec.withDefaults()
	if err := spec.validate(); err != nil {
		return "", spec, err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", spec, fmt.Errorf("supervisor: spool dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", spec, fmt.Errorf("supervisor: create spool dir: %w", err)
	}
	return dir, spec, nil
}

// start sends one start request to the supervisor of link.
func (s *Client) start(ctx context.Context, link *daemonLease, dir string, spec Spec) (*Handle, error) {
	// A local connect; a cancelled ctx is handled once the request is in (below).
	dialCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), supervisorStartLimit)
	conn, err := dialSupervisor(dialCtx, link.rec)
	cancel()
	if err != nil {
		return nil, err
	}
	if err := writeMessage(conn, request{V: protocolVersion, Op: opStart, Dir: dir, Spec: &spec}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: send start: %v", errSupervisorGone, err)
	}
	br := bufio.NewReader(conn)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		conn.SetReadDeadline(time.Unix(1, 0))
		close(fired)
	})
	first, err := readMessage[reply](br)
	stopped := stop()
	if !stopped {
		<-fired // the deadline is in place; clearing it below cannot race with setting it
	}
	switch {
	case err == nil && first.Started != nil && ctx.Err() != nil, err != nil && !stopped:
		// ctx ended first: cancel, and wait for the end so the spool dir is final.
		conn.SetReadDeadline(time.Time{})
		h := newSupervisedHandle(dir, link.rec, processRecord{}, conn, br)
		h.Cancel() // on this connection, behind the start: never before it
		h.waitReader()
		return nil, fmt.Errorf("supervisor: start %s: %w", dir, context.Cause(ctx))
	case err != nil:
		conn.Close()
		if !runningAfterTeardown(link.rec) {
			rec, rerr := readSupervisorRecord(dir)
			if errors.Is(rerr, ErrNeverStarted) {
				// It died before it recorded itself in dir, and a dead process writes
				// nothing more: the command never ran, and dir is as good as new.
				return nil, fmt.Errorf("%w: %v", errSupervisorGone, err)
			}
			if rerr == nil && rec.PID == link.rec.PID && rec.Start == link.rec.Start {
				// It died after it recorded itself: its keeper says whether the command
				// started (and then answers for it) or provably did not.
				switch st, kept := awaitTakeover(dir, rec); {
				case kept:
					h := &Handle{dir: dir, pidfd: -1, sup: rec, proc: Process{SupervisorPID: rec.PID, SupervisorStart: rec.Start}}
					h.keptProcess()
					return keptHandle(h), nil
				case st != nil && st.Outcome == OutcomeStartFailed:
					return nil, &StartError{Cause: st.Error}
				}
			}
		}
		return nil, fmt.Errorf("supervisor: supervisor of %s failed: %w (see %s)", dir, err, filepath.Join(s.dir, SupervisorLogFile))
	case first.Exiting:
		conn.Close()
		return nil, fmt.Errorf("%w: it is exiting", errSupervisorGone)
	case first.StartFailed:
		conn.Close()
		return nil, &StartError{Cause: first.Error}
	case first.Error != "":
		conn.Close()
		if first.AlreadyUsed {
			return nil, fmt.Errorf("%w: %s", ErrAlreadyUsed, dir)
		}
		return nil, fmt.Errorf("supervisor: supervisor refused %s: %s", dir, first.Error)
	case first.Started == nil:
		conn.Close()
		return nil, fmt.Errorf("supervisor: supervisor of %s answered without a process record", dir)
	}
	return newSupervisedHandle(dir, link.rec, *first.Started, conn, br), nil
}

// teardownGrace is how long a supervisor whose connection broke is given to finish dying:
// an exiting process closes its files (resetting our connection) before the kernel makes it
// a zombie, and until then /proc still shows it running.
const teardownGrace = 200 * time.Millisecond

// runningAfterTeardown reports whether the supervisor of rec is still running once an exit
// in progress would have completed.
func runningAfterTeardown(rec supervisorRecord) bool {
	deadline := time.Now().Add(teardownGrace)
	for procfs.Running(rec.PID, rec.Start) {
		if time.Now().After(deadline) {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// link returns a lease on a running supervisor, starting one if there is none.
func (s *Client) link(ctx context.Context) (*daemonLease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		select {
		case <-s.cur.gone:
			s.cur = nil
		default:
			return s.cur, nil
		}
	}
	// The supervisor serves every caller: one caller's cancellation must not abort its start.
	for attempt := 1; ; attempt++ {
		link, err := s.launch(context.WithoutCancel(ctx))
		if err == nil {
			s.cur = link
			return link, nil
		}
		if !errors.Is(err, errNoReadyMessage) || attempt == launchAttempts {
			return nil, err
		}
		s.log.Warn("the supervisor exited before it reported; starting another", "attempt", attempt, "err", err)
	}
}

// drop forgets link if it is still the current one.
func (s *Client) drop(link *daemonLease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == link {
		s.cur = nil
		link.lease.Close()
	}
}

// launch starts a supervisor and takes a lease on it.
func (s *Client) launch(ctx context.Context) (*daemonLease, error) {
	ctx, cancel := context.WithTimeout(ctx, supervisorStartLimit)
	defer cancel()
	cmd, readyR, err := startSupervisorProcess(s.exe, Subcommand, EnvSupervisorDir+"="+s.dir, filepath.Join(s.dir, SupervisorLogFile))
	if err != nil {
		return nil, err
	}
	defer readyR.Close()
	// The first stage exits once the detached supervisor runs; reaped in the background, as
	// a race-enabled build lingers at exit.
	s.wg.Go(func() { cmd.Wait() })
	stop := context.AfterFunc(ctx, func() { readyR.SetReadDeadline(time.Unix(1, 0)) })
	data, err := io.ReadAll(io.LimitReader(readyR, maxReadyBytes))
	stop()
	if err != nil || len(data) == 0 {
		if err == nil {
			err = errNoReadyMessage
		}
		return nil, fmt.Errorf("supervisor: start supervisor: %w (see %s)", err, filepath.Join(s.dir, SupervisorLogFile))
	}
	rec, err := parseSupervisorRecord(data)
	if err != nil || rec.Socket == "" {
		return nil, fmt.Errorf("supervisor: start supervisor: bad readiness message %q", data)
	}
	lease, err := dialSupervisor(ctx, rec)
	if err == nil {
		err = writeMessage(lease, request{V: protocolVersion, Op: opLease})
	}
	var ok reply
	br := bufio.NewReader(lease)
	if err == nil {
		ok, err = readMessage[reply](br)
	}
	if err == nil && !ok.OK {
		err = fmt.Errorf("lease refused: %s", ok.Error)
	}
	if err != nil {
		if lease != nil {
			lease.Close()
		}
		return nil, fmt.Errorf("supervisor: lease on supervisor %d: %w", rec.PID, err)
	}
	link := &daemonLease{rec: rec, lease: lease, gone: make(chan struct{})}
	s.wg.Go(func() {
		// Blocks until the lease ends: the supervisor's answer to Close, or its death.
		if msg, err := readMessage[reply](br); err == nil {
			link.exiting = msg.Exiting
		}
		close(link.gone)
	})
	s.log.Info("started the supervisor", "pid", rec.PID)
	return link, nil
}

// startSupervisorProcess starts `exe subcommand` in a session of its own, with env added to this
// process's environment, its stderr appended to logPath and the write end of a readiness
// pipe as readyFD. It returns the started command and the pipe's read end.
func startSupervisorProcess(exe, subcommand, env, logPath string) (*exec.Cmd, *os.File, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("supervisor: open supervisor log: %w", err)
	}
	defer logFile.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("supervisor: readiness pipe: %w", err)
	}
	cmd := exec.Command(exe, subcommand)
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = logFile
	cmd.ExtraFiles = []*os.File{readyW}
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		readyR.Close()
		return nil, nil, fmt.Errorf("supervisor: start supervisor: %w", err)
	}
	return cmd, readyR, nil
}

// Close lets go of the supervisor. Running commands go on under it (the next agent adopts
// them); a supervisor left with none exits, and Close waits for that.
func (s *Client) Close() error {
	s.mu.Lock()
	link := s.cur
	s.cur = nil
	s.mu.Unlock()
	if link != nil {
		// Half-close: the supervisor sees the lease end and answers whether it exits.
		link.lease.CloseWrite()
		select {
		case <-link.gone:
		case <-time.After(supervisorExitLimit):
			link.lease.Close()
		}
		if link.exiting {
			waitExit(link.rec, supervisorExitLimit)
		}
		link.lease.Close()
	}
	s.wg.Wait()
	return nil
}

// waitExit waits, up to limit, for the supervisor rec names to exit.
func waitExit(rec supervisorRecord, limit time.Duration) {
	fd, err := unix.PidfdOpen(rec.PID, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	// The pidfd pins a process; another start time means the pid is no longer ours.
	if !procfs.Running(rec.PID, rec.Start) {
		return
	}
	deadline := time.Now().Add(limit)
	for !pidfdExited(fd) && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
}

// awaitTakeover waits, while the keeper of the dead supervisor rec lives and at most
// keeperDecides, for it to take over the execution in dir (kept) or record that its command
// never started (the status).
func awaitTakeover(dir string, rec supervisorRecord) (*Status, bool) {
	deadline := time.Now().Add(keeperDecides)
	for {
		if st, err := ReadStatus(dir); err == nil {
			return &st, st.Outcome != OutcomeStartFailed
		}
		if _, err := os.Stat(filepath.Join(dir, KeptFile)); err == nil {
			return nil, true
		}
		if rec.Keeper == 0 || !procfs.Running(rec.Keeper, rec.KeeperStart) || time.Now().After(deadline) {
			return nil, false
		}
		time.Sleep(keeperPollMin)
	}
}
