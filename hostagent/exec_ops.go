package hostagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// The control operations of the executor (status, list, attach, cancel, checkpoint, export).

// Get returns the marker of id.
func (e *Executor) Get(id string) (*markers.Record, error) { return e.store.Get(id) }

// List pages through markers.
func (e *Executor) List(q markers.Query) ([]*markers.Record, string, error) { return e.store.List(q) }

// MarkerRetention is how long finished markers are kept (Config.MarkerRetention).
func (e *Executor) MarkerRetention() time.Duration { return e.cfg.MarkerRetention }

// Export writes the marker store's event log as JSONL.
func (e *Executor) Export(w io.Writer) error { return e.store.Export(w) }

func (e *Executor) lookupLive(id string) *execution {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live[id]
}

// Attach streams the output of execution id from the given offsets until it has ended and
// everything was emitted, and returns the final marker.
func (e *Executor) Attach(ctx context.Context, id string, stdoutOffset, stderrOffset int64, emit func(stream string, data []byte) error) (*markers.Record, error) {
	rec, err := e.store.Get(id)
	if err != nil {
		return nil, err
	}
	var ended <-chan struct{}
	if x := e.lookupLive(id); x != nil {
		select {
		case <-x.started:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		ended = x.done
	}
	errs := make(chan error, 2)
	for _, f := range []struct {
		stream string
		offset int64
	}{{supervisor.StreamStdout, stdoutOffset}, {supervisor.StreamStderr, stderrOffset}} {
		go func() {
			_, err := supervisor.Follow(ctx, rec.SpoolDir, f.stream, f.offset, emitWriter{f.stream, emit}, ended)
			// No supervisor, or one that vanished: whatever was stored is all there is, and
			// the marker tells how the execution ended.
			if errors.Is(err, supervisor.ErrNeverStarted) || errors.Is(err, supervisor.ErrVanished) {
				err = nil
			}
			errs <- err
		}()
	}
	if err := errors.Join(<-errs, <-errs); err != nil {
		return nil, fmt.Errorf("attach %s: %w", id, err)
	}
	return e.store.Get(id)
}

type emitWriter struct {
	stream string
	emit   func(string, []byte) error
}

func (w emitWriter) Write(p []byte) (int, error) {
	if err := w.emit(w.stream, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// running returns the live execution id once its command started: markers.ErrNotFound for
// an unknown id, hostproto.ErrNotRunning for one that is not running here.
func (e *Executor) running(ctx context.Context, id string) (*execution, error) {
	x := e.lookupLive(id)
	if x == nil {
		if _, err := e.store.Get(id); err != nil {
			return nil, err
		}
		return nil, hostproto.ErrNotRunning
	}
	select {
	case <-x.started:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if x.handle == nil {
		return nil, hostproto.ErrNotRunning
	}
	return x, nil
}

// Cancel stops a running execution (TERM to its process group, grace, KILL) and returns the
// marker once it ended.
func (e *Executor) Cancel(ctx context.Context, id string) (*markers.Record, error) {
	x, err := e.running(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := x.handle.Cancel(); err != nil && !errors.Is(err, supervisor.ErrNotRunning) {
		return nil, fmt.Errorf("cancel %s: %w", id, err)
	}
	select {
	case <-x.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if x.final != nil {
		return x.final, nil
	}
	return e.store.Get(id)
}

// Checkpoint records a checkpoint note (or that the execution validated itself) on a
// running execution, for a caller process inside that execution's process tree.
func (e *Executor) Checkpoint(ctx context.Context, id string, peerPID int, note string, validated bool) (*markers.Record, error) {
	x, err := e.running(ctx, id)
	if err != nil {
		return nil, err
	}
	ok, err := supervisor.InExecution(peerPID, x.handle.Process())
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: pid %d", ErrNotYourProcess, peerPID)
	}
	what := "checkpoint: " + note
	if validated {
		what = "validated"
	}
	return e.store.Update(ctx, id, what, func(r *markers.Record) error {
		if validated {
			r.Validated = true
		} else {
			r.Checkpoints = append(r.Checkpoints, markers.Checkpoint{At: time.Now().UTC(), Note: note})
		}
		return nil
	})
}
