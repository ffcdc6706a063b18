package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/durable"
)

// The per-command mode of Main, as a hostagent of the previous release drives it while its
// package is upgraded: one `exe shim` process per execution (legacySubcommand). startPerCommand is that
// release's starter, kept here to test that the binary of this release still serves it.

// startPerCommand runs spec in the spool directory dir (created if missing; it must not have been
// used before) under a detached supervisor, started as `exe shim` in its own session with dir
// in $POSTERN_SHIM_SPOOL_DIR (not in its arguments, which every local user can read), and
// returns once the command is running. exe is normally os.Executable().
//
// If the command could not be started the error is a *StartError (wrapping ErrStartFailed)
// and the status file says why; the command provably did not run. If ctx ends before the
// command is reported running, Start cancels the execution, waits for the supervisor to
// finish and returns ctx's cause; the spool directory then tells whether anything ran. Other errors mean the
// supervisor failed before it could start the command, or never started (no supervisor record).
//
// The returned handle's Wait must be called to reap the supervisor.
func startPerCommand(ctx context.Context, exe, dir string, spec Spec) (*Handle, error) {
	dir, spec, err := prepare(dir, spec)
	if err != nil {
		return nil, err
	}
	// The supervisor syncs its record inside dir; dir's own entry must be durable too, or a
	// power loss could take the whole directory and make a started command look never
	// started.
	if err := durable.SyncDir(filepath.Dir(dir)); err != nil {
		return nil, fmt.Errorf("supervisor: create spool dir: %w", err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("supervisor: encode spec: %w", err)
	}
	// The spec is read by the supervisor moments from now, from the page cache: it needs no
	// fsync (a machine crash ends the supervisor with it). The supervisor record is what must be
	// durable, and the supervisor syncs that one before the command starts.
	if err := createFileVolatile(dir, SpecFile, data); err != nil {
		return nil, err
	}
	cmd, readyR, err := startSupervisorProcess(exe, legacySubcommand, EnvSpoolDir+"="+dir, filepath.Join(dir, LogFile))
	if err != nil {
		return nil, err
	}
	defer readyR.Close()
	// The supervisor is our unreaped child, so its pid cannot have been reused.
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("supervisor: pidfd of supervisor: %w", err)
	}
	h := &Handle{dir: dir, perCommand: cmd, pidfd: pidfd}

	msg, err := readReady(ctx, readyR)
	if err != nil && ctx.Err() != nil {
		unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0)
		h.reap()
		return nil, fmt.Errorf("supervisor: start %s: %w", dir, err)
	}
	if err != nil || msg.Error != "" {
		h.reap()
		if st, serr := ReadStatus(dir); serr == nil && st.Outcome == OutcomeStartFailed {
			return nil, &StartError{Cause: st.Error}
		}
		if err == nil {
			err = errors.New(msg.Error)
		}
		return nil, fmt.Errorf("supervisor: supervisor of %s failed: %w (see %s)", dir, err, LogFile)
	}
	rec, err := readSupervisorRecord(dir)
	if err != nil {
		// The supervisor writes its record before it starts the command; this is not reachable
		// unless someone else edits the spool directory.
		return nil, fmt.Errorf("supervisor: command running but supervisor record unreadable: %w", err)
	}
	h.proc = Process{SupervisorPID: rec.PID, SupervisorStart: rec.Start, PID: msg.PID, PIDStart: msg.Start, StartedAt: msg.StartedAt}
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
