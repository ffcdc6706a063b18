package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// An execution's state without its output, and waiting for its end: what MCP tasks read
// (bastion/mcpserver). A task is an execution, so it survives a restart, and only its actor
// sees it.

// taskResultPoll is how often tasks/result looks at an execution no driver carries here (one
// awaiting approval or review, or driven after a restart by the reconcile loop).
const taskResultPoll = 500 * time.Millisecond

// maxTaskWaitsPerActor bounds one actor's tasks/result requests waiting at once: unlike a
// tool's wait_s (at most max_wait), such a wait lasts until the execution ends — days for
// one awaiting approval — and each holds a request, a goroutine and a journal poll.
const maxTaskWaitsPerActor = 64

// waitSlots counts waits per actor; the zero value is ready.
type waitSlots struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

// acquire takes one of actor's max slots, or reports false when all are taken.
func (w *waitSlots) acquire(actor string, max int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[actor] >= max {
		return false
	}
	if w.n == nil {
		w.n = map[string]int{}
	}
	w.n[actor]++
	return true
}

func (w *waitSlots) release(actor string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[actor]--; w.n[actor] <= 0 {
		delete(w.n, actor)
	}
}

// State is one of the caller's executions without its output.
func (b *Engine) State(c transport.Caller, id string) (*api.ExecutionState, error) {
	rec, err := b.views.own(c, id)
	if err != nil {
		return nil, err
	}
	return b.views.stateOf(rec), nil
}

// States is one page of the caller's executions, newest first, and the next cursor
// (markers.ErrInvalidCursor for a cursor the journal did not hand out).
func (b *Engine) States(c transport.Caller, cursor string, limit int) ([]*api.ExecutionState, string, error) {
	recs, next, err := b.journal.List(markers.Query{Actor: c.Actor, Newest: true, Limit: limit, Cursor: cursor})
	if errors.Is(err, markers.ErrInvalidCursor) {
		return nil, "", err
	}
	if err != nil {
		return nil, "", journalError(err)
	}
	out := make([]*api.ExecutionState, 0, len(recs))
	for _, r := range recs {
		out = append(out, b.views.stateOf(r))
	}
	return out, next, nil
}

// AwaitEnd waits for one of the caller's executions to end, then returns its stored result.
// changed, if set, hears the state when the wait begins and every change while it waits (the
// last one terminal). The waits of one actor are bounded (maxTaskWaitsPerActor).
func (b *Engine) AwaitEnd(ctx context.Context, c transport.Caller, id string, changed func(*api.ExecutionState)) (*api.Execution, error) {
	var last markers.State
	waiting := ""
	defer func() {
		if waiting != "" {
			b.taskWaits.release(waiting)
		}
	}()
	for {
		rec, err := b.views.own(c, id)
		if err != nil {
			return nil, err
		}
		// The status when the wait begins, then every change (the last one terminal).
		if changed != nil && rec.State != last && (last != "" || !markers.JournalGraph.Terminal(rec.State)) {
			changed(b.views.stateOf(rec))
		}
		last = rec.State
		if markers.JournalGraph.Terminal(rec.State) {
			return b.views.stored(rec), nil
		}
		if waiting == "" {
			if !b.taskWaits.acquire(rec.Actor, maxTaskWaitsPerActor) {
				return nil, &api.ToolError{Code: api.CodeTooManyWaits, ExecutionID: id, Message: fmt.Sprintf("%d tasks/result requests of yours already wait; ask tasks/get instead, or again once one ended", maxTaskWaitsPerActor)}
			}
			waiting = rec.Actor
		}
		var done <-chan struct{}
		if d := b.drivers.live(id); d != nil {
			done = d.done
		}
		timer := time.NewTimer(taskResultPoll)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-b.ctx.Done():
			timer.Stop()
			return nil, &api.ToolError{Code: api.CodeShuttingDown, Message: "the bastion is shutting down; ask again after its restart: the task is journaled"}
		case <-done:
		case <-timer.C:
		}
		timer.Stop()
	}
}
