package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/durable"
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
	// shim is the supervisor when this process started it (and so must reap it); nil when
	// adopted.
	shim *exec.Cmd

	mu sync.Mutex // guards the fields below
	// pidfd refers to the supervisor while it may be running; -1 once its outcome is known
	// or the handle is closed.
	pidfd  int
	done   bool // status and err are final
	status Status
	err    error
}

// Start runs spec in the spool directory dir (created if missing; it must not have been
// used before) under a detached supervisor, started as `exe shim` in its own session with dir
// in $POSTERN_SHIM_SPOOL_DIR (not in its arguments, which every local user can read), and
// returns once the command is running. exe is normally os.Executable().
//
// If the command could not be started the error is a *StartError (wrapping ErrStartFailed)
// and the status file says why; the command provably did not run. If ctx ends before the
// command is reported running, Start cancels the execution, waits for the supervisor to
// finish and returns ctx's cause; the spool directory then tells whether anything ran. Other errors mean the
// supervisor failed before it could start the command, or never started (no shim record).
//
// The returned handle's Wait must be called to reap the supervisor.
func Start(ctx context.Context, exe, dir string, spec Spec) (*Handle, error) {
	spec = spec.withDefaults()
	if err := spec.validate(); err != nil {
		return nil, err
	}
	// The supervisor and later Adopt calls may not share this process's working directory.
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("shim: spool dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("shim: create spool dir: %w", err)
	}
	// The supervisor syncs its record inside dir; dir's own entry must be durable too, or a
	// power loss could take the whole directory and make a started command look never
	// started.
	if err := durable.SyncDir(filepath.Dir(dir)); err != nil {
		return nil, fmt.Errorf("shim: create spool dir: %w", err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("shim: encode spec: %w", err)
	}
	// The spec is read by the supervisor moments from now, from the page cache: it needs no
	// fsync (a machine crash ends the supervisor with it). The shim record is what must be
	// durable, and the supervisor syncs that one before the command starts.
	if err := createFileVolatile(dir, SpecFile, data); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shim: open supervisor log: %w", err)
	}
	defer logFile.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("shim: readiness pipe: %w", err)
	}
	defer readyR.Close()

	cmd := exec.Command(exe, "shim")
	cmd.Env = append(os.Environ(), EnvSpoolDir+"="+dir)
	cmd.Stderr = logFile
	cmd.ExtraFiles = []*os.File{readyW} // readyFD in the supervisor
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return nil, fmt.Errorf("shim: start supervisor: %w", err)
	}
	// The supervisor is our unreaped child, so its pid cannot have been reused.
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("shim: pidfd of supervisor: %w", err)
	}
	h := &Handle{dir: dir, shim: cmd, pidfd: pidfd}

	msg, err := readReady(ctx, readyR)
	if err != nil && ctx.Err() != nil {
		unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0)
		h.reap()
		return nil, fmt.Errorf("shim: start %s: %w", dir, err)
	}
	if err != nil || msg.Error != "" {
		h.reap()
		if st, serr := ReadStatus(dir); serr == nil && st.Outcome == OutcomeStartFailed {
			return nil, &StartError{Cause: st.Error}
		}
		if err == nil {
			err = errors.New(msg.Error)
		}
		return nil, fmt.Errorf("shim: supervisor of %s failed: %w (see %s)", dir, err, LogFile)
	}
	rec, err := readShimRecord(dir)
	if err != nil {
		// The supervisor writes its record before it starts the command; this is not reachable
		// unless someone else edits the spool directory.
		return nil, fmt.Errorf("shim: command running but shim record unreadable: %w", err)
	}
	h.proc = Process{ShimPID: rec.PID, ShimStart: rec.Start, PID: msg.PID, PIDStart: msg.Start, StartedAt: msg.StartedAt}
	return h, nil
}

// readReady reads the supervisor's readiness message, which ends when it closes the pipe.
func readReady(ctx context.Context, r *os.File) (processRecord, error) {
	stop := context.AfterFunc(ctx, func() { r.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	data, err := io.ReadAll(io.LimitReader(r, maxReadyBytes))
	if err != nil {
		if ctx.Err() != nil {
			return processRecord{}, context.Cause(ctx)
		}
		return processRecord{}, fmt.Errorf("read readiness: %w", err)
	}
	if len(data) == 0 {
		return processRecord{}, errNoReadyMessage
	}
	return parseProcessRecord(data)
}

// Adopt returns a handle on the execution in dir after a hostagent restart. It returns
// ErrNeverStarted if there is no shim record (the command provably never ran) and
// ErrVanished if the supervisor is gone without a status record (unknown outcome). A
// finished execution gets a handle whose Wait returns its status at once.
//
// Process().PID is zero if the supervisor has not started the command yet.
func Adopt(dir string) (*Handle, error) {
	rec, err := readShimRecord(dir)
	if err != nil {
		return nil, err
	}
	proc, err := readProcessRecord(dir)
	if err != nil {
		return nil, err
	}
	h := &Handle{
		dir:   dir,
		proc:  Process{ShimPID: rec.PID, ShimStart: rec.Start, PID: proc.PID, PIDStart: proc.Start, StartedAt: proc.StartedAt},
		pidfd: -1,
	}
	if ok, err := h.loadStatus(); ok || err != nil {
		return h, err
	}
	pidfd, err := unix.PidfdOpen(rec.PID, 0)
	// The start time is checked after the pidfd exists: if it matches, the pid named the
	// recorded supervisor (which existed before this call) when the pidfd was opened.
	if err == nil && !running(rec.PID, rec.Start) {
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
		return nil, fmt.Errorf("shim: adopt %s: pidfd of supervisor: %w", dir, err)
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
		return false, fmt.Errorf("shim: adopt %s: %w", h.dir, err)
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
	h.mu.Lock()
	if h.done {
		defer h.mu.Unlock()
		return h.status, h.err
	}
	if h.pidfd < 0 {
		h.mu.Unlock()
		return Status{}, fmt.Errorf("shim: wait %s: handle closed", h.dir)
	}
	// A private copy, so concurrent waiters' deadlines do not interfere.
	fd, err := unix.FcntlInt(uintptr(h.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	h.mu.Unlock()
	if err != nil {
		return Status{}, fmt.Errorf("shim: wait %s: dup pidfd: %w", h.dir, err)
	}
	if err := waitPidfd(ctx, fd); err != nil {
		return Status{}, fmt.Errorf("shim: wait %s: %w", h.dir, err)
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
	if h.shim != nil {
		// The supervisor's own exit code adds nothing: the status file is the record.
		h.shim.Wait()
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
		return fmt.Errorf("shim: cancel %s: %w", h.dir, err)
	}
	return nil
}

// Close releases the handle without waiting. A supervisor this process started stays a
// zombie until Wait is called, so Close is for adopted handles one stops following.
func (h *Handle) Close() error {
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
