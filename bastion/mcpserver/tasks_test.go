package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/markers"
)

// JSON-RPC error codes the tasks methods answer with.
const (
	codeInvalidParams = jsonrpc.CodeInvalidParams
	codeInternal      = jsonrpc.CodeInternalError
)

// rpcError is err's JSON-RPC error, or fails the test.
func rpcError(t testing.TB, err error) *jsonrpc.Error {
	t.Helper()
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		t.Fatalf("error = %v (%T); want a JSON-RPC error", err, err)
	}
	return we
}

// stateOf is x as the engine's State reports it.
func stateOf(x *api.Execution) *api.ExecutionState {
	return &api.ExecutionState{ExecutionID: x.ExecutionID, State: x.State, IsError: x.IsError, ReviewRequired: x.ReviewRequired,
		Queued: x.Queued, AcceptedAt: x.AcceptedAt, UpdatedAt: x.AcceptedAt.Add(time.Second), Retention: time.Hour}
}

var (
	notFoundErr    = &api.ToolError{Code: api.CodeNotFound, Message: "no execution of yours"}
	unavailableErr = &api.ToolError{Code: api.CodeJournalUnavailable, Message: "the journal is unavailable"}
)

// TestTasksGet: tasks/get is the caller's execution as a task; the engine's not_found is the
// tasks' own not-found (an id of another actor answers as one that never existed), and any
// other engine error is not disguised as one.
func TestTasksGet(t *testing.T) {
	running := stateOf(execution("ex_1", "running"))
	tests := []struct {
		name     string
		state    *api.ExecutionState
		err      error
		want     tasks.Task
		wantCode int64
	}{
		{
			name:  "a running execution",
			state: running,
			want: tasks.Task{TaskID: "ex_1", Status: tasks.Working, StatusMessage: "running", CreatedAt: "2026-07-28T10:00:00Z",
				LastUpdatedAt: "2026-07-28T10:00:01Z", TTL: ptr(time.Hour.Milliseconds()), PollInterval: 1000},
		},
		{
			name: "a failed command",
			state: &api.ExecutionState{ExecutionID: "ex_2", State: "completed", IsError: true, AcceptedAt: at, UpdatedAt: at,
				Retention: 0},
			want: tasks.Task{TaskID: "ex_2", Status: tasks.Failed, StatusMessage: "completed with an error outcome (non-zero exit, signal or HTTP error status); tasks/result has the result",
				CreatedAt: "2026-07-28T10:00:00Z", LastUpdatedAt: "2026-07-28T10:00:00Z"},
		},
		{name: "not found", err: notFoundErr, wantCode: codeInvalidParams},
		{name: "the journal unavailable", err: unavailableErr, wantCode: codeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{state: func(string) (*api.ExecutionState, error) { return tt.state, tt.err }}
			cs := connect(t, e, session{caller: &remoteCaller})
			got, err := mcp.CallCustomMethod[*taskRef, *taskAnswer](t.Context(), cs, "tasks/get", &taskRef{TaskID: "ex_1"})
			if calls := e.callsTo("State"); len(calls) != 1 || calls[0].Caller != remoteCaller || calls[0].Arg != "ex_1" {
				t.Errorf("engine State calls = %+v; want one for ex_1 by %+v", calls, remoteCaller)
			}
			if tt.wantCode != 0 {
				if we := rpcError(t, err); we.Code != tt.wantCode {
					t.Errorf("tasks/get error = %v; want code %d", we, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Task, tt.want) {
				t.Errorf("tasks/get = %+v; want %+v", got.Task, tt.want)
			}
		})
	}
}

// TestTasksNotFoundMessage: the tasks' not-found names the task the client asked about,
// nothing of the engine's error.
func TestTasksNotFoundMessage(t *testing.T) {
	e := &fakeEngine{
		state: func(string) (*api.ExecutionState, error) { return nil, notFoundErr },
		awaitEnd: func(context.Context, string, func(*api.ExecutionState)) (*api.Execution, error) {
			return nil, notFoundErr
		},
	}
	cs := connect(t, e, session{caller: &remoteCaller})
	for _, method := range []string{"tasks/get", "tasks/cancel"} {
		_, err := mcp.CallCustomMethod[*taskRef, *taskAnswer](t.Context(), cs, method, &taskRef{TaskID: "ex_other"})
		if we := rpcError(t, err); we.Code != codeInvalidParams || we.Message != `Failed to retrieve task: task "ex_other" not found` {
			t.Errorf("%s = %v; want the tasks' not-found of ex_other", method, we)
		}
	}
	_, err := mcp.CallCustomMethod[*taskRef, *mcp.CallToolResult](t.Context(), cs, "tasks/result", &taskRef{TaskID: "ex_other"})
	if we := rpcError(t, err); we.Code != codeInvalidParams || !strings.Contains(we.Message, `"ex_other" not found`) {
		t.Errorf("tasks/result = %v; want the tasks' not-found of ex_other", we)
	}
}

// TestTasksList: tasks/list is a page of the caller's executions with the engine's cursor;
// a cursor the journal did not hand out is the tasks' bad cursor, other errors are not.
func TestTasksList(t *testing.T) {
	page := []*api.ExecutionState{stateOf(execution("ex_2", "running")), stateOf(execution("ex_1", "completed"))}
	tests := []struct {
		name     string
		err      error
		wantIDs  []string
		wantCode int64
	}{
		{name: "a page", wantIDs: []string{"ex_2", "ex_1"}},
		{name: "a cursor the journal did not hand out", err: fmt.Errorf("list: %w", markers.ErrInvalidCursor), wantCode: codeInvalidParams},
		{name: "the journal unavailable", err: unavailableErr, wantCode: codeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{states: func(string, int) ([]*api.ExecutionState, string, error) {
				if tt.err != nil {
					return nil, "", tt.err
				}
				return page, "cursor-2", nil
			}}
			cs := connect(t, e, session{caller: &remoteCaller})
			got, err := mcp.CallCustomMethod[*listRef, *listAnswer](t.Context(), cs, "tasks/list", &listRef{Cursor: "cursor-1"})
			want := engineCall{Method: "States", Caller: remoteCaller, Arg: statesArgs{Cursor: "cursor-1", Limit: 50}}
			if calls := e.callsTo("States"); len(calls) != 1 || !reflect.DeepEqual(calls[0], want) {
				t.Errorf("engine States calls = %+v; want [%+v]", calls, want)
			}
			if tt.wantCode != 0 {
				we := rpcError(t, err)
				if we.Code != tt.wantCode {
					t.Errorf("tasks/list error = %v; want code %d", we, tt.wantCode)
				}
				if bad := strings.Contains(we.Message, "invalid cursor"); bad != errors.Is(tt.err, markers.ErrInvalidCursor) {
					t.Errorf("tasks/list error = %v; a bad cursor said so: %v", we, bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, task := range got.Tasks {
				ids = append(ids, task.TaskID)
			}
			if !reflect.DeepEqual(ids, tt.wantIDs) || got.NextCursor != "cursor-2" {
				t.Errorf("tasks/list = %v, next %q; want %v, next cursor-2", ids, got.NextCursor, tt.wantIDs)
			}
		})
	}
}

// TestTasksCancel: tasks/cancel cancels as execution_cancel does, for the transport's
// caller, and answers the task as it stands after the cancel.
func TestTasksCancel(t *testing.T) {
	var mu sync.Mutex
	state := "running"
	e := &fakeEngine{
		state: func(id string) (*api.ExecutionState, error) {
			mu.Lock()
			defer mu.Unlock()
			return stateOf(execution(id, state)), nil
		},
		cancel: func(id string) (*api.Execution, error) {
			mu.Lock()
			defer mu.Unlock()
			state = "cancelled"
			return execution(id, state), nil
		},
	}
	cs := connect(t, e, session{caller: &remoteCaller})
	got, err := mcp.CallCustomMethod[*taskRef, *taskAnswer](t.Context(), cs, "tasks/cancel", &taskRef{TaskID: "ex_1"})
	if err != nil {
		t.Fatal(err)
	}
	if got.TaskID != "ex_1" || got.Status != tasks.Cancelled {
		t.Errorf("tasks/cancel = %+v; want ex_1 cancelled", got.Task)
	}
	if calls := e.callsTo("Cancel"); len(calls) != 1 || calls[0].Caller != remoteCaller || calls[0].Arg != "ex_1" {
		t.Errorf("engine Cancel calls = %+v; want one for ex_1 by %+v", calls, remoteCaller)
	}

	e.cancel = func(string) (*api.Execution, error) { return nil, notFoundErr }
	mu.Lock()
	state = "running"
	mu.Unlock()
	_, err = mcp.CallCustomMethod[*taskRef, *taskAnswer](t.Context(), cs, "tasks/cancel", &taskRef{TaskID: "ex_1"})
	if we := rpcError(t, err); we.Code != codeInvalidParams {
		t.Errorf("tasks/cancel whose engine cancel answers not_found = %v; want the tasks' not-found", we)
	}
}

// TestTasksResult: tasks/result waits for the execution's end through the engine and
// returns its stored result as it was when it ended — replayed and result_delivered false,
// so every tasks/result of a task returns the same bytes — with the text, isError and the
// related task; while it waits, each status the engine reports goes out as progress when
// the request carried a progress token.
func TestTasksResult(t *testing.T) {
	exit1 := execution("ex_1", "completed")
	exit1.ExitCode, exit1.IsError = ptr(1), true
	tests := []struct {
		name        string
		x           *api.Execution
		wantIsError bool
	}{
		{"completed", execution("ex_1", "completed"), false},
		{"a non-zero exit", exit1, true},
		{"failed", execution("ex_1", "failed"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{awaitEnd: func(_ context.Context, id string, changed func(*api.ExecutionState)) (*api.Execution, error) {
				if changed != nil {
					changed(stateOf(execution(id, "running")))
					changed(stateOf(tt.x))
				}
				x := *tt.x
				x.Replayed, x.ResultDelivered = true, true
				return &x, nil
			}}
			notes := make(chan string, 4)
			cs := connect(t, e, session{caller: &remoteCaller, client: &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
					notes <- req.Params.Message
				},
			}})
			ref := &taskRef{TaskID: "ex_1"}
			ref.Meta = mcp.Meta{"progressToken": "p-1"}
			res, err := mcp.CallCustomMethod[*taskRef, *mcp.CallToolResult](t.Context(), cs, "tasks/result", ref)
			if err != nil {
				t.Fatal(err)
			}
			stored := *tt.x
			stored.Replayed, stored.ResultDelivered = false, false
			if got := decode[api.Execution](t, res.StructuredContent); !reflect.DeepEqual(got, stored) {
				t.Errorf("structured content = %+v; want %+v", got, stored)
			}
			if got, want := textOf(t, res), stored.Summary(); got != want {
				t.Errorf("text = %q; want %q", got, want)
			}
			if res.IsError != tt.wantIsError {
				t.Errorf("isError = %v; want %v", res.IsError, tt.wantIsError)
			}
			if related, _ := res.Meta[tasks.MetaRelatedTask].(map[string]any); related["taskId"] != "ex_1" {
				t.Errorf("_meta = %v; want the related task ex_1", res.Meta)
			}
			if calls := e.callsTo("AwaitEnd"); len(calls) != 1 || calls[0].Caller != remoteCaller || calls[0].Arg != "ex_1" || calls[0].NilCallback {
				t.Errorf("engine AwaitEnd calls = %+v; want one for ex_1 by %+v with a changed func", calls, remoteCaller)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			wantStatus, _ := tasks.StatusOf(tasks.Facts{State: tt.x.State, IsError: tt.x.IsError}, tasks.Spec20251125)
			for i, want := range []string{"task ex_1 working: running", "task ex_1 " + string(wantStatus) + ": "} {
				select {
				case got := <-notes:
					if !strings.HasPrefix(got, want) {
						t.Errorf("progress %d = %q; want %q…", i, got, want)
					}
				case <-ctx.Done():
					t.Fatalf("got %d progress notifications; want 2", i)
				}
			}

			if _, err := mcp.CallCustomMethod[*taskRef, *mcp.CallToolResult](t.Context(), cs, "tasks/result", &taskRef{TaskID: "ex_1"}); err != nil {
				t.Fatal(err)
			}
			if calls := e.callsTo("AwaitEnd"); len(calls) != 2 || !calls[1].NilCallback {
				t.Errorf("engine AwaitEnd calls = %+v; want no changed func without a progress token", calls)
			}
		})
	}
}

// TestTasksUnauthenticated: the tasks methods refuse a request the transport did not
// identify, and ask the engine nothing.
func TestTasksUnauthenticated(t *testing.T) {
	e := &fakeEngine{}
	cs := connect(t, e, session{})
	for _, method := range []string{"tasks/get", "tasks/cancel"} {
		_, err := mcp.CallCustomMethod[*taskRef, *taskAnswer](t.Context(), cs, method, &taskRef{TaskID: "ex_1"})
		if we := rpcError(t, err); !strings.Contains(we.Message, api.CodeUnauthenticated) {
			t.Errorf("%s = %v; want unauthenticated", method, we)
		}
	}
	_, err := mcp.CallCustomMethod[*taskRef, *mcp.CallToolResult](t.Context(), cs, "tasks/result", &taskRef{TaskID: "ex_1"})
	if we := rpcError(t, err); !strings.Contains(we.Message, api.CodeUnauthenticated) {
		t.Errorf("tasks/result = %v; want unauthenticated", we)
	}
	_, err = mcp.CallCustomMethod[*listRef, *listAnswer](t.Context(), cs, "tasks/list", &listRef{})
	if we := rpcError(t, err); !strings.Contains(we.Message, api.CodeUnauthenticated) {
		t.Errorf("tasks/list = %v; want unauthenticated", we)
	}
	if m := e.methods(); len(m) != 0 {
		t.Errorf("the engine was called: %v", m)
	}
}
