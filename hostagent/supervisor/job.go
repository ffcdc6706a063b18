package supervisor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
)

// drainAfterKill bounds how long the supervisor waits for the output pipes after SIGKILL of
// the group; only processes that escaped the group can still hold them open.
const drainAfterKill = time.Second

// job runs one command in its spool directory and returns its status: the heart of both
// supervisor modes. The caller has made the supervisor record before run.
type job struct {
	dir  string
	spec Spec
	log  *slog.Logger
	// start forks the command, on a thread that lives as long as the supervisor: the
	// command's Pdeathsig fires when the forking thread exits, not the process.
	start func(*exec.Cmd) error
	// cancel is closed to cancel the execution (before or after the command started).
	cancel <-chan struct{}
	// tell reports once whether the command started (its process record) or why not.
	tell func(processRecord)
	// keeper, when set, is told of the command (its pipes' read ends before the fork, its
	// process after), so the command outlives the supervisor: see keeper.go. Without one
	// (the per-command mode, or a keeper that is gone) the command gets SIGKILL when the
	// supervisor dies (Pdeathsig), as nothing would be left to record its end.
	keeper *keeperLink
	// commandOOM is the oom_score_adj the command gets instead of the supervisor's own low
	// one; "" leaves it as inherited.
	commandOOM string
	// perCommand: the per-command mode's on-disk contract, which a hostagent of the previous
	// release reads — a process record, both stream files, synced. The long-lived supervisor
	// answers for its executions itself and leaves durability to the host marker (daemon.go).
	//
	// Deprecated: see mainPerCommand.
	perCommand bool
}

// startFailed records that the command provably did not run.
func (s *job) startFailed(err error) Status {
	s.log.Info("command did not start", "err", err)
	s.tell(processRecord{Error: err.Error()})
	empty := emptyDigest()
	return Status{
		ExecutionID: s.spec.ExecutionID,
		Outcome:     OutcomeStartFailed,
		ExitCode:    -1,
		Error:       err.Error(),
		EndedAt:     time.Now().UTC(),
		Stdout:      StreamInfo{SHA256: empty},
		Stderr:      StreamInfo{SHA256: empty},
	}
}

// run starts the command, enforces timeout and cancellation, spools its output and returns
// its status.
func (s *job) run() Status {
	select {
	case <-s.cancel:
		return s.startFailed(errors.New("cancelled before the command started"))
	default:
	}
	stdout := newSpooler(s.dir, StdoutFile, s.spec.OutputCap)
	defer stdout.close()
	stderr := newSpooler(s.dir, StderrFile, s.spec.OutputCap)
	defer stderr.close()
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return s.startFailed(fmt.Errorf("supervisor: stdout pipe: %w", err))
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdoutR.Close()
		stdoutW.Close()
		return s.startFailed(fmt.Errorf("supervisor: stderr pipe: %w", err))
	}

	cmd := exec.Command(s.spec.Shell, "-c", s.spec.Command)
	cmd.Dir = s.spec.Dir
	cmd.Env = s.spec.Env
	if cmd.Env == nil {
		cmd.Env = []string{} // nil would inherit the hostagent's environment
	}
	cmd.Stdout = stdoutW
	cmd.Stderr = stderrW
	// A session of its own, not just a process group: commands of the long-lived supervisor
	// would otherwise share its session, where any of them could setpgid into another's
	// group — and the group is what says which execution a process belongs to (InExecution).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: s.spec.Credential}
	// The keeper holds the pipes' read ends from before the fork, so the command never
	// writes into a pipe without a reader, whenever this process dies.
	kept := s.keeper.add(s.dir, s.spec, stdoutR, stderrR)
	if !kept {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	err = s.start(cmd)
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdoutR.Close()
		stderrR.Close()
		s.log.Info("start failed", "err", err)
		return s.startFailed(errors.New(startCause(s.spec, err)))
	}
	pid := cmd.Process.Pid
	startedAt := time.Now().UTC()
	s.resetOOM(pid)
	// The command is our unreaped child, so its /proc entry exists even if it already exited.
	pidStart, err := procfs.StartTime(pid)
	if err != nil {
		s.log.Warn("could not read the command's start time", "pid", pid, "err", err)
	}
	proc := processRecord{PID: pid, Start: pidStart, StartedAt: startedAt}
	if kept {
		s.keeper.started(s.dir, proc)
	}
	s.log.Info("command started", "pid", pid)

	// The process record is not synced: it names the command's process for this boot only,
	// and after a machine crash there is no process to name. Created in place with one
	// write (a rename would cost another directory update); a reader that finds it empty
	// finds it not written yet.
	if s.perCommand {
		if data, err := json.Marshal(proc); err != nil {
			s.log.Warn("could not encode the process record", "err", err)
		} else if err := createFileVolatile(s.dir, ProcessFile, data); err != nil {
			s.log.Warn("could not write the process record", "err", err)
		}
	}
	s.tell(proc)
	return s.supervise(proc, stdout, stderr, stdoutR, stderrR, func() (syscall.WaitStatus, error) {
		// Reaps the zombie; the exit was already observed, so this does not block. A non-zero
		// exit is an error here too, so only a missing ProcessState means the wait failed.
		err := cmd.Wait()
		if cmd.ProcessState == nil {
			return 0, err
		}
		return cmd.ProcessState.Sys().(syscall.WaitStatus), nil
	})
}

// supervise follows the started command proc to its end — the timeout, cancellation, its
// output, what is left of its group — and returns its status; reap collects its exit status
// once it has exited. The supervisor that started the command and the keeper that took it
// over (keeper.go) both end a command here.
func (s *job) supervise(proc processRecord, stdout, stderr *spooler, stdoutR, stderrR *os.File, reap func() (syscall.WaitStatus, error)) Status {
	pid := proc.PID
	copied := make(chan struct{}, 2)
	go stdout.copyFrom(stdoutR, copied)
	go stderr.copyFrom(stderrR, copied)
	// Observe the exit without reaping, so the pid (and so the process group id) stays
	// reserved while the group is signalled.
	exited := make(chan error, 1)
	go func() {
		for {
			err := unix.Waitid(unix.P_PID, pid, nil, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				exited <- err
				return
			}
		}
	}()

	outcome := s.waitExit(pid, exited)
	endedAt := time.Now().UTC()
	s.drain(pid, copied, stdoutR, stderrR)

	st := Status{
		ExecutionID: s.spec.ExecutionID,
		Outcome:     outcome,
		PID:         pid,
		PIDStart:    proc.Start,
		StartedAt:   proc.StartedAt,
		EndedAt:     endedAt,
	}
	var errs []error
	if ws, err := reap(); err != nil {
		st.ExitCode = -1
		errs = append(errs, fmt.Errorf("supervisor: reap command: %w", err))
	} else if ws.Signaled() {
		st.ExitCode = -1
		st.Signal = unix.SignalName(ws.Signal())
	} else {
		st.ExitCode = ws.ExitStatus()
	}
	for _, sp := range []*spooler{stdout, stderr} {
		if err := sp.finish(s.perCommand); err != nil {
			errs = append(errs, err)
		}
	}
	st.Stdout, st.Stderr = stdout.info, stderr.info
	if err := errors.Join(errs...); err != nil {
		st.Error = err.Error()
	}
	s.log.Info("command ended", "outcome", st.Outcome, "exit_code", st.ExitCode, "signal", st.Signal)
	return st
}

// waitExit waits for the command to exit, enforcing the timeout and cancellation by
// terminating its process group, and returns the outcome.
func (s *job) waitExit(pid int, exited <-chan error) string {
	var timeout <-chan time.Time
	if s.spec.Timeout > 0 {
		t := time.NewTimer(s.spec.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var grace <-chan time.Time
	cancel := s.cancel
	outcome := OutcomeExited
	terminate := func(why string) {
		if outcome != OutcomeExited {
			return // already terminating; the first reason stands
		}
		outcome = why
		s.log.Info("terminating command", "reason", why)
		s.signalGroup(pid, unix.SIGTERM)
		t := time.NewTimer(s.spec.KillGrace)
		grace = t.C
	}
	for {
		select {
		case <-cancel:
			cancel = nil
			terminate(OutcomeCancelled)
		case <-timeout:
			terminate(OutcomeTimedOut)
		case <-grace:
			s.signalGroup(pid, unix.SIGKILL)
			grace = nil
		case err := <-exited:
			if err != nil {
				s.log.Warn("waiting for the command failed; reaping it", "err", err)
			}
			return outcome
		}
	}
}

// drain ends whatever is left of the command's process group and waits for the output pipes
// to close: SIGTERM, up to KillGrace for the pipes, SIGKILL, and finally closing the pipes
// if processes that left the group still hold them.
func (s *job) drain(pid int, copied <-chan struct{}, pipes ...*os.File) {
	s.signalGroup(pid, unix.SIGTERM)
	pending := len(pipes)
	grace := time.NewTimer(s.spec.KillGrace)
	defer grace.Stop()
	var lastResort <-chan time.Time
	for pending > 0 {
		select {
		case <-copied:
			pending--
		case <-grace.C:
			s.signalGroup(pid, unix.SIGKILL)
			t := time.NewTimer(drainAfterKill)
			defer t.Stop()
			lastResort = t.C
		case <-lastResort:
			s.log.Warn("output pipes still open after the process group was killed; closing them")
			for _, p := range pipes {
				p.Close()
			}
			lastResort = nil
		}
	}
	s.signalGroup(pid, unix.SIGKILL)
	for _, p := range pipes {
		p.Close()
	}
}

// signalGroup signals the command's process group; a group that is already gone is fine.
func (s *job) signalGroup(pgid int, sig unix.Signal) {
	if err := unix.Kill(-pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		s.log.Warn("could not signal the process group", "pgid", pgid, "signal", unix.SignalName(sig), "err", err)
	}
}

// spooler stores one output stream up to a cap and accounts for all of it. Its file is
// created with the first byte: a stream that stays empty (most of them) costs no file.
//
// Bytes up to the cap move from the pipe into the file by splice(2), which leaves every byte
// either in the pipe or in the file whenever the process dies; the digest is taken from
// the file afterwards. So a keeper that takes the stream over (keeper.go) finds every stored
// byte in the file and the rest in the pipe: nothing read is lost with the supervisor.
type spooler struct {
	path string
	file *os.File // nil until the first byte is stored
	cap  int64
	hash hash.Hash
	// info is owned by copyFrom until it signals completion.
	info     StreamInfo
	writeErr error
	// uncounted: a keeper took over a stream already at its cap, so bytes past the cap that
	// the dead supervisor read (counted and hashed in its memory only) are missing from
	// info.Bytes and the digest.
	uncounted bool
}

func newSpooler(dir, name string, limit int64) *spooler {
	return &spooler{path: filepath.Join(dir, name), cap: limit, hash: sha256.New()}
}

// resumeSpooler continues a stream another process spooled until it died: what its file holds
// is counted and hashed first.
func resumeSpooler(dir, name string, limit int64) (*spooler, error) {
	sp := newSpooler(dir, name, limit)
	f, err := os.OpenFile(sp.path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return sp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("supervisor: resume %s: %w", name, err)
	}
	n, err := io.Copy(sp.hash, f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("supervisor: resume %s: %w", name, err)
	}
	sp.file, sp.info.Bytes, sp.info.Stored = f, n, n
	sp.uncounted = n >= limit
	return sp, nil
}

// create makes the spool file (only if absent: a spool directory runs once).
func (sp *spooler) create() error {
	f, err := os.OpenFile(sp.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create spool file: %w", err)
	}
	sp.file = f
	return nil
}

func (sp *spooler) close() {
	if sp.file != nil {
		sp.file.Close()
	}
}

// spliceChunk bounds one splice: a pipe holds 64 KiB by default.
const spliceChunk = 1 << 20

// copyFrom reads r to EOF (or until r is closed), storing up to the cap and hashing
// everything, then signals done. It keeps reading past the cap and past write errors so the
// command never blocks on a full pipe.
func (sp *spooler) copyFrom(r *os.File, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	buf := make([]byte, 32<<10)
	if sp.writeErr == nil && sp.info.Stored < sp.cap {
		if eof := sp.spliceFrom(r, buf); eof {
			return
		}
	}
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sp.hash.Write(buf[:n])
			sp.info.Bytes += int64(n)
			if room := sp.cap - sp.info.Stored; room > 0 && sp.writeErr == nil {
				if sp.file == nil {
					sp.writeErr = sp.create()
				}
				if sp.writeErr == nil {
					w, werr := sp.file.WriteAt(buf[:min(int64(n), room)], sp.info.Stored)
					sp.info.Stored += int64(w)
					sp.writeErr = werr
				}
			}
		}
		if err != nil {
			return // io.EOF, or the pipe was closed by drain
		}
	}
}

// spliceFrom moves bytes from the pipe r into the file until the cap, EOF (true) or a file
// error; each spliced piece is then read back from the page cache into the digest.
func (sp *spooler) spliceFrom(r *os.File, buf []byte) (eof bool) {
	raw, err := r.SyscallConn()
	if err != nil {
		return false // the read loop takes over
	}
	for sp.info.Stored < sp.cap && sp.writeErr == nil {
		var n int64
		var serr error
		rerr := raw.Read(func(fd uintptr) bool {
			if sp.file == nil {
				// Create the file only once there is a byte for it.
				avail, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ)
				if err == nil && avail == 0 {
					fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
					if k, _ := unix.Poll(fds, 0); k > 0 && fds[0].Revents&unix.POLLHUP != 0 {
						eof = true // no writer left, nothing buffered
						return true
					}
					return false // wait for data
				}
				if sp.writeErr = sp.create(); sp.writeErr != nil {
					return true
				}
			}
			off := sp.info.Stored
			n, serr = unix.Splice(int(fd), nil, int(sp.file.Fd()), &off, int(min(sp.cap-sp.info.Stored, spliceChunk)), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			return !errors.Is(serr, unix.EAGAIN)
		})
		switch {
		case eof:
			return true
		case sp.writeErr != nil:
			return false
		case rerr != nil:
			return false // closed by drain: the read loop sees it too
		case serr != nil:
			if errors.Is(serr, unix.EINVAL) || errors.Is(serr, unix.ENOSYS) {
				return false // no splice here: read and write instead
			}
			sp.writeErr = serr
			return false
		case n == 0:
			return true
		}
		if err := sp.digest(sp.info.Stored, n, buf); err != nil {
			sp.writeErr = err
		}
		sp.info.Stored += n
		sp.info.Bytes += n
	}
	return false
}

// digest hashes n stored bytes at off, read back from the file.
func (sp *spooler) digest(off, n int64, buf []byte) error {
	for n > 0 {
		k, err := sp.file.ReadAt(buf[:min(n, int64(len(buf)))], off)
		sp.hash.Write(buf[:k])
		off, n = off+int64(k), n-int64(k)
		if err != nil && n > 0 {
			return fmt.Errorf("read back spool file: %w", err)
		}
	}
	return nil
}

// finish completes info and makes the stored bytes durable; call after copyFrom signalled
// done. An empty stream has no file and no bytes to lose, so it costs no fsync; always (the
// per-command supervisor) creates and syncs the file anyway, as that mode's readers expect both
// files. A stored byte is synced before the outcome that covers it is recorded, so a
// recorded outcome never points at output a crash took.
func (sp *spooler) finish(always bool) error {
	sp.info.Truncated = sp.info.Stored < sp.info.Bytes || sp.uncounted
	sp.info.SHA256 = hex.EncodeToString(sp.hash.Sum(nil))
	if sp.uncounted {
		// The dead supervisor's count of what it read past the cap died with it.
		sp.info.SHA256 = ""
		sp.info.Bytes = max(sp.info.Bytes, sp.info.Stored+1)
	}
	if sp.writeErr != nil {
		return fmt.Errorf("supervisor: spool %s: %w", filepath.Base(sp.path), sp.writeErr)
	}
	if sp.file == nil && always {
		// The per-command supervisor's contract: both files exist once the status does.
		if err := sp.create(); err != nil {
			return fmt.Errorf("supervisor: %w", err)
		}
	}
	if sp.file == nil {
		return nil
	}
	if err := sp.file.Sync(); err != nil {
		return fmt.Errorf("supervisor: sync %s: %w", filepath.Base(sp.path), err)
	}
	return nil
}

// emptyDigest is the SHA-256 of an empty stream.
func emptyDigest() string { return hex.EncodeToString(sha256.New().Sum(nil)) }
