package hostagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/markers"
)

// execution owns one execution on the host while this process has it (launched, restarted or
// re-adopted): its spool directory, its supervisor handle, and every move of its marker after
// the marker was created. Each move carries out a decision of decide.go; nothing else writes
// the marker's state meanwhile (the control operations add checkpoints, never states).
type execution struct {
	id    string
	store markerStore
	log   *slog.Logger

	// dir is the spool directory of the current attempt (a restart gets a new one).
	dir string
	// owner is the identity the execution belongs to, set before started is closed when
	// this process launched or adopted the command; zero when the claim was released
	// without a launch (the marker, if any, then says whose it is).
	owner owner
	// started is closed once the supervisor started the command or failed to; handle is set
	// before (nil if the command did not start).
	started chan struct{}
	handle  *supervisor.Handle
	// done is closed once the final marker is written; final is set before (nil if the
	// marker turned out to exist already, see Executor.claim, or its write failed).
	done  chan struct{}
	final *markers.Record
	// marked is the marker's state as this execution last wrote or read it; only the
	// goroutine that moves the marker (launch, then watch; or recovery) touches it.
	marked markers.State
}

// move writes m on the marker along path (nil: the one edge to m.To), with mutate (may be
// nil) in the same write, and notes the state reached.
func (x *execution) move(ctx context.Context, m hostMove, path []markers.State, mutate func(*markers.Record)) (*markers.Record, error) {
	if path == nil {
		path = []markers.State{m.To}
	}
	rec, err := x.store.Advance(ctx, x.id, x.marked, path, m.Note, func(r *markers.Record) error {
		if m.Evidence {
			r.Evidence = append(r.Evidence, m.Note)
		}
		if m.StartError != "" {
			r.StartError = m.StartError
		}
		if mutate != nil {
			mutate(r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	x.marked = rec.State
	return rec, nil
}

// startFailed records that the freshly marked command did not start (startFailure decides
// how). If the write fails it returns nil: the marker stays started, so every caller is told
// the outcome is unknown (254) and nothing runs again — never "not run" on a claim the store
// did not keep.
func (x *execution) startFailed(ctx context.Context, startErr error) *markers.Record {
	kind, cause := supervisorFailed, ""
	var se *supervisor.StartError
	switch {
	case errors.As(startErr, &se):
		kind, cause = cannotStart, se.Cause
	case errors.Is(startErr, supervisor.ErrStartFailed):
		kind = refusedBeforeSupervisor
	}
	m, needFence := startFailure(kind, startErr.Error(), cause, notFenced)
	if needFence {
		fence := fenced
		if supervisor.Fence(x.dir) != nil {
			fence = fenceLost
		}
		m, _ = startFailure(kind, startErr.Error(), cause, fence)
	}
	x.log.Warn("command did not start", "state", m.To, "err", startErr)
	rec, err := x.move(ctx, m, nil, nil)
	if err != nil {
		x.log.Error("marker write failed", "err", err)
		return nil
	}
	return rec
}

// runningDelay is how long a command may run before its marker is moved to running on its
// own. A command that ends sooner gets started → running → its end in one durable write:
// two marker fsyncs per short command instead of three. Until then the supervisor's record
// is what proves the command started (recovery adopts a started marker that has one).
const runningDelay = 20 * time.Millisecond

// follow waits for the started command to end, moving the marker to running once it has run
// for runningDelay, and records its outcome. It returns false when ctx ended first (the agent
// is shutting down: the command goes on, and the next agent adopts it).
func (x *execution) follow(ctx context.Context) (final *markers.Record, ended bool) {
	wctx, cancel := context.WithTimeout(ctx, runningDelay)
	st, err := x.handle.Wait(wctx)
	cancel()
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		if x.marked == markers.Started {
			x.markRunning(ctx, hostMove{To: markers.Running, Note: "command started"})
		}
		st, err = x.handle.Wait(ctx)
	}
	if ctx.Err() != nil {
		return nil, false
	}
	return x.recordOutcome(context.WithoutCancel(ctx), st, err), true
}

// markRunning moves a started marker to running with the command's process. A failed write
// leaves it started with a supervisor record, which recovery treats as "may have run" —
// never as "not run".
func (x *execution) markRunning(ctx context.Context, m hostMove) error {
	p := x.handle.Process()
	_, err := x.move(ctx, m, nil, func(r *markers.Record) { r.PID, r.PIDStart = p.PID, p.PIDStart })
	if err != nil {
		x.log.Error("marker running write failed", "err", err)
	}
	return err
}

// recordOutcome moves the marker to how the command ended (outcomeMove decides). If the
// write fails it returns nil and callers report the outcome unknown; recovery records it
// from the supervisor's status at the next start.
func (x *execution) recordOutcome(ctx context.Context, st supervisor.Status, waitErr error) *markers.Record {
	wait, why := waitedStatus, ""
	switch {
	case errors.Is(waitErr, supervisor.ErrVanished):
		wait = waitedVanished
	case waitErr != nil:
		wait, why = waitedFailed, waitErr.Error()
	}
	p := x.handle.Process()
	write := func() (*markers.Record, error) {
		o := outcomeMove(x.marked, wait, why, st)
		return x.move(ctx, o.Move, o.Path, func(r *markers.Record) {
			r.PID, r.PIDStart = p.PID, p.PIDStart
			if o.Record {
				recordStatus(r, st, o.IsError)
			}
		})
	}
	rec, err := write()
	if errors.Is(err, markers.ErrConflict) {
		// A write was lost, or another wrote meanwhile: decide again from the stored state.
		if cur, gerr := x.store.Get(x.id); gerr == nil && (cur.State == markers.Started || cur.State == markers.Running) {
			x.marked = cur.State
			rec, err = write()
		}
	}
	if err != nil {
		x.log.Error("final marker write failed", "err", err)
		return nil
	}
	return rec
}

// recordStatus copies a supervisor's status into the marker.
func recordStatus(r *markers.Record, st supervisor.Status, isError bool) {
	if st.Signal == "" {
		code := st.ExitCode
		r.ExitCode = &code
	}
	r.Signal = st.Signal
	r.IsError = isError
	r.Output = markers.Output{
		StdoutBytes: st.Stdout.Bytes, StderrBytes: st.Stderr.Bytes,
		StdoutSHA256: st.Stdout.SHA256, StderrSHA256: st.Stderr.SHA256,
		Truncated: st.Stdout.Truncated || st.Stderr.Truncated,
	}
}

// restart moves a not_started marker back to started for a new attempt in the spool
// directory dir (the old one stays fenced).
func (x *execution) restart(ctx context.Context, dir string) (*markers.Record, error) {
	x.dir = dir
	return x.move(ctx, hostMove{To: markers.Started, Note: "restarted: it never ran"}, nil, func(r *markers.Record) { r.SpoolDir = dir })
}

// recover settles a marker a previous process left started or running (rec), from its spool
// (recoveryStep decides). It returns true when the command was adopted: the caller watches it
// to its end. Nothing is ever run again here.
func (x *execution) recover(ctx context.Context, rec *markers.Record, boot bootOf) (adopted bool, err error) {
	x.marked, x.owner = rec.State, ownerOf(rec)
	h, found, cause, readErr := readSpool(x.dir)
	r := recoveryStep(rec.State, boot, found, cause)
	if r.Do == recoverFence {
		switch ferr := supervisor.Fence(x.dir); {
		case ferr == nil:
			found = foundFenced
		case errors.Is(ferr, supervisor.ErrAlreadyUsed):
			// A supervisor recorded itself first: what it left decides.
			h, found, cause, readErr = readSpool(x.dir)
		default:
			return false, fmt.Errorf("recover %s: fence: %w", x.id, ferr)
		}
		r = recoveryStep(rec.State, boot, found, cause)
	}
	if readErr != nil && boot == earlierBoot {
		x.log.Warn("unreadable spool of an earlier boot", "err", readErr)
	}
	switch r.Do {
	case recoverFail:
		return false, fmt.Errorf("recover %s: adopt: %w", x.id, readErr)
	case recoverFence:
		return false, fmt.Errorf("recover %s: the spool changed while it was fenced", x.id)
	case recoverMove:
		if h != nil {
			h.Close()
		}
		x.log.Warn("recovered marker", "to", r.Move.To, "reason", r.Move.Note)
		x.final, err = x.move(ctx, r.Move, nil, nil)
		return false, err
	}
	x.handle = h
	if r.Move.To != "" {
		if err := x.markRunning(ctx, r.Move); err != nil {
			h.Close()
			return false, fmt.Errorf("recover %s: %w", x.id, err)
		}
	}
	x.log.Info("re-adopted running command", "pid", h.Process().PID)
	return true, nil
}

// readSpool adopts the execution in dir and says what its spool shows (cause: the start
// error a start_failed status records; err: why it could not be read).
func readSpool(dir string) (h *supervisor.Handle, found spoolFinding, cause string, err error) {
	h, err = supervisor.Adopt(dir)
	switch {
	case err == nil:
		if st, serr := supervisor.ReadStatus(dir); serr == nil && st.Outcome == supervisor.OutcomeStartFailed {
			return h, foundStartFailed, st.Error, nil
		}
		return h, foundLive, "", nil
	case errors.Is(err, supervisor.ErrNeverStarted):
		return nil, foundNeverStarted, "", nil
	case errors.Is(err, supervisor.ErrVanished):
		return nil, foundVanished, "", nil
	case errors.Is(err, os.ErrNotExist):
		return nil, foundMissing, "", nil
	}
	return nil, foundUnreadable, "", err
}
