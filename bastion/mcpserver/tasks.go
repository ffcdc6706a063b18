package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/markers"
)

// taskBackend answers MCP tasks (bastion/tasks) from the engine: a task is an execution, so
// it survives a restart, and only its actor sees it.
type taskBackend struct{ s *server }

// taskOf is the execution as a task sees it.
func taskOf(x *api.ExecutionState) *tasks.Execution {
	return &tasks.Execution{
		ID: x.ExecutionID,
		Facts: tasks.Facts{
			State: x.State, IsError: x.IsError, ReviewRequired: x.ReviewRequired, Queued: x.Queued,
		},
		CreatedAt: x.AcceptedAt,
		UpdatedAt: x.UpdatedAt,
		Retention: x.Retention,
	}
}

// notFound turns the engine's not_found into the tasks' own, which answers an id the
// caller may not see the same as one that does not exist.
func notFound(err error) error {
	var te *api.ToolError
	if errors.As(err, &te) && te.Code == api.CodeNotFound {
		return tasks.ErrNotFound
	}
	return err
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
	return t.Get(ctx, extra, x.ExecutionID)
}

func (t taskBackend) Get(_ context.Context, extra *mcp.RequestExtra, id string) (*tasks.Execution, error) {
	c, err := callerOf(extra)
	if err != nil {
		return nil, err
	}
	x, err := t.s.engine.State(c, id)
	if err != nil {
		return nil, notFound(err)
	}
	return taskOf(x), nil
}

// Result waits for the execution to end, then returns its stored result as it was when it
// ended: replayed false and result_delivered false on every answer, so every tasks/result of
// one task returns the same bytes. The response that carries it is delivery evidence
// (docs/design.md, "Result delivery: what counts as evidence"), judged like a tools/call's.
func (t taskBackend) Result(ctx context.Context, extra *mcp.RequestExtra, id string, changed func(*tasks.Execution)) (*mcp.CallToolResult, error) {
	c, err := callerOf(extra)
	if err != nil {
		return nil, err
	}
	ctx = t.s.tracker.Context(ctx, headerOf(extra))
	var onChange func(*api.ExecutionState)
	if changed != nil {
		onChange = func(x *api.ExecutionState) { changed(taskOf(x)) }
	}
	x, err := t.s.engine.AwaitEnd(ctx, c, id, onChange)
	if err != nil {
		return nil, notFound(err)
	}
	if !x.ResultDelivered {
		delivery.Carries(ctx, x.ExecutionID)
	}
	x.Replayed, x.ResultDelivered = false, false
	compact(x)
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: x.Summary()}},
		StructuredContent: x,
		IsError:           x.CallFailed(),
	}, nil
}

func (t taskBackend) Cancel(ctx context.Context, extra *mcp.RequestExtra, id string) (*tasks.Execution, error) {
	c, err := callerOf(extra)
	if err != nil {
		return nil, err
	}
	if _, err := t.s.engine.Cancel(ctx, c, id); err != nil {
		return nil, notFound(err)
	}
	return t.Get(ctx, extra, id)
}

func (t taskBackend) List(_ context.Context, extra *mcp.RequestExtra, cursor string, limit int) ([]*tasks.Execution, string, error) {
	c, err := callerOf(extra)
	if err != nil {
		return nil, "", err
	}
	states, next, err := t.s.engine.States(c, cursor, limit)
	if errors.Is(err, markers.ErrInvalidCursor) {
		return nil, "", tasks.ErrBadCursor
	}
	if err != nil {
		return nil, "", err
	}
	out := make([]*tasks.Execution, 0, len(states))
	for _, x := range states {
		out = append(out, taskOf(x))
	}
	return out, next, nil
}
