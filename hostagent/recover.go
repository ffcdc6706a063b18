package hostagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/postern-dev/postern/hostagent/shim"
	"github.com/postern-dev/postern/markers"
)

// Recover runs before serving: every marker left started or running by a previous process
// is resolved from its spool. A live execution is re-adopted (through the supervisor that
// runs it) and watched to the end; a finished one has its outcome recorded; one whose
// supervisor vanished without an exit record makes the marker interrupted (unknown outcome);
// a started marker of this boot with no shim record provably never ran and becomes
// not_started — of an earlier boot it becomes interrupted, as the spool is not synced.
// Nothing is ever run again here.
func (e *Executor) Recover(ctx context.Context) error {
	// Collect first: resolving a started marker can move it to running, and it must not be
	// met twice.
	var pending []*markers.Record
	for _, state := range []markers.State{markers.Started, markers.Running} {
		q := markers.Query{State: state, Limit: 1000}
		for {
			recs, next, err := e.store.List(q)
			if err != nil {
				return fmt.Errorf("recover: list %s markers: %w", state, err)
			}
			pending = append(pending, recs...)
			if next == "" {
				break
			}
			q.Cursor = next
		}
	}
	for _, rec := range pending {
		if err := e.recoverOne(ctx, rec); err != nil {
			return err
		}
	}
	return nil
}

func (e *Executor) recoverOne(ctx context.Context, rec *markers.Record) error {
	log := e.log.With("execution_id", rec.ID, "state", rec.State)
	dir := rec.SpoolDir
	if dir == "" {
		dir = filepath.Join(e.spool, rec.ID)
	}
	// The spool's records are page-cache writes (shim/daemon.go): they prove what happened on
	// this boot, and nothing about a marker of an earlier one, whose records a machine crash
	// may have taken. Such a marker's command may have run — it is interrupted, never "not
	// started" (a marker of an older release, without a boot id, had synced records).
	earlierBoot := rec.BootID != "" && rec.BootID != e.boot
	h, err := shim.Adopt(dir)
	if earlierBoot && err != nil && !errors.Is(err, shim.ErrNeverStarted) && !errors.Is(err, shim.ErrVanished) && !errors.Is(err, os.ErrNotExist) {
		log.Warn("unreadable spool of an earlier boot", "err", err)
		err = shim.ErrVanished // a record torn by the crash
	}
	if errors.Is(err, shim.ErrNeverStarted) && earlierBoot {
		err = shim.ErrVanished
	}
	if errors.Is(err, shim.ErrNeverStarted) && rec.State == markers.Started {
		// No shim record yet: fence the dir so a supervisor still on its way cannot start
		// the command later, and only then call it never started.
		switch ferr := shim.Fence(dir); {
		case errors.Is(ferr, shim.ErrAlreadyUsed):
			h, err = shim.Adopt(dir) // a supervisor recorded itself first: adopt it
		case ferr != nil:
			return fmt.Errorf("recover %s: fence: %w", rec.ID, ferr)
		}
	}
	var to markers.State
	var note string
	switch {
	case errors.Is(err, shim.ErrNeverStarted) && rec.State == markers.Started:
		to, note = markers.NotStarted, "recovered: no shim record, the command never ran"
	case earlierBoot && errors.Is(err, shim.ErrVanished):
		to, note = markers.Interrupted, "recovered after the machine restarted: whether the command ran is unknown"
	case errors.Is(err, shim.ErrNeverStarted), errors.Is(err, shim.ErrVanished), errors.Is(err, os.ErrNotExist):
		to, note = markers.Interrupted, "recovered: the shim is gone without an exit record"
	case err != nil:
		return fmt.Errorf("recover %s: adopt: %w", rec.ID, err)
	}
	if to != "" {
		log.Warn("recovered marker", "to", to, "reason", note)
		_, err := e.store.Transition(ctx, rec.ID, rec.State, to, note, func(r *markers.Record) error {
			r.Evidence = append(r.Evidence, note)
			return nil
		})
		return err
	}
	if st, err := shim.ReadStatus(dir); err == nil && st.Outcome == shim.OutcomeStartFailed && rec.State == markers.Started {
		// The supervisor recorded that the command could not start; this process did not.
		h.Close()
		note := "recovered: command did not start: " + st.Error
		_, err := e.store.Transition(ctx, rec.ID, markers.Started, markers.StartFailed, note, func(r *markers.Record) error {
			r.Evidence = append(r.Evidence, note)
			r.StartError = st.Error
			return nil
		})
		return err
	}
	if rec.State == markers.Started {
		p := h.Process()
		if _, err := e.store.Transition(ctx, rec.ID, markers.Started, markers.Running, "recovered: command started", func(r *markers.Record) error {
			r.PID, r.PIDStart = p.PID, p.PIDStart
			return nil
		}); err != nil {
			h.Close()
			return fmt.Errorf("recover %s: %w", rec.ID, err)
		}
	}
	x, _ := e.claim(rec.ID)
	x.dir, x.handle, x.owner = dir, h, ownerOf(rec)
	close(x.started)
	log.Info("re-adopted running command", "pid", h.Process().PID)
	e.wg.Add(1)
	go e.watch(x)
	return nil
}
