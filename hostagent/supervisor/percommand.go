package supervisor

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
)

// The per-command mode: one supervisor process per execution, which is how a hostagent of the
// previous release starts each command (`postern-shim shim` with $POSTERN_SHIM_SPOOL_DIR and
// the spec in the spool directory). This release's hostagent hands every command to the
// long-lived supervisor (daemon.go) instead; the mode stays so that a hostagent of the
// previous release, still running while the package is upgraded under it, can start
// commands with this release's binary. Both modes run a command through the same job.

// mainPerCommand is Main's per-command mode.
//
// Deprecated: remove once no supported release starts per-command supervisors: the release
// after this one (hostproto's compatibility window is one release), together with
// legacySubcommand, EnvSpoolDir and job.perCommand.
func mainPerCommand(args []string) int {
	dir := os.Getenv(EnvSpoolDir)
	switch {
	case len(args) == 0 && dir != "":
	case len(args) == 1 && dir == "":
		dir = args[0]
	default:
		fmt.Fprintln(os.Stderr, "usage: "+EnvSpoolDir+"=DIR postern-supervisor "+Subcommand+" (started by the hostagent, not by people)")
		return 2
	}
	// Without the starter's pipe on fd 3, fd 3 may be any file (or become one); never write
	// to it.
	var st unix.Stat_t
	if err := unix.Fstat(readyFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		fmt.Fprintln(os.Stderr, "supervisor: fd 3 is not a readiness pipe; the supervisor is started by the hostagent only")
		return 2
	}
	// The command inherits stdin, stdout and stderr only: not the pipe (the starter reads it
	// to EOF), nor anything the hostagent was started with.
	if err := CloseInheritedOnExec(); err != nil {
		fmt.Fprintf(os.Stderr, "supervisor: %v; not starting the command\n", err)
		return 1
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	s := &perCommand{dir: dir, ready: os.NewFile(readyFD, "ready"), log: logger.With("spool", dir)}
	if err := s.run(); err != nil {
		s.log.Error("supervisor failed", "err", err)
		return 1
	}
	return 0
}

// perCommand supervises one execution in a process of its own.
//
// Deprecated: see mainPerCommand.
type perCommand struct {
	dir   string
	ready *os.File // closed once the parent has been told whether the command started
	log   *slog.Logger
}

// run supervises the execution and returns nil once its status record is written.
func (s *perCommand) run() error {
	defer s.ready.Close()
	var spec Spec
	data, err := readRecord(filepath.Join(s.dir, SpecFile))
	if err == nil {
		spec, err = parseSpec(data)
	}
	if err != nil {
		err = fmt.Errorf("supervisor: load spec: %w", err)
		s.tellParent(processRecord{Error: err.Error()})
		return err
	}
	s.log = s.log.With("execution_id", spec.ExecutionID)

	// Subscribe before the supervisor record exists: from then on a SIGTERM means "cancel", never
	// "die without a status". SIGHUP is caught (and dropped) rather than ignored, because an
	// ignored disposition would be inherited by the command.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	defer signal.Stop(sigs)

	self := os.Getpid()
	selfStart, err := procfs.StartTime(self)
	if err != nil {
		s.tellParent(processRecord{Error: err.Error()})
		return fmt.Errorf("supervisor: own start time: %w", err)
	}
	rec, err := json.Marshal(supervisorRecord{PID: self, Start: selfStart})
	if err != nil {
		return fmt.Errorf("supervisor: encode supervisor record: %w", err)
	}
	if err := createFileExclusive(s.dir, SupervisorFile, rec); err != nil {
		s.tellParent(processRecord{Error: err.Error()})
		return err
	}

	// Pdeathsig fires when the thread that started the command exits, not the process; keep
	// this goroutine on its thread for the rest of the supervisor's life.
	runtime.LockOSThread()
	cancel := make(chan struct{})
	go func() {
		// Ends with the process: the supervisor exits once the status is written.
		for sig := range sigs {
			if sig != unix.SIGHUP {
				close(cancel)
				return
			}
		}
	}()
	j := &job{dir: s.dir, spec: spec, log: s.log, start: (*exec.Cmd).Start, cancel: cancel, tell: s.tellParent, perCommand: true}
	st := j.run()
	out, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("supervisor: encode status: %w", err)
	}
	return writeFileAtomic(s.dir, StatusFile, out)
}

// tellParent sends the readiness message to Start; a vanished parent is not an error.
func (s *perCommand) tellParent(msg processRecord) {
	data, err := json.Marshal(msg)
	if err == nil {
		_, err = s.ready.Write(data)
	}
	if err != nil {
		s.log.Warn("could not tell the parent whether the command started", "err", err)
	}
	s.ready.Close()
}
