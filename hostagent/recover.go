package hostagent

import (
	"context"
	"fmt"

	"github.com/postern-dev/postern/markers"
)

// Recover runs before serving: every marker left started or running by a previous process
// is settled from its spool (recoveryStep decides, execution.recover carries it out). A live
// execution is re-adopted through the supervisor that runs it and watched to its end; a
// finished one has its outcome recorded; one whose supervisor vanished without an exit record
// becomes interrupted (unknown outcome); a started marker of this boot with no supervisor
// record provably never ran and becomes not_started — of an earlier boot it becomes
// interrupted, as the spool is not synced. Nothing is ever run again here.
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
		x, _ := e.claim(rec.ID)
		if rec.SpoolDir != "" {
			x.dir = rec.SpoolDir
		}
		x.log = x.log.With("state", rec.State)
		adopted, err := x.recover(ctx, rec, markerBoot(rec.BootID, e.boot))
		if err != nil || !adopted {
			e.release(x, x.final)
		}
		if err != nil {
			return err
		}
		if adopted {
			close(x.started)
			e.wg.Add(1)
			go e.watch(x)
		}
	}
	return nil
}
