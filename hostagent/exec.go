package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// ErrExecutionIDUnavailable refuses an exec request whose execution id belongs to another
// identity. It says no more than that this identity cannot use the id: nothing of the other
// execution (state, output, marker, timing) is disclosed, and nothing is started.
var ErrExecutionIDUnavailable = errors.New("POSTERN_EXECUTION_ID is not available to this identity (account and key); nothing was started — use a new execution id")

// ErrNotYourProcess refuses a checkpoint from a process outside the execution's process tree.
var ErrNotYourProcess = errors.New("hostagent: caller is not in the execution's process tree")

// markerStore is what the executor needs of a markers.Store.
type markerStore interface {
	Create(ctx context.Context, r *markers.Record) (*markers.Record, error)
	Transition(ctx context.Context, id string, from, to markers.State, note string, mutate func(*markers.Record) error) (*markers.Record, error)
	Advance(ctx context.Context, id string, from markers.State, path []markers.State, note string, mutate func(*markers.Record) error) (*markers.Record, error)
	Update(ctx context.Context, id, note string, mutate func(*markers.Record) error) (*markers.Record, error)
	Get(id string) (*markers.Record, error)
	List(q markers.Query) ([]*markers.Record, string, error)
	FindByOperationKey(key string) (*markers.Record, error)
	Export(w io.Writer) error
}

var _ markerStore = (*markers.Store)(nil)

// ExecutorOptions configure an Executor.
type ExecutorOptions struct {
	Config Config
	Store  markerStore
	// SupervisorExe is the binary started as the per-host supervisor (`SupervisorExe
	// supervise`, see supervisor.Main). Default: SupervisorBinary next to this process's
	// executable if it is there, else this executable.
	SupervisorExe string
	// SocketPath is the local control socket, handed to commands for checkpoints.
	SocketPath string
	Logger     *slog.Logger
}

// Executor runs commands under markers: the Handler the SSH server hands validated work to.
//
// For every execution id it writes the marker (create-if-absent, synced) before the command
// starts, and never starts an id whose marker exists: a duplicate attaches to the running
// execution or replays the finished one. Commands run under the per-host supervisor, detached
// from the SSH session; the executor watches them and records how they ended.
type Executor struct {
	cfg Config // as it started; the settings a reload may change are in settings
	// settings is the config whose retry_failed_operations, kill_grace and output_cap a new
	// command takes (a reload replaces it, reload.go); a command keeps what it started with.
	settings atomic.Pointer[Config]
	store    markerStore
	spool    string
	quota    *supervisor.Quota // spool_cap, asked before each launch
	sup      *supervisor.Client
	spares   *supervisor.SpareDirs // spool directories made ahead
	boot     string                // this boot's id, recorded in every marker
	sock     string
	log      *slog.Logger

	// ctx is the parent of the watchers and of command starts; cancelled by Close.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // watchers

	// opMu serializes the operation-key check with marker creation, so two ids cannot both
	// take one operation key. Lock order: opMu before mu.
	opMu sync.Mutex

	mu   sync.Mutex // guards live
	live map[string]*execution
}

// NewExecutor returns an executor; call Recover before serving.
func NewExecutor(opts ExecutorOptions) (*Executor, error) {
	if opts.Store == nil {
		return nil, errors.New("hostagent: executor needs a marker store")
	}
	exe := opts.SupervisorExe
	if exe == "" {
		var err error
		if exe, err = defaultSupervisorExe(); err != nil {
			return nil, err
		}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	spool := filepath.Join(opts.Config.DataDir, "spool")
	if err := os.MkdirAll(spool, 0o700); err != nil {
		return nil, fmt.Errorf("hostagent: spool dir: %w", err)
	}
	sup, err := supervisor.NewClient(exe, filepath.Join(opts.Config.DataDir, SupervisorDir), logger.With("component", "supervisor"))
	if err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	boot, err := bootID()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Executor{
		cfg: opts.Config, store: opts.Store, spool: spool, sup: sup, boot: boot, sock: opts.SocketPath,
		spares: supervisor.NewSpareDirs(spool, spareSpoolDirs, logger),
		log:    logger.With("component", "executor"), ctx: ctx, cancel: cancel,
		live: make(map[string]*execution), quota: supervisor.NewQuota(spool, opts.Config.SpoolCap),
	}
	e.settings.Store(&opts.Config)
	return e, nil
}

// spareSpoolDirs is how many empty spool directories the executor keeps made ahead: enough
// for a burst of concurrent starts.
const spareSpoolDirs = 16

// SupervisorDir, in the data dir, holds the long-lived supervisors' records and log.
const SupervisorDir = "supervisor"

// bootID names this boot of the machine.
func bootID() (string, error) {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("hostagent: read boot id: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// SupervisorBinary is the dedicated supervisor binary (cmd/postern-supervisor): it starts in
// about half the time of a re-executed agent, which runs every package's initialization first.
const SupervisorBinary = "postern-supervisor"

func defaultSupervisorExe() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("hostagent: find own executable for the supervisor: %w", err)
	}
	dedicated := filepath.Join(filepath.Dir(self), SupervisorBinary)
	if info, err := os.Stat(dedicated); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
		return dedicated, nil
	}
	return self, nil
}

// Close stops watching and lets go of the supervisor. Running commands keep running under
// it; the next Executor re-adopts them in Recover.
func (e *Executor) Close() {
	e.cancel()
	e.wg.Wait()
	e.sup.Close()
	e.spares.Close()
}

// Exec runs req under a marker, or attaches to / replays the execution that has its id.
func (e *Executor) Exec(ctx context.Context, s gliderssh.Session, req ExecRequest) {
	log := e.log.With("execution_id", req.ExecutionID, "account", req.Account.Name)
	x, fresh := e.claim(req.ExecutionID)
	if !fresh {
		e.attach(ctx, s, x, req, true)
		return
	}
	rec, err := e.createMarker(ctx, req)
	var taken *operationTakenError
	switch {
	case errors.Is(err, markers.ErrExists):
		e.release(x, nil)
		e.duplicate(ctx, s, req, rec)
		return
	case errors.As(err, &taken):
		e.release(x, nil)
		e.refuseOperationTaken(s, req, taken.prior)
		return
	case err != nil:
		e.release(x, nil)
		log.Error("marker write failed; command not started", "err", err)
		fmt.Fprintf(s.Stderr(), "postern: cannot write the marker, command not started: %v\n", err)
		s.Exit(hostproto.ExitRefused)
		return
	}
	if req.Assigned {
		fmt.Fprintf(s.Stderr(), "postern: no execution id was given; running as %s\n", req.ExecutionID)
	}
	e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(rec)})
	e.launch(x, req)
	e.attach(ctx, s, x, req, false)
}

// claim returns the live execution of id, or registers a new one (fresh) that the caller
// must start or release.
func (e *Executor) claim(id string) (x *execution, fresh bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x := e.live[id]; x != nil {
		return x, false
	}
	x = &execution{id: id, store: e.store, log: e.log.With("execution_id", id), dir: filepath.Join(e.spool, id),
		started: make(chan struct{}), done: make(chan struct{}), marked: markers.Started}
	e.live[id] = x
	return x, true
}

// release ends a claimed execution with its final marker (nil: look it up in the store).
func (e *Executor) release(x *execution, final *markers.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.live[x.id] == x {
		delete(e.live, x.id)
	}
	select {
	case <-x.started:
	default:
		close(x.started)
	}
	x.final = final
	close(x.done)
}

type operationTakenError struct{ prior *markers.Record }

func (e *operationTakenError) Error() string {
	return fmt.Sprintf("operation key %q belongs to %s (%s)", e.prior.OperationKey, e.prior.ID, e.prior.State)
}

// refuseOperationTaken answers a request whose operation key belongs to the execution
// prior. Its owner is shown prior's marker and id; another identity learns only that the key
// is taken — which it must, as the key is host-wide — never by which execution.
func (e *Executor) refuseOperationTaken(s gliderssh.Session, req ExecRequest, prior *markers.Record) {
	if req.Identity.ownsRecord(prior) {
		e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(prior), Replayed: true})
		fmt.Fprintf(s.Stderr(), "postern: %v; not started\n", &operationTakenError{prior: prior})
	} else {
		fmt.Fprintf(s.Stderr(), "postern: operation key %q is taken by another execution; not started\n", req.OperationKey)
	}
	s.Exit(hostproto.ExitOperationTaken)
}

// refuseForeign answers a request for an execution id that belongs to another identity, the
// same way whatever that execution's state: nothing of it is sent and nothing starts. (An
// unknown id would start; this one cannot, so the caller — who chose the id — learns that it
// cannot use it, and nothing else.)
func (e *Executor) refuseForeign(s gliderssh.Session, req ExecRequest) {
	e.log.Warn("refused an execution id that belongs to another identity", "execution_id", req.ExecutionID,
		"account", req.Account.Name, "actor", boundForLog(req.Identity.Actor()))
	fmt.Fprintf(s.Stderr(), "postern: %v\n", ErrExecutionIDUnavailable)
	s.Exit(hostproto.ExitRefused)
}

// createMarker writes the marker of req in state started, after checking its operation key.
func (e *Executor) createMarker(ctx context.Context, req ExecRequest) (*markers.Record, error) {
	if req.OperationKey != "" {
		e.opMu.Lock()
		defer e.opMu.Unlock()
		prior, err := e.store.FindByOperationKey(req.OperationKey)
		switch {
		case errors.Is(err, markers.ErrNotFound):
		case err != nil:
			return nil, fmt.Errorf("look up operation key: %w", err)
		case prior.ID != req.ExecutionID && !operationFree(prior.State, prior.ExitCode, e.settings.Load().RetryFailedOperations):
			return nil, &operationTakenError{prior: prior}
		}
	}
	return e.store.Create(ctx, &markers.Record{
		ID:           req.ExecutionID,
		Actor:        req.Identity.Actor(),
		Fingerprint:  envValue(req.Env, hostproto.EnvFingerprint),
		OperationKey: req.OperationKey,
		Channel:      "ssh",
		Account:      req.Account.Name,
		Command:      e.markerCommand(req),
		Cwd:          req.Cwd,
		SpoolDir:     filepath.Join(e.spool, req.ExecutionID),
		BootID:       e.boot,
	})
}

// markerCommand is the argv the marker records for req.
func (e *Executor) markerCommand(req ExecRequest) []string {
	return []string{e.shell(req), "-c", req.Command}
}

func (e *Executor) shell(req ExecRequest) string {
	if req.Account.Shell != "" {
		return req.Account.Shell
	}
	return e.cfg.Shell
}

// launch starts the command of a freshly marked execution under the supervisor and watches it.
func (e *Executor) launch(x *execution, req ExecRequest) {
	x.owner = req.Identity.owner()
	if err := e.quota.Admit(filepath.Base(x.dir)); err != nil {
		e.release(x, x.startFailed(e.ctx, err))
		return
	}
	// A spare renamed into place; if that fails, Start makes the directory (and says why if
	// it cannot).
	e.spares.Make(x.dir)
	settings := e.settings.Load()
	h, err := e.sup.Start(e.ctx, x.dir, supervisor.Spec{
		ExecutionID: req.ExecutionID,
		Command:     req.Command,
		Shell:       e.shell(req),
		Dir:         req.Cwd,
		Env:         e.commandEnv(req),
		Credential:  req.Account.Credential,
		Timeout:     req.Timeout,
		KillGrace:   settings.KillGrace,
		OutputCap:   settings.OutputCap,
	})
	if err != nil {
		e.release(x, x.startFailed(e.ctx, err))
		return
	}
	x.handle = h
	close(x.started)
	e.wg.Add(1)
	go e.watch(x)
}

// watch follows a started (or re-adopted) execution to its end and releases it with its
// final marker.
func (e *Executor) watch(x *execution) {
	defer e.wg.Done()
	final, ended := x.follow(e.ctx)
	if !ended {
		// Shutting down: the command keeps running and the next start re-adopts it.
		x.handle.Close()
		return
	}
	e.release(x, final)
	// After the final marker and the answer, not before: measuring the directory is a
	// listing and a stat per file, none of which the caller needs to wait for.
	e.quota.Finished(filepath.Base(x.dir))
}

// duplicate answers a request whose marker already existed: nothing new is started unless
// the marker proves the command never ran.
func (e *Executor) duplicate(ctx context.Context, s gliderssh.Session, req ExecRequest, rec *markers.Record) {
	if !req.Identity.ownsRecord(rec) {
		e.refuseForeign(s, req)
		return
	}
	x, fresh := e.claim(rec.ID)
	if !fresh {
		e.attach(ctx, s, x, req, true)
		return
	}
	do := duplicateAnswer(rec.State, slices.Equal(rec.Command, e.markerCommand(req)))
	switch do {
	case runAgain:
		e.restart(ctx, s, x, req, rec)
		return
	case refuseOtherCommand:
		e.release(x, nil)
		fmt.Fprintf(s.Stderr(), "postern: %s was created for another command; not started\n", rec.ID)
		s.Exit(hostproto.ExitRefused)
		return
	}
	e.release(x, nil)
	e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(rec), Replayed: true})
	switch do {
	case replayStartFailure:
		fmt.Fprintf(s.Stderr(), "postern: %s did not start: %s; it did not run\n", rec.ID, rec.StartError)
		e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(rec), Replayed: true, Final: true})
		s.Exit(exitStatus(rec.State, rec.ExitCode, rec.Signal))
	case replayOutcome:
		fmt.Fprintf(s.Stderr(), "postern: %s already ran at %s (%s), replaying\n", rec.ID, startedAt(rec), rec.State)
		e.replay(s, rec)
		e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(rec), Replayed: true, Final: true})
		s.Exit(exitStatus(rec.State, rec.ExitCode, rec.Signal))
	default:
		fmt.Fprintf(s.Stderr(), "postern: %s started at %s and its outcome is unknown (%s); it is not run again\n",
			rec.ID, startedAt(rec), rec.State)
		s.Exit(hostproto.ExitUnknownOutcome)
	}
}

// restart runs an execution whose marker proves it never ran, under the same marker, in a
// fresh spool dir (the old one is fenced).
func (e *Executor) restart(ctx context.Context, s gliderssh.Session, x *execution, req ExecRequest, rec *markers.Record) {
	x.marked = rec.State
	restarted, err := x.restart(ctx, filepath.Join(e.spool, rec.ID+"."+strconv.FormatInt(time.Now().UnixNano(), 36)))
	if err != nil {
		e.release(x, nil)
		fmt.Fprintf(s.Stderr(), "postern: cannot restart %s: %v\n", rec.ID, err)
		s.Exit(hostproto.ExitRefused)
		return
	}
	e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(restarted), Replayed: true})
	fmt.Fprintf(s.Stderr(), "postern: %s never ran; starting it now\n", rec.ID)
	e.launch(x, req)
	e.attach(ctx, s, x, req, false)
}

// attach streams a live execution's output to s from the start and ends with its exit
// status, if it belongs to req's identity. If the client goes away first, the execution goes
// on.
func (e *Executor) attach(ctx context.Context, s gliderssh.Session, x *execution, req ExecRequest, replayed bool) {
	select {
	case <-x.started:
	case <-ctx.Done():
		return
	}
	if x.owner != (owner{}) && !req.Identity.owns(x.owner) {
		e.refuseForeign(s, req)
		return
	}
	if replayed {
		if rec, err := e.store.Get(x.id); err == nil {
			e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(rec), Replayed: true})
			fmt.Fprintf(s.Stderr(), "postern: %s is already running (started at %s), attaching\n", x.id, startedAt(rec))
		}
	}
	if x.handle != nil {
		var wg sync.WaitGroup
		// An interrupted execution ends the copy with ErrVanished; the final marker says so.
		wg.Go(func() { supervisor.Follow(ctx, x.dir, supervisor.StreamStdout, 0, s, x.done) })
		wg.Go(func() { supervisor.Follow(ctx, x.dir, supervisor.StreamStderr, 0, s.Stderr(), x.done) })
		wg.Wait()
	}
	select {
	case <-x.done:
	case <-ctx.Done():
		return
	}
	final := x.final
	if final == nil {
		rec, err := e.store.Get(x.id)
		switch {
		case errors.Is(err, markers.ErrNotFound):
			// The request this one joined was refused before its marker was written.
			fmt.Fprintf(s.Stderr(), "postern: %s has no marker; not started\n", x.id)
			s.Exit(hostproto.ExitRefused)
			return
		case err != nil:
			fmt.Fprintf(s.Stderr(), "postern: %s: %v\n", x.id, err)
			s.Exit(hostproto.ExitUnknownOutcome)
			return
		}
		if x.handle == nil {
			// The marker existed before the claim: answer as a duplicate.
			e.duplicate(ctx, s, req, rec)
			return
		}
		final = rec
	}
	switch final.State {
	case markers.StartFailed:
		fmt.Fprintf(s.Stderr(), "postern: %s did not start: %s; it did not run\n", final.ID, final.StartError)
	case markers.NotStarted:
		fmt.Fprintf(s.Stderr(), "postern: %s\n", strings.Join(final.Evidence, "; "))
	}
	e.sendMarker(s, hostproto.MarkerMessage{Marker: WireMarker(final), Replayed: replayed, Final: true})
	s.Exit(exitStatus(final.State, final.ExitCode, final.Signal))
}

// replay writes a finished execution's stored output.
func (e *Executor) replay(s gliderssh.Session, rec *markers.Record) {
	for _, f := range []struct {
		name string
		w    io.Writer
		size int64
	}{{supervisor.StdoutFile, s, rec.Output.StdoutBytes}, {supervisor.StderrFile, s.Stderr(), rec.Output.StderrBytes}} {
		file, err := os.Open(filepath.Join(rec.SpoolDir, f.name))
		if errors.Is(err, os.ErrNotExist) && f.size == 0 {
			continue // nothing was written; an empty file need not survive a crash
		}
		if err != nil {
			fmt.Fprintf(s.Stderr(), "postern: stored output is gone (%v)\n", errors.Unwrap(err))
			return
		}
		io.Copy(f.w, file)
		file.Close()
	}
	if rec.Output.Truncated {
		fmt.Fprintf(s.Stderr(), "postern: output was truncated at %d bytes per stream\n", e.settings.Load().OutputCap)
	}
}

func (e *Executor) sendMarker(s gliderssh.Session, m hostproto.MarkerMessage) {
	payload, err := json.Marshal(m)
	if err == nil {
		_, err = s.SendRequest(hostproto.MarkerRequest, false, payload)
	}
	if err != nil {
		e.log.Debug("marker request not sent", "err", err)
	}
}

// commandEnv is the command's whole environment: the account's basics, the allowlisted
// client variables (POSTERN_EXECUTION_ID included) and the checkpoint socket.
func (e *Executor) commandEnv(req ExecRequest) []string {
	env := []string{
		"HOME=" + req.Account.Home,
		"USER=" + req.Account.Name,
		"LOGNAME=" + req.Account.Name,
		"SHELL=" + e.shell(req),
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}
	for _, kv := range req.Env {
		// The socket is ours to name; a client-sent value must not shadow it.
		if !strings.HasPrefix(kv, hostproto.EnvMarkerSocket+"=") {
			env = append(env, kv)
		}
	}
	if e.sock != "" {
		env = append(env, hostproto.EnvMarkerSocket+"="+e.sock)
	}
	return env
}

func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

func startedAt(r *markers.Record) string {
	t := r.CreatedAt
	if rt, ok := r.StateTimes[markers.Running]; ok {
		t = rt
	}
	return t.UTC().Format(time.RFC3339)
}
