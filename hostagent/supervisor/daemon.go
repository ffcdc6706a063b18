package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/peercred"
	"github.com/postern-dev/postern/internal/procfs"
	"github.com/postern-dev/postern/internal/ratelog"
)

// The long-lived supervisor ("daemon"): one process per hostagent lifetime that forks every
// command itself, so a command costs a fork/exec of its shell instead of a Go process start.
// It lives in its own session, apart from the SSH-facing agent: an agent that is killed,
// restarted or upgraded leaves it and its commands running, and the next agent adopts them
// through it (Adopt). It exits once no agent holds a lease on it and none of its commands is
// left. Protocol, per connection (a unix socket only its user can reach, see socket.go;
// peers checked by SO_PEERCRED on both sides): one JSON request line, then JSON reply lines
// (see request and reply).
//
// # Durability
//
// The daemon syncs nothing but non-empty output. Its records (supervisor record, process
// record, status) are page-cache writes, which every process on this boot sees and a process crash
// does not lose; the host marker, synced by the agent, is what survives a machine crash:
// `started` before the command is handed over, its end (with sizes and digests) after the
// status arrives. So a command costs two fsyncs on the host, both the marker's. What that
// changes after a machine crash is the hostagent's business (recover.go): a marker of an
// earlier boot cannot lean on spool records, which may be lost.

// Environment of a supervisor start (Main).
const (
	// EnvSupervisorDir, when set, makes Main the long-lived supervisor, keeping its pid
	// record and log in that directory.
	EnvSupervisorDir = "POSTERN_SUPERVISOR_DIR"
	// envSupervisorDetached marks the second stage of the supervisor's start: the first
	// starts it in a new session and exits, so the keeper (and the supervisor, its child) is
	// not the hostagent's child and its starter has nothing to reap later.
	envSupervisorDetached = "POSTERN_SUPERVISOR_DETACHED"
)

// protocolVersion is sent in every request; a supervisor answers requests of its own version
// only, so an agent and a supervisor of different releases never misread each other.
// Requests an adopting agent needs (wait, cancel) must keep their meaning across releases.
const protocolVersion = 1

// Bounds on the protocol.
const (
	// maxRequestBytes bounds a request line: a start carries the spec, whose command and
	// environment are bounded at 256 KiB each.
	maxRequestBytes = 1 << 20
	// leaseGrace is how long a new supervisor waits for its first lease before it exits.
	leaseGrace = 30 * time.Second
)

// Request operations.
const (
	opLease = "lease" // hold the supervisor open while the connection lasts
	opStart = "start" // run spec in dir; replies started (or error), then status
	opWait  = "wait"  // reply started (once it has), then status once the execution in dir ends
	// opCancel, sent on a start or wait connection after its request, cancels that
	// execution; on the same connection it can never overtake the start it cancels.
	opCancel = "cancel"
)

type request struct {
	V    int    `json:"v"`
	Op   string `json:"op"`
	Dir  string `json:"dir,omitempty"`
	Spec *Spec  `json:"spec,omitempty"`
}

type reply struct {
	// Started is the command's process record, the first reply to start.
	Started *processRecord `json:"started,omitempty"`
	// Status ends start and wait.
	Status *Status `json:"status,omitempty"`
	// Error: the request failed; StartFailed says the command provably did not run and the
	// status file records why; Unknown says the supervisor has no such execution (it ended
	// before, and its status file is the answer, or it never ran here).
	Error       string `json:"error,omitempty"`
	StartFailed bool   `json:"start_failed,omitempty"`
	Unknown     bool   `json:"unknown,omitempty"`
	NotRunning  bool   `json:"not_running,omitempty"`
	AlreadyUsed bool   `json:"already_used,omitempty"`
	// Exiting: the supervisor takes no more leases or starts (it is idle and leaving); the
	// answer to a lease's end says whether it is.
	Exiting bool `json:"exiting,omitempty"`
	OK      bool `json:"ok,omitempty"`
}

// supervisorRecordName is the file, in the supervisor dir, that names a running supervisor
// (pid + start time) for operators and test harnesses; removed when it exits.
func supervisorRecordName(pid int) string { return "supervisor-" + strconv.Itoa(pid) + ".json" }

// daemon is the long-lived supervisor's state.
type daemon struct {
	dir  string
	self supervisorRecord
	log  *slog.Logger
	// refusals logs connections of other users and failed accepts within bounds
	// (internal/ratelog): the log lives in the host's data dir.
	refusals *ratelog.Logger
	ln       *net.UnixListener
	// forks carries every command start to the one thread that forks (see forker).
	forks chan forkRequest
	// keeper keeps the commands' pipes and takes them over if this process dies (keeper.go);
	// nil without one.
	keeper *keeperLink
	// commandOOM is the oom_score_adj commands get back (the keeper lowered ours); "" if
	// they inherit the right one.
	commandOOM string
	wg         sync.WaitGroup // connections and jobs

	mu         sync.Mutex // guards the fields below
	jobs       map[string]*daemonJob
	leases     int
	everLeased bool
	exiting    bool
}

// daemonJob is an execution the daemon runs.
type daemonJob struct {
	cancel     chan struct{}
	cancelOnce sync.Once
	started    chan struct{} // closed (once, by markStarted) when proc is set or never will be
	startOnce  sync.Once
	proc       processRecord
	done       chan struct{} // closed once status is set and written
	status     Status
}

// markStarted records whether the command started (p, or p.Error), once; it reports whether
// this call was the one.
func (j *daemonJob) markStarted(p processRecord) bool {
	first := false
	j.startOnce.Do(func() {
		j.proc, first = p, true
		close(j.started)
	})
	return first
}

type forkRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

// runDaemon serves as the long-lived supervisor until it is idle. ready gets the supervisor's
// supervisor record (its identity) once it listens.
func runDaemon(dir string, ready *os.File, keeper *keeperLink, logger *slog.Logger) error {
	defer ready.Close()
	self := os.Getpid()
	start, err := procfs.StartTime(self)
	if err != nil {
		return fmt.Errorf("supervisor: own start time: %w", err)
	}
	debug.SetMemoryLimit(supervisorMemoryLimit)
	d := &daemon{
		dir:        dir,
		keeper:     keeper,
		commandOOM: os.Getenv(envCommandOOM),
		self:       supervisorRecord{PID: self, Start: start},
		log:        logger,
		refusals:   ratelog.New(logger, ratelog.Options{Where: "supervisor"}),
		forks:      make(chan forkRequest),
		jobs:       map[string]*daemonJob{},
	}
	if keeper != nil {
		parent := os.Getppid()
		if parentStart, err := procfs.StartTime(parent); err == nil {
			d.self.Keeper, d.self.KeeperStart = parent, parentStart
		}
	}
	d.ln, d.self.Socket, err = listenSupervisor(dir)
	if err != nil {
		return err
	}
	// Its own signals must not end it: an agent's stop (SIGTERM to the agent's group, a
	// terminal's SIGHUP or SIGINT) is not meant for the commands it supervises. Caught into a
	// channel nobody reads (Notify drops what does not fit), not ignored: an ignored
	// disposition would be inherited by every command.
	signal.Notify(make(chan os.Signal, 1), unix.SIGHUP, unix.SIGINT, unix.SIGTERM)
	recPath := filepath.Join(dir, supervisorRecordName(self))
	if data, err := json.Marshal(d.self); err == nil {
		if err := writeFileVolatile(dir, filepath.Base(recPath), data); err != nil {
			d.log.Warn("could not write the supervisor record", "err", err)
		}
	}
	defer os.Remove(recPath)
	forkerDone := make(chan struct{})
	go d.forker(forkerDone)

	data, err := json.Marshal(d.self)
	if err != nil {
		return err
	}
	if _, err := ready.Write(data); err != nil {
		return fmt.Errorf("supervisor: report ready: %w", err)
	}
	ready.Close()

	idle := time.AfterFunc(leaseGrace, func() { d.maybeExit(true) })
	defer idle.Stop()
	for {
		conn, err := d.ln.AcceptUnix()
		if err != nil {
			d.mu.Lock()
			exiting := d.exiting
			d.mu.Unlock()
			if exiting {
				break
			}
			if errors.Is(err, net.ErrClosed) {
				break
			}
			d.refusals.Log(slog.LevelWarn, "accept", "accept failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.serve(conn)
		}()
	}
	d.wg.Wait()
	close(d.forks)
	<-forkerDone
	d.refusals.Close()
	return nil
}

// forker starts every command on one locked OS thread that lives as long as the process, so
// the Pdeathsig (SIGKILL) of a command no keeper holds fires exactly when the supervisor
// dies.
func (d *daemon) forker(done chan<- struct{}) {
	defer close(done)
	runtime.LockOSThread() // never unlocked: the thread must not be reused or end
	for r := range d.forks {
		r.errc <- r.cmd.Start()
	}
}

func (d *daemon) startCommand(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	d.forks <- forkRequest{cmd: cmd, errc: errc}
	return <-errc
}

// maybeExit stops accepting once nothing holds the supervisor: no lease and no command.
// grace is the lease-grace timer firing: a supervisor nobody leased exits then.
func (d *daemon) maybeExit(grace bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.exiting || d.leases > 0 || len(d.jobs) > 0 || (!d.everLeased && !grace) {
		return
	}
	d.exiting = true
	d.ln.Close()
}

// serve answers one connection's request.
func (d *daemon) serve(conn *net.UnixConn) {
	defer conn.Close()
	if err := checkPeer(conn, 0); err != nil {
		d.refusals.Log(slog.LevelWarn, "peer", "refused a connection", "err", err)
		return
	}
	br := bufio.NewReader(conn)
	req, err := readMessage[request](br)
	if err != nil {
		writeMessage(conn, reply{Error: err.Error()})
		return
	}
	if req.V != protocolVersion {
		writeMessage(conn, reply{Error: fmt.Sprintf("protocol version %d, this supervisor speaks %d", req.V, protocolVersion)})
		return
	}
	switch req.Op {
	case opLease:
		d.lease(conn)
	case opStart:
		d.start(conn, br, req)
	case opWait:
		d.wait(conn, br, req.Dir)
	default:
		writeMessage(conn, reply{Error: fmt.Sprintf("unknown operation %q", req.Op)})
	}
}

// lease holds the supervisor open until the connection closes (the agent exited or let go).
func (d *daemon) lease(conn *net.UnixConn) {
	d.mu.Lock()
	if d.exiting {
		d.mu.Unlock()
		writeMessage(conn, reply{Exiting: true})
		return
	}
	d.leases++
	d.everLeased = true
	d.mu.Unlock()
	if writeMessage(conn, reply{OK: true}) == nil {
		io.Copy(io.Discard, conn) // until the agent closes it
	}
	d.mu.Lock()
	d.leases--
	d.mu.Unlock()
	d.maybeExit(false)
	d.mu.Lock()
	exiting := d.exiting
	d.mu.Unlock()
	writeMessage(conn, reply{Exiting: exiting})
}

// followUp reads what a client sends after its request — cancels — until it hangs up, and
// then closes gone. The execution does not depend on the client staying.
func followUp(br *bufio.Reader, j *daemonJob, gone chan<- struct{}) {
	defer close(gone)
	for {
		msg, err := readMessage[request](br)
		if err != nil {
			return
		}
		if msg.Op == opCancel {
			j.cancelOnce.Do(func() { close(j.cancel) })
		}
	}
}

// start runs one execution: registered before its supervisor record exists, so a wait or an
// adoption never finds a record of this supervisor that it does not know.
func (d *daemon) start(conn *net.UnixConn, br *bufio.Reader, req request) {
	if req.Spec == nil || !filepath.IsAbs(req.Dir) {
		writeMessage(conn, reply{Error: "start needs a spec and an absolute spool directory"})
		return
	}
	spec := req.Spec.withDefaults()
	if err := spec.validate(); err != nil {
		writeMessage(conn, reply{Error: err.Error()})
		return
	}
	j := &daemonJob{cancel: make(chan struct{}), started: make(chan struct{}), done: make(chan struct{})}
	d.mu.Lock()
	switch {
	case d.exiting:
		d.mu.Unlock()
		writeMessage(conn, reply{Exiting: true})
		return
	case d.jobs[req.Dir] != nil:
		d.mu.Unlock()
		writeMessage(conn, reply{Error: ErrAlreadyUsed.Error(), AlreadyUsed: true})
		return
	}
	d.jobs[req.Dir] = j
	d.mu.Unlock()
	defer d.maybeExit(false)
	gone := make(chan struct{})
	go followUp(br, j, gone)
	defer func() {
		conn.CloseRead()
		<-gone
	}()

	rec, err := json.Marshal(d.self)
	if err == nil {
		// The supervisor record is what says "may have run". It needs no fsync: it is read on this
		// boot only (recover.go), and create-if-absent is atomic in the kernel, so a Fence
		// and this record still exclude each other.
		err = createFileVolatile(req.Dir, SupervisorFile, rec)
	}
	if err != nil {
		d.finish(req.Dir, j, Status{})
		writeMessage(conn, reply{Error: err.Error(), AlreadyUsed: errors.Is(err, ErrAlreadyUsed)})
		return
	}
	log := d.log.With("execution_id", spec.ExecutionID)
	jb := &job{
		dir: req.Dir, spec: spec, log: log, start: d.startCommand, cancel: j.cancel,
		keeper: d.keeper, commandOOM: d.commandOOM,
		tell: func(p processRecord) {
			if j.markStarted(p) && p.Error == "" { // else the status reply says why
				writeMessage(conn, reply{Started: &p})
			}
		},
	}
	// The job goes on whatever happens to this connection: an agent that dies here leaves
	// the command running, and the next one adopts it (opWait).
	st := jb.run()
	if err := d.record(req.Dir, st); err != nil {
		log.Error("could not write the status record", "err", err)
		if st.Error != "" {
			st.Error += "; "
		}
		st.Error += err.Error()
	}
	d.finish(req.Dir, j, st)
	d.keeper.done(req.Dir)
	if st.Outcome == OutcomeStartFailed {
		writeMessage(conn, reply{Error: st.Error, StartFailed: true, Status: &st})
		return
	}
	writeMessage(conn, reply{Status: &st})
}

// record writes the status file. Not synced: the host marker records the outcome durably
// (see Durability above); the file serves this boot's readers (Follow, adoption).
func (d *daemon) record(dir string, st Status) error {
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	return writeFileVolatile(dir, StatusFile, data)
}

// finish ends a job: its status is final and it is forgotten (its status file answers from
// now on).
func (d *daemon) finish(dir string, j *daemonJob, st Status) {
	j.markStarted(processRecord{Error: "the command did not start"})
	j.status = st
	close(j.done)
	d.mu.Lock()
	delete(d.jobs, dir)
	d.mu.Unlock()
}

func (d *daemon) lookup(dir string) *daemonJob {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.jobs[dir]
}

// wait replies with the execution in dir's process record once it started, and its status
// once it ends.
func (d *daemon) wait(conn *net.UnixConn, br *bufio.Reader, dir string) {
	j := d.lookup(dir)
	if j == nil {
		writeMessage(conn, reply{Unknown: true})
		return
	}
	gone := make(chan struct{})
	go followUp(br, j, gone)
	defer func() {
		conn.CloseRead()
		<-gone
	}()
	select {
	case <-j.started:
		if j.proc.Error == "" {
			p := j.proc
			writeMessage(conn, reply{Started: &p})
		}
	case <-gone:
		return // a waiter that hangs up stops waiting; the job does not care
	}
	select {
	case <-j.done:
		st := j.status
		writeMessage(conn, reply{Status: &st})
	case <-gone:
	}
}

// checkPeer refuses a peer of another user, and — with pid > 0 — a peer that is not that
// process: abstract sockets (the previous release's, and the fallback) have no file
// permissions, so credentials are the access check.
func checkPeer(conn *net.UnixConn, pid int) error {
	cred, err := peercred.Read(conn)
	if err != nil {
		return err
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("peer pid %d is uid %d, not this supervisor's uid %d", cred.Pid, cred.Uid, os.Geteuid())
	}
	if pid > 0 && int(cred.Pid) != pid {
		return fmt.Errorf("peer is pid %d, not the supervisor pid %d", cred.Pid, pid)
	}
	return nil
}

func readMessage[T any](r *bufio.Reader) (T, error) {
	var v T
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > maxRequestBytes {
			return v, fmt.Errorf("message larger than %d bytes", maxRequestBytes)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, chunk...) // a long line (a start's spec): read on
			continue
		}
		if err != nil {
			return v, err
		}
		if line == nil {
			line = chunk // the common case: the line fit in the buffer, no copy
		} else {
			line = append(line, chunk...)
		}
		break
	}
	if err := json.Unmarshal(line, &v); err != nil {
		return v, fmt.Errorf("parse message: %w", err)
	}
	return v, nil
}

func writeMessage(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(data, '\n'))
	return err
}

// startDaemon is Main's supervisor mode: the first stage starts the detached second stage
// and exits; the second is the keeper (keeper.go), which starts the third, the supervisor
// that serves, as its child.
func startDaemon(dir string, logger *slog.Logger) int {
	var st unix.Stat_t
	if err := unix.Fstat(readyFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		fmt.Fprintln(os.Stderr, "supervisor: fd 3 is not a readiness pipe; the supervisor is started by the hostagent only")
		return 2
	}
	ready := os.NewFile(readyFD, "ready")
	if os.Getenv(envSupervisorDetached) == "" {
		// /proc/self/exe is this binary even if a package upgrade replaced the file.
		cmd := exec.Command("/proc/self/exe", Subcommand)
		cmd.Env = append(os.Environ(), envSupervisorDetached+"=1")
		cmd.Stderr = os.Stderr
		cmd.ExtraFiles = []*os.File{ready}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "supervisor: start: %v\n", err)
			return 1
		}
		// Not waited for: it is the init process's (or a subreaper's) to reap once this exits.
		cmd.Process.Release()
		return 0
	}
	if err := CloseInheritedOnExec(); err != nil {
		fmt.Fprintf(os.Stderr, "supervisor: %v\n", err)
		return 1
	}
	if os.Getenv(envSupervisorKept) == "" {
		// The second stage: the keeper, which starts the supervisor as its child.
		if err := runKeeper(dir, ready, logger); err != nil {
			logger.Error("keeper failed", "err", err)
			return 1
		}
		return 0
	}
	keeper := &keeperLink{fd: keeperFD}
	if err := unix.Fstat(keeperFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		keeper = nil
	}
	if err := runDaemon(dir, ready, keeper, logger); err != nil {
		logger.Error("supervisor failed", "err", err)
		return 1
	}
	return 0
}

// errSupervisorGone: the supervisor went away (or would not take the request) before it
// answered.
var errSupervisorGone = errors.New("supervisor: supervisor is gone")

// dialSupervisor connects to the supervisor rec names and checks that the peer is that
// process of this user.
func dialSupervisor(ctx context.Context, rec supervisorRecord) (*net.UnixConn, error) {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", rec.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errSupervisorGone, err)
	}
	conn := c.(*net.UnixConn)
	if err := checkPeer(conn, rec.PID); err != nil {
		conn.Close()
		return nil, fmt.Errorf("supervisor: supervisor %s: %w", rec.Socket, err)
	}
	return conn, nil
}
