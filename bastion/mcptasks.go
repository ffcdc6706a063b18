package bastion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// taskBackend answers MCP tasks (bastion/tasks) from the journal: a task is an execution, so
// it survives a restart, and only its actor sees it (own).
type taskBackend struct{ b *Bastion }

// taskResultPoll is how often tasks/result looks at an execution no driver carries here (one
// awaiting approval or review, or driven after a restart by the reconcile loop).
const taskResultPoll = 500 * time.Millisecond

// maxTaskWaitsPerActor bounds one actor's tasks/result requests waiting at once: unlike a
// tool's wait_s (at most max_wait), such a wait lasts until the execution ends — days for
// one awaiting approval — and each holds a request, a goroutine and a journal poll.
const maxTaskWaitsPerActor = 64

// waitSlots counts waits per actor; the zero value is ready.
type waitSlots struct {
	mu sync.Mutex
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

func (t taskBackend) caller(extra *mcp.RequestExtra) (transport.Caller, error) {
	if extra != nil {
		if c, ok := transport.CallerFromTokenInfo(extra.TokenInfo); ok {
			return c, nil
		}
	}
	return transport.Caller{}, &api.ToolError{Code: "unauthenticated", Message: "the transport did not identify the caller"}
}

func (t taskBackend) own(extra *mcp.RequestExtra, id string) (*markers.Record, error) {
	c, err := t.caller(extra)
	if err != nil {
		return nil, err
	}
	rec, err := t.b.own(c, id)
	var te *api.ToolError
	if errors.As(err, &te) && te.Code == api.CodeNotFound {
		return nil, tasks.ErrNotFound
	}
	return rec, err
}

func (t taskBackend) execution(rec *markers.Record) *tasks.Execution {
	return &tasks.Execution{
		ID: rec.ID,
		Facts: tasks.Facts{
			State: string(rec.State), IsError: rec.IsError, ReviewRequired: rec.ReviewRequired,
			Queued: rec.State == markers.Authorized && t.b.isQueued(rec.ID),
		},
		CreatedAt: rec.CreatedAt,
		UpdatedAt: rec.UpdatedAt,
		Retention: t.b.classes.Get(rec.Class).Retention,
	}
}

func (t taskBackend) Created(ctx context.Context, extra *mcp.RequestExtra, res *mcp.CallToolResult) (*tasks.Execution, error) {
	var x struct {
		ExecutionID string `json:"execution_id"`
	}
	if raw, ok := res.StructuredContent.(json.RawMessage); ok {
		_ = json.Unmarshal(raw, &x) // no execution: reported below
	}
	if x.ExecutionID == "" {
		var texts []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				texts = append(texts, tc.Text)
			}
		}
		return nil, fmt.Errorf("no execution was created: %s", strings.Join(texts, "; "))
	}
	rec, err := t.own(extra, x.ExecutionID)
	if err != nil {
		return nil, err
	}
	return t.execution(rec), nil
}

func (t taskBackend) Get(ctx context.Context, extra *mcp.RequestExtra, id string) (*tasks.Execution, error) {
	rec, err := t.own(extra, id)
	if err != nil {
		return nil, err
	}
	return t.execution(rec), nil
}

// Result waits for the execution to end, then returns its stored result as it was when it
// ended: replayed false and result_delivered false on every answer, so every tasks/result of
// one task returns the same bytes. The response that carries it is delivery evidence
// (DESIGN.md, "Result delivery"), judged like a tools/call's by trackDelivery.
func (t taskBackend) Result(ctx context.Context, extra *mcp.RequestExtra, id string, changed func(*tasks.Execution)) (*mcp.CallToolResult, error) {
	b := t.b
	ctx = b.tracker.Context(ctx, headerOf(extra))
	var last markers.State
	waiting := ""
	defer func() {
		if waiting != "" {
			b.taskWaits.release(waiting)
		}
	}()
	for {
		rec, err := t.own(extra, id)
		if err != nil {
			return nil, err
		}
		// The status when the wait begins, then every change (the last one terminal).
		if changed != nil && rec.State != last && (last != "" || !markers.JournalGraph.Terminal(rec.State)) {
			changed(t.execution(rec))
		}
		last = rec.State
		if markers.JournalGraph.Terminal(rec.State) {
			x := b.stored(rec)
			x.Replayed, x.ResultDelivered = false, false
			if rec.ResultDeliveredAt == nil {
				delivery.Carries(ctx, rec.ID)
			}
			return &mcp.CallToolResult{
				Content:           []mcp.Content{&mcp.TextContent{Text: x.Summary()}},
				StructuredContent: x,
				IsError:           x.CallFailed(),
			}, nil
		}
		if waiting == "" {
			if !b.taskWaits.acquire(rec.Actor, maxTaskWaitsPerActor) {
				return nil, &api.ToolError{Code: "too_many_waits", ExecutionID: id, Message: fmt.Sprintf("%d tasks/result requests of yours already wait; ask tasks/get instead, or again once one ended", maxTaskWaitsPerActor)}
			}
			waiting = rec.Actor
		}
		var done <-chan struct{}
		if d := b.liveDriver(id); d != nil {
			done = d.done
		}
		timer := time.NewTimer(taskResultPoll)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-b.ctx.Done():
			timer.Stop()
			return nil, &api.ToolError{Code: "shutting_down", Message: "the bastion is shutting down; ask again after its restart: the task is journaled"}
		case <-done:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (t taskBackend) Cancel(ctx context.Context, extra *mcp.RequestExtra, id string) (*tasks.Execution, error) {
	c, err := t.caller(extra)
	if err != nil {
		return nil, err
	}
	if _, err := t.b.Cancel(ctx, c, id); err != nil {
		var te *api.ToolError
		if errors.As(err, &te) && te.Code == api.CodeNotFound {
			return nil, tasks.ErrNotFound
		}
		return nil, err
	}
	return t.Get(ctx, extra, id)
}

func (t taskBackend) List(ctx context.Context, extra *mcp.RequestExtra, cursor string, limit int) ([]*tasks.Execution, string, error) {
	c, err := t.caller(extra)
	if err != nil {
		return nil, "", err
	}
	recs, next, err := t.b.journal.List(markers.Query{Actor: c.Actor, Newest: true, Limit: limit, Cursor: cursor})
	if errors.Is(err, markers.ErrInvalidCursor) {
		return nil, "", tasks.ErrBadCursor
	}
	if err != nil {
		return nil, "", journalError(err)
	}
	out := make([]*tasks.Execution, 0, len(recs))
	for _, r := range recs {
		out = append(out, t.execution(r))
	}
	return out, next, nil
}
