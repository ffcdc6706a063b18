package supervisor

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
)

// The keeper: the long-lived supervisor's parent, so that a supervisor's death (the OOM
// killer, a bug, an operator's kill) kills no command and loses no outcome.
//
// The supervisor's start is keeper → supervisor, both in the session the first stage made.
// The keeper is a child subreaper (PR_SET_CHILD_SUBREAPER) that does nothing per command
// but hold two descriptors: before the supervisor forks a command it sends the keeper the
// read ends of the command's output pipes (SCM_RIGHTS over a socketpair), then the command's
// pid. So:
//
//   - the command never writes into a pipe without a reader (no SIGPIPE, no EPIPE), whenever
//     the supervisor dies: the keeper's copies keep the pipes open;
//   - when the supervisor dies its commands are re-parented to the keeper (the nearest
//     subreaper), which alone can then wait for them and read their exit status;
//   - the keeper takes each one over where the supervisor left it: it resumes the spool
//     files (every byte is either in the file or still in the pipe, see spooler), drains the
//     pipes, enforces the rest of the timeout and a cancel (the spool dir's cancel file),
//     terminates what is left of the command's group, reaps it and writes the status file
//     the supervisor would have written. The hostagent's handle, seeing the supervisor gone,
//     waits for that file while the keeper lives (handle.go).
//
// The keeper also reaps whatever else is re-parented to it (a command's orphaned
// descendants) and exits once the supervisor is gone and nothing is left to take over.
//
// What stays unknowable: a command whose supervisor died within the microseconds between
// forking it and sending the keeper its pid (the keeper reaps it as a stranger; the spool
// dir is left without a status, and the execution is interrupted); and every command of a
// supervisor that dies after its keeper died (a keeper killed by hand): a command started
// while the keeper is gone gets Pdeathsig as before, one started before runs on with its
// end unrecorded.

// Environment of the supervisor the keeper starts.
const (
	// envSupervisorKept marks the third stage of the start: the supervisor, whose parent is
	// its keeper and whose keeper socket is keeperFD.
	envSupervisorKept = "POSTERN_SUPERVISOR_KEPT"
	// envCommandOOM carries the oom_score_adj the commands get back (the hostagent's), when
	// the keeper lowered its own (and so the supervisor's) below it.
	envCommandOOM = "POSTERN_SUPERVISOR_COMMAND_OOM"
)

// keeperFD is the supervisor's end of the keeper socket (ExtraFiles[1]).
const keeperFD = 4

const (
	// supervisorOOMScore is the keeper's and the supervisor's oom_score_adj when the system
	// allows it (CAP_SYS_RESOURCE): the OOM killer picks them last.
	supervisorOOMScore = -900
	// supervisorMemoryLimit and keeperMemoryLimit are Go's soft memory limits: near them
	// the garbage collector runs harder (at most half the CPU); nothing is refused, and
	// past them the process goes on growing as its work needs.
	supervisorMemoryLimit = 256 << 20
	keeperMemoryLimit     = 32 << 20
	// keeperCancelPoll is how often a taken-over execution looks for its cancel file.
	keeperCancelPoll = 50 * time.Millisecond
	// keeperBatch is how long the keeper lets the supervisor's messages gather once woken.
	keeperBatch = 20 * time.Millisecond
	// maxKeeperMessage bounds a message to the keeper.
	maxKeeperMessage = 4 << 10
)

// keeperMessage is what the supervisor tells its keeper about one spool directory.
type keeperMessage struct {
	// Op is "add" (with the pipes' read ends and Spec), "started" (with Proc) or "done".
	Op   string         `json:"op"`
	Dir  string         `json:"dir"`
	Spec *Spec          `json:"spec,omitempty"` // no command or environment: the keeper needs neither
	Proc *processRecord `json:"proc,omitempty"`
}

// keeperLink is the supervisor's end of the keeper socket. A nil link, or one whose keeper
// is gone, keeps nothing.
type keeperLink struct {
	fd   int
	mu   sync.Mutex // guards gone
	gone bool
}

// add hands the keeper the read ends of a command's pipes before it is forked; false means
// the keeper will not keep it (there is none, or it is gone).
func (k *keeperLink) add(dir string, spec Spec, stdout, stderr *os.File) bool {
	if k == nil {
		return false
	}
	kept := Spec{ExecutionID: spec.ExecutionID, Timeout: spec.Timeout, KillGrace: spec.KillGrace, OutputCap: spec.OutputCap}
	return k.send(keeperMessage{Op: "add", Dir: dir, Spec: &kept}, fdOf(stdout), fdOf(stderr)) == nil
}

// started tells the keeper the process of a command it keeps.
func (k *keeperLink) started(dir string, p processRecord) {
	k.send(keeperMessage{Op: "started", Dir: dir, Proc: &p})
}

// done tells the keeper the supervisor recorded the execution's end (or it did not start).
func (k *keeperLink) done(dir string) {
	if k != nil {
		k.send(keeperMessage{Op: "done", Dir: dir})
	}
}

func (k *keeperLink) send(msg keeperMessage, fds ...int) error {
	k.mu.Lock()
	gone := k.gone
	k.mu.Unlock()
	if gone {
		return errKeeperGone
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for {
		// One datagram per message (SOCK_SEQPACKET): concurrent jobs never interleave.
		err = unix.Sendmsg(k.fd, data, oob, nil, unix.MSG_NOSIGNAL)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		k.mu.Lock()
		k.gone = true
		k.mu.Unlock()
		return fmt.Errorf("%w: %v", errKeeperGone, err)
	}
	return nil
}

var errKeeperGone = errors.New("supervisor: keeper is gone")

// ownOOMScore reads this process's oom_score_adj.
func ownOOMScore() (string, error) {
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	return strings.TrimSpace(string(data)), err
}

// lowerOOMScore gives this process supervisorOOMScore and returns the score it had, which
// its commands are to get back; "" when it could not (not permitted: then nothing changed
// and the commands inherit the right score anyway).
func lowerOOMScore() string {
	orig, err := ownOOMScore()
	if err != nil {
		return ""
	}
	if n, err := strconv.Atoi(orig); err != nil || n <= supervisorOOMScore {
		return ""
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(supervisorOOMScore)), 0); err != nil {
		return ""
	}
	return orig
}

// resetOOM gives a command the score the supervisor's starter had instead of the
// supervisor's low one, which it inherited at the fork. Start returns once the command has
// called execve (os/exec waits for it), so the command runs its first instructions with the
// inherited score: the shell's own start-up takes far longer than this write, so nothing
// it forks inherits the low score.
func (s *job) resetOOM(pid int) {
	if s.commandOOM == "" {
		return
	}
	if err := os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(s.commandOOM), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("could not reset the command's oom_score_adj", "pid", pid, "err", err)
	}
}

// runKeeper is the keeper: it starts the supervisor (which reports ready on ready) and keeps
// its commands until the supervisor is gone and none is left.
func runKeeper(dir string, ready *os.File, logger *slog.Logger) error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("supervisor: keeper: become a subreaper: %w", err)
	}
	commandOOM := lowerOOMScore()
	debug.SetMemoryLimit(keeperMemoryLimit)
	// Subscribed before the supervisor exists, so no exit goes unnoticed. Children are
	// collected on SIGCHLD and the socket read through the runtime's poller: a keeper that
	// sat in blocking syscalls would keep the runtime's monitor thread busy at every message.
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, unix.SIGCHLD)
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("supervisor: keeper socket: %w", err)
	}
	theirs := os.NewFile(uintptr(pair[1]), "keeper")
	env := append(os.Environ(), envSupervisorKept+"=1")
	if commandOOM != "" {
		env = append(env, envCommandOOM+"="+commandOOM)
	}
	// Not waited for by os/exec: the reaper below is the only waiter in this process.
	p, err := os.StartProcess("/proc/self/exe", []string{os.Args[0], Subcommand}, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr, ready, theirs},
	})
	theirs.Close()
	ready.Close()
	if err != nil {
		unix.Close(pair[0])
		return fmt.Errorf("supervisor: keeper: start the supervisor: %w", err)
	}
	k := &keeper{dir: dir, log: logger, sup: p.Pid, closed: make(chan struct{}), jobs: map[string]*keptJob{}, byPID: map[int]*keptJob{}}
	go k.receive(pair[0])
	k.reap(sigchld)
	k.wg.Wait()
	return nil
}

// keeper is the keeper's state.
type keeper struct {
	dir    string
	log    *slog.Logger
	sup    int           // the supervisor's pid
	closed chan struct{} // closed when the supervisor's socket is closed and read to its end
	wg     sync.WaitGroup

	mu    sync.Mutex // guards the fields below
	jobs  map[string]*keptJob
	byPID map[int]*keptJob // taken over, not yet reaped
}

// keptJob is one command the keeper holds the pipes of.
type keptJob struct {
	dir            string
	spec           Spec
	proc           processRecord
	stdout, stderr *os.File
	reaped         chan struct{} // closed once a taken-over command is reaped
}

func (j *keptJob) closePipes() {
	j.stdout.Close()
	j.stderr.Close()
}

// receive applies the supervisor's messages until its end of the socket closes.
func (k *keeper) receive(fd int) {
	defer close(k.closed)
	f, raw, err := pollable(fd)
	if err != nil {
		k.log.Error("keeper: supervisor socket", "err", err)
		unix.Close(fd)
		return
	}
	defer f.Close()
	buf := make([]byte, maxKeeperMessage)
	oob := make([]byte, unix.CmsgSpace(2*4))
	for {
		var n, oobn int
		var rerr error
		waited := false
		err := raw.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
			if errors.Is(rerr, unix.EAGAIN) {
				waited = true
				return false
			}
			return true
		})
		if waited {
			// Woken after the socket ran dry: let messages gather before reading on, so a
			// busy supervisor costs the keeper one wake-up per keeperBatch, not three per
			// command. Meanwhile the descriptors in flight stay open in the socket.
			time.Sleep(keeperBatch)
		}
		if errors.Is(rerr, unix.EINTR) {
			continue
		}
		if err != nil || rerr != nil || n == 0 {
			return
		}
		files := receivedFiles(oob[:oobn])
		var msg keeperMessage
		if err := json.Unmarshal(buf[:n], &msg); err != nil {
			k.log.Warn("keeper: bad message", "err", err)
			for _, f := range files {
				f.Close()
			}
			continue
		}
		k.apply(msg, files)
	}
}

// pollable makes the socket fd nonblocking and hands it to the runtime's poller.
func pollable(fd int) (*os.File, syscall.RawConn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fd), "supervisor")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, raw, nil
}

// receivedFiles are the descriptors a message carried.
func receivedFiles(oob []byte) []*os.File {
	var files []*os.File
	cmsgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, c := range cmsgs {
		fds, err := unix.ParseUnixRights(&c)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			// Nonblocking, so the runtime's poller serves them if the keeper reads them.
			unix.SetNonblock(fd, true)
			files = append(files, os.NewFile(uintptr(fd), "pipe"))
		}
	}
	return files
}

func (k *keeper) apply(msg keeperMessage, files []*os.File) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch j := k.jobs[msg.Dir]; {
	case msg.Op == "add" && j == nil && len(files) == 2 && msg.Spec != nil:
		k.jobs[msg.Dir] = &keptJob{dir: msg.Dir, spec: *msg.Spec, stdout: files[0], stderr: files[1], reaped: make(chan struct{})}
		return
	case msg.Op == "started" && j != nil && msg.Proc != nil && msg.Proc.PID > 0:
		j.proc = *msg.Proc
	case msg.Op == "done":
		if j != nil { // nil: a command that never reached the keeper
			j.closePipes()
			delete(k.jobs, msg.Dir)
		}
	default:
		k.log.Warn("keeper: unexpected message", "op", msg.Op, "dir", msg.Dir)
	}
	for _, f := range files {
		f.Close()
	}
}

// reap waits for every child: the supervisor (then takes its commands over), a taken-over
// command (left to its job, which reaps it), anything else re-parented here (reaped). It
// returns when no child is left.
func (k *keeper) reap(sigchld <-chan os.Signal) {
	supHandled := false
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return // ECHILD: nothing left
		}
		pid := siginfoPID(&info)
		if pid == 0 {
			<-sigchld // children, none exited yet
			continue
		}
		if pid == k.sup && !supHandled {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, 0, nil)
			supHandled = true
			k.supervisorGone(ws)
			continue
		}
		k.mu.Lock()
		j := k.byPID[pid]
		k.mu.Unlock()
		if j != nil {
			<-j.reaped
			continue
		}
		if !supHandled {
			if st, err := procfs.ReadStat(k.sup); err == nil && st.State == 'Z' {
				// The supervisor died and this came to us with its death: take over first,
				// as this may be a command it did not name yet (nameOrphans).
				var ws unix.WaitStatus
				unix.Wait4(k.sup, &ws, 0, nil)
				supHandled = true
				k.supervisorGone(ws)
				continue
			}
		}
		unix.Wait4(pid, nil, unix.WNOHANG, nil)
	}
}

// siginfoPID is si_pid of a SIGCHLD siginfo (after signo, errno, code and padding).
func siginfoPID(info *unix.Siginfo) int {
	raw := (*[unsafe.Sizeof(*info)]byte)(unsafe.Pointer(info))
	return int(int32(binary.NativeEndian.Uint32(raw[16:20])))
}

// supervisorGone takes over every command the supervisor left running, once all it said
// before it went has been read.
func (k *keeper) supervisorGone(ws unix.WaitStatus) {
	<-k.closed
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.jobs) > 0 {
		k.log.Warn("keeper: the supervisor died; taking its commands over", "supervisor", k.sup, "status", waitStatusText(ws), "commands", len(k.jobs))
	}
	candidates := k.nameOrphans()
	for dir, j := range k.jobs {
		delete(k.jobs, dir)
		if j.proc.PID == 0 {
			if candidates == 0 && !pipeHasWriter(j.stdout) && !pipeHasWriter(j.stderr) {
				// No process holds the pipes the command was to get, and no unnamed command
				// is among the keeper's children: it never reached execve.
				k.neverStarted(j)
			} else {
				k.log.Warn("keeper: the supervisor died before it named the command's process, and it is not found", "dir", dir)
			}
			j.closePipes()
			continue
		}
		k.byPID[j.proc.PID] = j
		k.wg.Go(func() { k.finish(j) })
	}
}

func waitStatusText(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return unix.SignalName(ws.Signal())
	}
	return "exit " + strconv.Itoa(ws.ExitStatus())
}

// finish carries a taken-over command to its end and writes its status.
func (k *keeper) finish(j *keptJob) {
	log := k.log.With("execution_id", j.spec.ExecutionID)
	spec := j.spec.withDefaults()
	if spec.Timeout > 0 {
		spec.Timeout = max(time.Until(j.proc.StartedAt.Add(spec.Timeout)), time.Nanosecond)
	}
	// Evidence for the hostagent that a keeper answers for this directory now, and which
	// process it follows.
	rec, _ := json.Marshal(j.proc)
	if err := writeFileVolatile(j.dir, KeptFile, rec); err != nil {
		log.Warn("keeper: could not mark the spool dir kept", "err", err)
	}
	cancel, stop := make(chan struct{}), make(chan struct{})
	go watchCancelFile(j.dir, cancel, stop)
	defer close(stop)
	stdout, err1 := resumeSpooler(j.dir, StdoutFile, spec.OutputCap)
	stderr, err2 := resumeSpooler(j.dir, StderrFile, spec.OutputCap)
	for i, err := range []error{err1, err2} {
		if err != nil {
			log.Warn("keeper: could not resume a spool file", "err", err)
			sp := newSpooler(j.dir, []string{StdoutFile, StderrFile}[i], spec.OutputCap)
			sp.writeErr = err
			if i == 0 {
				stdout = sp
			} else {
				stderr = sp
			}
		}
	}
	defer stdout.close()
	defer stderr.close()
	jb := &job{dir: j.dir, spec: spec, log: log, cancel: cancel}
	st := jb.supervise(j.proc, stdout, stderr, j.stdout, j.stderr, func() (syscall.WaitStatus, error) {
		defer close(j.reaped)
		var ws unix.WaitStatus
		_, err := unix.Wait4(j.proc.PID, &ws, 0, nil)
		k.mu.Lock()
		delete(k.byPID, j.proc.PID)
		k.mu.Unlock()
		return syscall.WaitStatus(ws), err
	})
	notes := []string{"the supervisor died; its keeper recorded the end"}
	if stdout.uncounted || stderr.uncounted {
		notes = append(notes, "bytes past the output cap that the supervisor read are not counted")
	}
	if st.Error != "" {
		notes = append(notes, st.Error)
	}
	st.Error = strings.Join(notes, "; ")
	data, err := json.Marshal(st)
	if err == nil {
		err = writeFileVolatile(j.dir, StatusFile, data)
	}
	if err != nil {
		log.Error("keeper: could not write the status record", "err", err)
	}
}

// watchCancelFile closes cancel once the spool dir's cancel file exists, until stop.
func watchCancelFile(dir string, cancel, stop chan struct{}) {
	t := time.NewTicker(keeperCancelPoll)
	defer t.Stop()
	for {
		if _, err := os.Stat(filepath.Join(dir, CancelFile)); err == nil {
			close(cancel)
			return
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// Bounds on finding the commands a dying supervisor had forked but not named.
const (
	nameOrphanTries = 20
	nameOrphanDelay = 10 * time.Millisecond
)

// nameOrphans finds the process of each job the supervisor died before naming (it died
// while the fork and execve were under way, a millisecond or so): a child of the keeper now,
// whose stdout or stderr is the job's pipe. A fork still on its way may not have set up its
// descriptors yet, so it looks again a few times. A command that already exited (a zombie,
// which has no descriptors left) is named only when it is the one candidate for the one
// job left. It returns how many children that could be a command stay unnamed. Called with
// k.mu held.
func (k *keeper) nameOrphans() (candidates int) {
	for try := 0; try < nameOrphanTries; try++ {
		unnamed := map[uint64]*keptJob{}
		for _, j := range k.jobs {
			if j.proc.PID != 0 {
				continue
			}
			for _, f := range []*os.File{j.stdout, j.stderr} {
				var st unix.Stat_t
				if unix.Fstat(fdOf(f), &st) == nil {
					unnamed[st.Ino] = j
				}
			}
		}
		if len(unnamed) == 0 {
			return 0
		}
		candidates = 0
		var zombies []int
		for _, pid := range k.strangers() {
			stat, err := procfs.ReadStat(pid)
			if err != nil || stat.PGID != pid {
				continue // not a command: each leads a session of its own
			}
			candidates++
			if stat.State == 'Z' {
				zombies = append(zombies, pid)
				continue
			}
			for _, fd := range []string{"1", "2"} {
				link, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd)
				ino, ok := strings.CutPrefix(link, "pipe:[")
				if err != nil || !ok {
					continue
				}
				n, _ := strconv.ParseUint(strings.TrimSuffix(ino, "]"), 10, 64)
				if j := unnamed[n]; j != nil && j.proc.PID == 0 {
					candidates--
					j.proc = processRecord{PID: pid, Start: stat.StartTime, StartedAt: time.Now().UTC()}
					k.log.Warn("keeper: named a command the supervisor died starting", "dir", j.dir, "pid", pid)
				}
			}
		}
		left := map[*keptJob]bool{}
		for _, j := range unnamed {
			if j.proc.PID == 0 {
				left[j] = true
			}
		}
		if len(left) == 1 && len(zombies) == 1 {
			for j := range left {
				st, _ := procfs.ReadStat(zombies[0])
				j.proc = processRecord{PID: zombies[0], Start: st.StartTime, StartedAt: time.Now().UTC()}
			}
			return candidates - 1
		}
		if len(left) == 0 {
			return candidates
		}
		time.Sleep(nameOrphanDelay)
	}
	return candidates
}

// pipeHasWriter reports whether some process still holds the write end of the pipe whose
// read end is r, or bytes are left in it.
func pipeHasWriter(r *os.File) bool {
	fd := fdOf(r)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		return true
	}
	if n == 0 {
		return true // open, nothing to read: a writer is there
	}
	avail, err := unix.IoctlGetInt(fd, unix.TIOCINQ)
	return err != nil || avail > 0 || fds[0].Revents&unix.POLLHUP == 0
}

// neverStarted records that the supervisor died before it started j's command.
func (k *keeper) neverStarted(j *keptJob) {
	k.log.Warn("keeper: the supervisor died before it started the command", "dir", j.dir)
	empty := StreamInfo{SHA256: emptyDigest()}
	st := Status{
		ExecutionID: j.spec.ExecutionID, Outcome: OutcomeStartFailed, ExitCode: -1,
		Error:   "the supervisor died before it started the command",
		EndedAt: time.Now().UTC(), Stdout: empty, Stderr: empty,
	}
	data, err := json.Marshal(st)
	if err == nil {
		err = writeFileVolatile(j.dir, StatusFile, data)
	}
	if err != nil {
		k.log.Error("keeper: could not write the status record", "err", err)
	}
}

// strangers are this process's children that are neither the supervisor nor a command it
// named, from /proc.
func (k *keeper) strangers() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	known := map[int]bool{k.sup: true}
	for _, j := range k.jobs {
		known[j.proc.PID] = true
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || known[pid] {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.PPID == self {
			out = append(out, pid)
		}
	}
	return out
}

// fdOf is f's descriptor. Unlike f.Fd it leaves the file as it is: Fd puts a file the
// runtime polls into blocking mode.
func fdOf(f *os.File) int {
	fd := -1
	if raw, err := f.SyscallConn(); err == nil {
		raw.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}
