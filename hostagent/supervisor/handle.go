package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
)

// maxReadyBytes bounds the supervisor's readiness message.
const maxReadyBytes = 64 << 10

// errNoReadyMessage: the supervisor exited without saying whether the command started.
var errNoReadyMessage = errors.New("supervisor exited without reporting")

// Handle follows one execution's supervisor, whether this process started it (Start) or
// found it running after a restart (Adopt). Its methods are safe for concurrent use.
type Handle struct {
	dir  string
	proc Process
	// perCommand is a per-command supervisor this process started (and so must reap): only
	// the tests' stand-in for the previous release's hostagent starts one. nil when adopted
	// or supervised by the long-lived supervisor.
	perCommand *exec.Cmd
	// sup is the long-lived supervisor that answers for the execution (daemon.go); zero for
	// a per-command supervisor, which is followed through its pidfd instead. conn carries its
	// final answer, read by one goroutine that closes ended once status and err are final.
	sup     supervisorRecord
	conn    *net.UnixConn
	ended   chan struct{}
	writeMu sync.Mutex // serializes cancels on conn
	// stop is closed by Close: a handle waiting for a keeper's status stops waiting.
	stop     chan struct{}
	stopOnce sync.Once

	mu sync.Mutex // guards the fields below
	// pidfd refers to the supervisor while it may be running; -1 once its outcome is known
	// or the handle is closed.
	pidfd  int
	done   bool // status and err are final
	status Status
	err    error
}

// newSupervisedHandle follows an execution of the long-lived supervisor sup, whose final
// answer arrives on conn (read through br).
func newSupervisedHandle(dir string, sup supervisorRecord, proc processRecord, conn *net.UnixConn, br *bufio.Reader) *Handle {
	h := &Handle{
		dir:   dir,
		proc:  Process{SupervisorPID: sup.PID, SupervisorStart: sup.Start, PID: proc.PID, PIDStart: proc.Start, StartedAt: proc.StartedAt},
		pidfd: -1,
		sup:   sup,
		conn:  conn,
		ended: make(chan struct{}),
		stop:  make(chan struct{}),
	}
	go h.readFinal(br)
	return h
}

// readFinal waits for the supervisor's last word on the execution: its status, or — if the
// supervisor has no such execution or hangs up — the status file: the keeper's, if the
// supervisor died and its keeper took the command over; without one ErrVanished.
func (h *Handle) readFinal(br *bufio.Reader) {
	defer close(h.ended)
	var final *Status
	for {
		msg, err := readMessage[reply](br)
		if err != nil || msg.Started == nil {
			final = msg.Status
			break
		}
	}
	h.conn.Close()
	if final == nil {
		st, err := awaitKeeper(h.dir, h.sup, h.stop)
		final = &st
		if err != nil {
			h.mu.Lock()
			defer h.mu.Unlock()
			if !h.done {
				h.done, h.err = true, err
			}
			return
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.done, h.status = true, *final
	}
}

// Bounds on waiting for a keeper's status.
const (
	// keeperDecides is how long a keeper gets to show (KeptFile) that it took over an
	// execution whose supervisor died; it takes over within milliseconds of the death, so
	// only an execution it has nothing of (its supervisor died between the fork and naming
	// the process) waits this long before it is called vanished.
	keeperDecides = 5 * time.Second
	keeperPollMin = 5 * time.Millisecond
	keeperPollMax = 100 * time.Millisecond
)

// awaitKeeper returns the status of the execution in dir once it is written: at once if it
// is there, else — if the supervisor rec names is gone and its keeper lives — once the keeper
// wrote it. ErrVanished if there is none and no keeper that will write one; errHandleClosed
// if stop is closed first.
func awaitKeeper(dir string, rec supervisorRecord, stop <-chan struct{}) (Status, error) {
	deadline := time.Now().Add(keeperDecides)
	delay := keeperPollMin
	for {
		st, err := ReadStatus(dir)
		if !errors.Is(err, ErrNoStatus) {
			return st, err
		}
		alive := rec.Keeper > 0 && procfs.Running(rec.Keeper, rec.KeeperStart)
		if alive && time.Now().After(deadline) {
			_, kerr := os.Stat(filepath.Join(dir, KeptFile))
			alive = kerr == nil
		}
		if !alive {
			// It may have written the status just before it went.
			st, err := ReadStatus(dir)
			if errors.Is(err, ErrNoStatus) {
				err = ErrVanished
			}
			return st, err
		}
		t := time.NewTimer(delay)
		select {
		case <-stop:
			t.Stop()
			return Status{}, errHandleClosed
		case <-t.C:
		}
		delay = min(2*delay, keeperPollMax)
	}
}

var errHandleClosed = errors.New("supervisor: handle closed")

// keptHandle follows an execution whose supervisor is gone until its keeper writes the status.
func keptHandle(h *Handle) *Handle {
	h.ended, h.stop = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.ended)
		st, err := awaitKeeper(h.dir, h.sup, h.stop)
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.done {
			h.done, h.status, h.err = true, st, err
		}
	}()
	return h
}

// readKeptRecord is the command's process record the keeper left in KeptFile when it took
// the execution in dir over; false if it did not (yet).
func readKeptRecord(dir string) (processRecord, bool) {
	data, err := readRecord(filepath.Join(dir, KeptFile))
	if err != nil {
		return processRecord{}, false
	}
	p, err := parseProcessRecord(data)
	return p, err == nil
}

// keptProcess fills in h's process from the keeper's record, before h is shared.
func (h *Handle) keptProcess() {
	if p, ok := readKeptRecord(h.dir); ok && h.proc.PID == 0 {
		h.proc.PID, h.proc.PIDStart, h.proc.StartedAt = p.PID, p.Start, p.StartedAt
	}
}

// adoptSupervised follows an execution of the long-lived supervisor rec names.
func adoptSupervised(h *Handle, rec supervisorRecord) (*Handle, error) {
	h.sup = rec
	var conn *net.UnixConn
	err := errSupervisorGone
	if procfs.Running(rec.PID, rec.Start) {
		ctx, cancel := context.WithTimeout(context.Background(), supervisorStartLimit)
		conn, err = dialSupervisor(ctx, rec)
		cancel()
	}
	if err == nil {
		err = writeMessage(conn, request{V: protocolVersion, Op: opWait, Dir: h.dir})
		if err != nil {
			conn.Close()
		}
	}
	if err != nil {
		// Gone: it may have written the status before it went, or its keeper took over.
		if ok, err := h.loadStatus(); ok || err != nil {
			return h, err
		}
		if rec.Keeper > 0 && procfs.Running(rec.Keeper, rec.KeeperStart) {
			h.keptProcess()
			return keptHandle(h), nil
		}
		return nil, ErrVanished
	}
	// The first answer names the command's process (or is already the end).
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(supervisorStartLimit))
	first, err := readMessage[reply](br)
	conn.SetReadDeadline(time.Time{})
	if err != nil || first.Started == nil {
		conn.Close()
		switch {
		case err == nil && first.Status != nil:
			h.done, h.status = true, *first.Status
			if h.proc.PID == 0 {
				h.proc.PID, h.proc.PIDStart, h.proc.StartedAt = first.Status.PID, first.Status.PIDStart, first.Status.StartedAt
			}
			return h, nil
		case err == nil && !first.Unknown:
			return nil, fmt.Errorf("supervisor: adopt %s: supervisor answered %q", h.dir, first.Error)
		}
		// It does not know the execution (it ended before, or the supervisor is going).
		if ok, err := h.loadStatus(); ok || err != nil {
			return h, err
		}
		if rec.Keeper > 0 && procfs.Running(rec.Keeper, rec.KeeperStart) {
			h.keptProcess()
			return keptHandle(h), nil
		}
		return nil, ErrVanished
	}
	h.proc.PID, h.proc.PIDStart, h.proc.StartedAt = first.Started.PID, first.Started.Start, first.Started.StartedAt
	h.conn, h.ended, h.stop = conn, make(chan struct{}), make(chan struct{})
	go h.readFinal(br)
	return h, nil
}

// Adopt returns a handle on the execution in dir after a hostagent restart. It returns
// ErrNeverStarted if there is no supervisor record (the command provably never ran) and
// ErrVanished if the supervisor is gone without a status record (unknown outcome). A
// finished execution gets a handle whose Wait returns its status at once.
//
// Process().PID is zero if the supervisor has not started the command yet.
func Adopt(dir string) (*Handle, error) {
	rec, err := readSupervisorRecord(dir)
	if err != nil {
		return nil, err
	}
	proc, err := readProcessRecord(dir)
	if err != nil {
		return nil, err
	}
	h := &Handle{
		dir:   dir,
		proc:  Process{SupervisorPID: rec.PID, SupervisorStart: rec.Start, PID: proc.PID, PIDStart: proc.Start, StartedAt: proc.StartedAt},
		pidfd: -1,
	}
	if ok, err := h.loadStatus(); ok || err != nil {
		return h, err
	}
	if rec.Socket != "" {
		return adoptSupervised(h, rec)
	}
	pidfd, err := unix.PidfdOpen(rec.PID, 0)
	// The start time is checked after the pidfd exists: if it matches, the pid named the
	// recorded supervisor (which existed before this call) when the pidfd was opened.
	if err == nil && !procfs.Running(rec.PID, rec.Start) {
		unix.Close(pidfd)
		err = unix.ESRCH
	}
	if errors.Is(err, unix.ESRCH) {
		// Gone: it may have written its status between the first look and now.
		if ok, err := h.loadStatus(); ok || err != nil {
			return h, err
		}
		return nil, ErrVanished
	}
	if err != nil {
		return nil, fmt.Errorf("supervisor: adopt %s: pidfd of supervisor: %w", dir, err)
	}
	h.pidfd = pidfd
	return h, nil
}

// loadStatus marks an adopted handle finished if the status file exists.
func (h *Handle) loadStatus() (bool, error) {
	st, err := ReadStatus(h.dir)
	if errors.Is(err, ErrNoStatus) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("supervisor: adopt %s: %w", h.dir, err)
	}
	h.done, h.status = true, st
	if h.proc.PID == 0 {
		h.proc.PID, h.proc.PIDStart, h.proc.StartedAt = st.PID, st.PIDStart, st.StartedAt
	}
	return true, nil
}

// Dir returns the spool directory.
func (h *Handle) Dir() string { return h.dir }

// Process identifies the supervisor and the command's process.
func (h *Handle) Process() Process { return h.proc }

// Wait waits for the execution to end and returns its status. It returns ErrVanished if the
// supervisor ended without a status record. It may be called many times and concurrently;
// a started (not adopted) supervisor is reaped by the first call that sees it exit.
func (h *Handle) Wait(ctx context.Context) (Status, error) {
	if h.ended != nil {
		select {
		case <-h.ended:
		case <-ctx.Done():
			return Status{}, fmt.Errorf("supervisor: wait %s: %w", h.dir, context.Cause(ctx))
		}
	}
	h.mu.Lock()
	if h.done {
		defer h.mu.Unlock()
		return h.status, h.err
	}
	if h.pidfd < 0 {
		h.mu.Unlock()
		return Status{}, fmt.Errorf("supervisor: wait %s: handle closed", h.dir)
	}
	// A private copy, so concurrent waiters' deadlines do not interfere.
	fd, err := unix.FcntlInt(uintptr(h.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	h.mu.Unlock()
	if err != nil {
		return Status{}, fmt.Errorf("supervisor: wait %s: dup pidfd: %w", h.dir, err)
	}
	if err := waitPidfd(ctx, fd); err != nil {
		return Status{}, fmt.Errorf("supervisor: wait %s: %w", h.dir, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.reapLocked()
	}
	return h.status, h.err
}

// reap is reapLocked for callers that do not hold h.mu.
func (h *Handle) reap() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reapLocked()
}

// reapLocked collects an exited (or exiting) supervisor and its status record.
func (h *Handle) reapLocked() {
	if h.perCommand != nil {
		// The supervisor's own exit code adds nothing: the status file is the record.
		h.perCommand.Wait()
	}
	st, err := ReadStatus(h.dir)
	if errors.Is(err, ErrNoStatus) {
		err = ErrVanished
	}
	h.done, h.status, h.err = true, st, err
	if h.pidfd >= 0 {
		unix.Close(h.pidfd)
		h.pidfd = -1
	}
}

// Cancel asks the supervisor to terminate the command (SIGTERM to its process group, then
// SIGKILL after the kill grace); the outcome becomes cancelled unless the command already
// ended. It returns ErrNotRunning if the execution has already finished.
func (h *Handle) Cancel() error {
	if h.ended != nil {
		return h.cancelSupervised()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || h.pidfd < 0 {
		return ErrNotRunning
	}
	err := unix.PidfdSendSignal(h.pidfd, unix.SIGTERM, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return ErrNotRunning
	}
	if err != nil {
		return fmt.Errorf("supervisor: cancel %s: %w", h.dir, err)
	}
	return nil
}

// cancelSupervised asks the long-lived supervisor to cancel the execution, on the
// connection that follows it. The cancel file comes first: if the supervisor dies before it
// acts, its keeper finds the request there (keeper.go).
func (h *Handle) cancelSupervised() error {
	select {
	case <-h.ended:
		return ErrNotRunning
	default:
	}
	f, err := os.OpenFile(filepath.Join(h.dir, CancelFile), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("supervisor: cancel %s: %w", h.dir, err)
	}
	f.Close()
	if h.conn == nil {
		return nil // followed through the keeper, which polls for the file
	}
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	h.conn.SetWriteDeadline(time.Now().Add(supervisorStartLimit))
	if err := writeMessage(h.conn, request{V: protocolVersion, Op: opCancel}); err != nil {
		select {
		case <-h.ended:
			return ErrNotRunning
		default:
		}
		// The supervisor went away: the cancel file is the request now.
		return nil
	}
	return nil
}

// waitReader waits until a supervised handle's final answer is in.
func (h *Handle) waitReader() {
	if h.ended != nil {
		<-h.ended
	}
}

// Close releases the handle without waiting for the execution. A supervisor this process
// started stays a zombie until Wait is called, so Close is for adopted handles one stops
// following, and for executions of the long-lived supervisor, which go on without it.
func (h *Handle) Close() error {
	if h.stop != nil {
		h.stopOnce.Do(func() { close(h.stop) })
	}
	if h.conn != nil {
		h.conn.Close()
	}
	h.waitReader()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pidfd >= 0 {
		unix.Close(h.pidfd)
		h.pidfd = -1
	}
	return nil
}

// waitPidfd waits, through the runtime's poller, until the process behind pidfd has exited
// or ctx ends. It takes ownership of pidfd.
func waitPidfd(ctx context.Context, pidfd int) error {
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return fmt.Errorf("pidfd nonblocking: %w", err)
	}
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	// Fails with os.ErrNoDeadline if the runtime could not poll the pidfd, in which case
	// ctx could not interrupt the wait below.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("pidfd not pollable: %w", err)
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("pidfd raw conn: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	// The callback runs once at first and again each time the poller reports the pidfd
	// readable; returning false parks until then.
	err = raw.Read(func(fd uintptr) bool { return pidfdExited(int(fd)) })
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("poll pidfd: %w", err)
	}
	return nil
}

// pidfdExited reports whether the process behind pidfd has exited (a pidfd is readable
// then); a poll error counts as exited, so callers go on to read the status record.
func pidfdExited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}
