package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrNotFound is what a Backend returns for an id the caller may not see: one that does not
// exist, or that belongs to another actor. Both answer the same.
var ErrNotFound = errors.New("tasks: no such task")

// ErrBadCursor is what a Backend's List returns for a cursor it did not make.
var ErrBadCursor = errors.New("tasks: invalid cursor")

// Execution is one execution as a task sees it.
type Execution struct {
	ID string
	Facts
	CreatedAt time.Time
	UpdatedAt time.Time
	// Retention is how long the journal keeps the execution (its class's retention): the
	// task's actual ttl.
	Retention time.Duration
}

// Backend answers for the journal. Every method resolves the caller from extra (the
// transport's identity) and sees only that caller's executions.
type Backend interface {
	// Created returns the execution a tools/call result reports (its structured content),
	// or an error when the call did not produce one (refused before any execution existed).
	Created(ctx context.Context, extra *mcp.RequestExtra, res *mcp.CallToolResult) (*Execution, error)
	// Get returns an execution of the caller's, or ErrNotFound.
	Get(ctx context.Context, extra *mcp.RequestExtra, id string) (*Execution, error)
	// Result blocks until the execution is terminal (or ctx ends), then returns its stored
	// tool result — the same bytes on every call. changed, if not nil, hears the status when
	// the wait begins and every change while it waits. Handing the result out is where
	// delivery is judged.
	Result(ctx context.Context, extra *mcp.RequestExtra, id string, changed func(*Execution)) (*mcp.CallToolResult, error)
	// Cancel cancels an execution as execution_cancel does and returns it as it stands.
	Cancel(ctx context.Context, extra *mcp.RequestExtra, id string) (*Execution, error)
	// List returns one page of the caller's executions, newest first, and the next cursor
	// ("" at the end). A cursor the backend did not make is ErrBadCursor.
	List(ctx context.Context, extra *mcp.RequestExtra, cursor string, limit int) ([]*Execution, string, error)
}

// Options configure Install.
type Options struct {
	// Tools are the tools that accept task augmentation (execution.taskSupport "optional").
	Tools []string
	// WaitArgument is the tools' argument that bounds how long a call waits; a
	// task-augmented call sets it to 0, so the call returns as soon as the execution exists.
	WaitArgument string
	// PollInterval is the suggested polling interval for a working task (default 1s); a
	// task waiting for input that is not the client's suggests five times as long.
	PollInterval time.Duration
	// PageSize bounds tasks/list pages (default 50).
	PageSize int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Wire names.
const (
	// metaTask is where HTTPHandler moves a tools/call's "task" params member, because
	// go-sdk's CallToolParams has no such field and would drop it; _meta survives.
	metaTask = "dev.postern/task"
	// MetaRelatedTask associates a result with its task.
	MetaRelatedTask = "io.modelcontextprotocol/related-task"
	// ExtensionID is the tasks extension's identifier (SEP-2663).
	ExtensionID = "io.modelcontextprotocol/tasks"
	// metaClientCapabilities carries a request's client capabilities (2026-07-28).
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
)

// Task is a task in the 2025-11-25 shape.
type Task struct {
	TaskID        string `json:"taskId"`
	Status        Status `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTL is in milliseconds; null means unlimited.
	TTL          *int64 `json:"ttl"`
	PollInterval int64  `json:"pollInterval,omitempty"`
}

// ExtTask is a task in the extension's shape (DetailedTask): seconds for the ttl, and the
// final result inline once it is completed.
type ExtTask struct {
	TaskID                   string              `json:"taskId"`
	Status                   Status              `json:"status"`
	StatusMessage            string              `json:"statusMessage,omitempty"`
	CreatedAt                string              `json:"createdAt"`
	LastUpdatedAt            string              `json:"lastUpdatedAt"`
	TTLSeconds               *int64              `json:"ttlSeconds"`
	PollIntervalMilliseconds int64               `json:"pollIntervalMilliseconds,omitempty"`
	Result                   *mcp.CallToolResult `json:"result,omitempty"`
}

type server struct {
	be    Backend
	opts  Options
	tools map[string]bool
}

// Install adds tasks to srv: the receiving middleware and the tasks/* methods.
func Install(srv *mcp.Server, be Backend, opts Options) error {
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 50
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &server{be: be, opts: opts, tools: map[string]bool{}}
	for _, t := range opts.Tools {
		s.tools[t] = true
	}
	srv.AddReceivingMiddleware(s.middleware)
	return errors.Join(
		mcp.AddReceivingCustomMethod(srv, "tasks/get", s.get),
		mcp.AddReceivingCustomMethod(srv, "tasks/result", s.result),
		mcp.AddReceivingCustomMethod(srv, "tasks/list", s.list),
		mcp.AddReceivingCustomMethod(srv, "tasks/cancel", s.cancel),
		mcp.AddReceivingCustomMethod(srv, "tasks/update", s.update),
	)
}

type extraKey struct{}
type creatingKey struct{}

// Creating reports whether ctx is a task-augmented tools/call being turned into a task: its
// result goes nowhere but into the journal, so it must not count as delivered.
func Creating(ctx context.Context) bool { return ctx.Value(creatingKey{}) != nil }

func extraFrom(ctx context.Context) *mcp.RequestExtra {
	e, _ := ctx.Value(extraKey{}).(*mcp.RequestExtra)
	return e
}

// dialectOf is the dialect of the session's negotiated protocol version.
func dialectOf(ss *mcp.ServerSession) Dialect {
	if ss == nil {
		return None
	}
	if p := ss.InitializeParams(); p != nil {
		return DialectFor(p.ProtocolVersion)
	}
	return None
}

func (s *server) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		ss, _ := req.GetSession().(*mcp.ServerSession)
		switch method {
		case "initialize":
			res, err := next(ctx, method, req)
			if ir, ok := res.(*mcp.InitializeResult); ok && err == nil && DialectFor(ir.ProtocolVersion) == Spec20251125 {
				return &initializeResult{ir}, nil
			}
			return res, err
		case "server/discover":
			res, err := next(ctx, method, req)
			if dr, ok := res.(*mcp.DiscoverResult); ok && err == nil {
				caps := &mcp.ServerCapabilities{}
				if dr.Capabilities != nil {
					c := *dr.Capabilities
					caps = &c
				}
				ext := map[string]any{ExtensionID: map[string]any{}}
				for k, v := range caps.Extensions {
					ext[k] = v
				}
				caps.Extensions = ext
				cp := *dr
				cp.Capabilities = caps
				return &cp, nil
			}
			return res, err
		case "tools/list":
			res, err := next(ctx, method, req)
			if lr, ok := res.(*mcp.ListToolsResult); ok && err == nil && dialectOf(ss) == Spec20251125 {
				return &listToolsResult{ListToolsResult: lr, tools: s.tools}, nil
			}
			return res, err
		case "tools/call":
			return s.call(ctx, ss, next, req)
		case "tasks/get", "tasks/result", "tasks/list", "tasks/cancel", "tasks/update":
			return next(context.WithValue(ctx, extraKey{}, req.GetExtra()), method, req)
		}
		return next(ctx, method, req)
	}
}

// call handles tools/call: a task-augmented call (2025-11-25) of a task tool becomes a task;
// with the extension, the server decides — a call whose execution is still going after its
// wait is answered with a task instead of a running handle. Anything else runs as usual.
func (s *server) call(ctx context.Context, ss *mcp.ServerSession, next mcp.MethodHandler, req mcp.Request) (mcp.Result, error) {
	p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
	if !ok {
		return next(ctx, "tools/call", req)
	}
	_, augmented := p.Meta[metaTask]
	if augmented {
		cp := *p
		cp.Meta = without(p.Meta, metaTask)
		p = &cp
		req = &mcp.CallToolRequest{Session: ss, Params: p, Extra: req.GetExtra()}
	}
	d := dialectOf(ss)
	switch {
	case d == Spec20251125 && augmented && s.tools[p.Name]:
		return s.createTask(ctx, ss, next, req.(*mcp.CallToolRequest))
	case d == Spec20251125 && augmented:
		// The spec: a tool without taskSupport called as a task SHOULD get -32601.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("tool %q does not support task augmentation; call it without a task", p.Name)}
	case d == Extension && s.tools[p.Name] && declaresExtension(p.Meta):
		res, err := next(ctx, "tools/call", req)
		tr, ok := res.(*mcp.CallToolResult)
		if err != nil || !ok {
			return res, err
		}
		x, err := s.be.Created(ctx, req.GetExtra(), tr)
		if err != nil {
			return res, nil // no execution: the plain result says why
		}
		st, _ := StatusOf(x.Facts, Extension)
		if st.Terminal() {
			return res, nil
		}
		// The result's _meta goes with the task: it may carry what the transport acts on
		// (the approval offer the stdio bridge asks its user about, journaled once).
		return &extCreateTaskResult{ResultBase: mcp.ResultBase{Meta: maps.Clone(tr.Meta)}, ResultType: "task", ExtTask: s.extTask(x, nil)}, nil
	}
	return next(ctx, "tools/call", req)
}

func (s *server) createTask(ctx context.Context, ss *mcp.ServerSession, next mcp.MethodHandler, req *mcp.CallToolRequest) (mcp.Result, error) {
	p := *req.Params
	if s.opts.WaitArgument != "" {
		args := map[string]json.RawMessage{}
		if len(p.Arguments) > 0 {
			if err := json.Unmarshal(p.Arguments, &args); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "arguments must be a JSON object"}
			}
		}
		args[s.opts.WaitArgument] = json.RawMessage("0")
		raw, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		p.Arguments = raw
	}
	creating := context.WithValue(ctx, creatingKey{}, true)
	res, err := next(creating, "tools/call", &mcp.CallToolRequest{Session: ss, Params: &p, Extra: req.Extra})
	if err != nil {
		return nil, err
	}
	tr, ok := res.(*mcp.CallToolResult)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the tool returned no result"}
	}
	x, err := s.be.Created(ctx, req.Extra, tr)
	if err != nil {
		// Refused before any execution existed (invalid arguments, a reused idempotency key,
		// a limit): there is no task, and nothing was sent.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	return &createTaskResult{Task: s.task(x)}, nil
}

func declaresExtension(meta mcp.Meta) bool {
	caps, ok := meta[metaClientCapabilities].(map[string]any)
	if !ok {
		return false
	}
	ext, ok := caps["extensions"].(map[string]any)
	if !ok {
		return false
	}
	_, ok = ext[ExtensionID]
	return ok
}

func without(m mcp.Meta, key string) mcp.Meta {
	if len(m) == 1 {
		return nil
	}
	out := make(mcp.Meta, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// pollInterval suggests how often to poll a task in status st.
func (s *server) pollInterval(st Status) int64 {
	switch {
	case st.Terminal():
		return 0
	case st == InputRequired:
		return 5 * s.opts.PollInterval.Milliseconds()
	}
	return s.opts.PollInterval.Milliseconds()
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func (s *server) task(x *Execution) Task {
	st, msg := StatusOf(x.Facts, Spec20251125)
	t := Task{TaskID: x.ID, Status: st, StatusMessage: msg, CreatedAt: stamp(x.CreatedAt), LastUpdatedAt: stamp(x.UpdatedAt), PollInterval: s.pollInterval(st)}
	if x.Retention > 0 {
		ms := x.Retention.Milliseconds()
		t.TTL = &ms
	}
	return t
}

func (s *server) extTask(x *Execution, result *mcp.CallToolResult) ExtTask {
	st, msg := StatusOf(x.Facts, Extension)
	t := ExtTask{TaskID: x.ID, Status: st, StatusMessage: msg, CreatedAt: stamp(x.CreatedAt), LastUpdatedAt: stamp(x.UpdatedAt), PollIntervalMilliseconds: s.pollInterval(st), Result: result}
	if x.Retention > 0 {
		sec := int64(x.Retention / time.Second)
		t.TTLSeconds = &sec
	}
	return t
}

// taskParams are the params of tasks/get, tasks/result, tasks/cancel and tasks/update.
type taskParams struct {
	mcp.ParamsBase
	TaskID       string `json:"taskId"`
	RequestState string `json:"requestState,omitempty"`
}

type listParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

func notFound(id string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("Failed to retrieve task: task %q not found", id)}
}

// backendError turns a Backend error into the JSON-RPC error the spec asks for.
func backendError(id string, err error) error {
	if errors.Is(err, ErrNotFound) {
		return notFound(id)
	}
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return err
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}

func (s *server) get(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
	if p == nil {
		p = &taskParams{}
	}
	extra := extraFrom(ctx)
	x, err := s.be.Get(ctx, extra, p.TaskID)
	if err != nil {
		return nil, backendError(p.TaskID, err)
	}
	if dialectOf(ss) != Extension {
		return &taskResult{Task: s.task(x)}, nil
	}
	var result *mcp.CallToolResult
	if st, _ := StatusOf(x.Facts, Extension); st == Completed {
		// The extension carries the final result inline; a terminal execution answers at once.
		if result, err = s.be.Result(ctx, extra, p.TaskID, nil); err != nil {
			return nil, backendError(p.TaskID, err)
		}
	}
	return &extTaskResult{ResultType: "complete", ExtTask: s.extTask(x, result)}, nil
}

// result answers tasks/result: it blocks until the execution is terminal, reporting the
// status when it starts waiting and every change as progress notifications when the
// request carries a progress token (go-sdk 1.8 can send no custom notification such as
// notifications/tasks/status).
func (s *server) result(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (*mcp.CallToolResult, error) {
	if p == nil {
		p = &taskParams{}
	}
	var changed func(*Execution)
	if token := p.Meta["progressToken"]; token != nil && ss != nil {
		n := 0
		changed = func(x *Execution) {
			n++
			st, msg := StatusOf(x.Facts, Spec20251125)
			ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: fmt.Sprintf("task %s %s: %s", x.ID, st, msg)})
		}
	}
	res, err := s.be.Result(ctx, extraFrom(ctx), p.TaskID, changed)
	if err != nil {
		return nil, backendError(p.TaskID, err)
	}
	cp := *res
	meta := mcp.Meta{}
	for k, v := range res.Meta {
		meta[k] = v
	}
	meta[MetaRelatedTask] = map[string]any{"taskId": p.TaskID}
	cp.Meta = meta
	return &cp, nil
}

func (s *server) list(ctx context.Context, ss *mcp.ServerSession, p *listParams) (mcp.Result, error) {
	if p == nil {
		p = &listParams{}
	}
	xs, next, err := s.be.List(ctx, extraFrom(ctx), p.Cursor, s.opts.PageSize)
	if errors.Is(err, ErrBadCursor) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tasks/list: invalid cursor"}
	}
	if err != nil {
		return nil, backendError("", err)
	}
	out := &listTasksResult{Tasks: []Task{}, NextCursor: next}
	for _, x := range xs {
		out.Tasks = append(out.Tasks, s.task(x))
	}
	return out, nil
}

// cancel answers tasks/cancel like execution_cancel. A terminal task is refused (-32602), as
// the spec says. What follows is what happened, never a claim: a command that ended before
// the cancel reached its host, or an HTTP request already sent, keeps its real outcome
// (the spec would have the task say cancelled regardless; Postern does not hide an effect).
func (s *server) cancel(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
	if p == nil {
		p = &taskParams{}
	}
	extra := extraFrom(ctx)
	x, err := s.be.Get(ctx, extra, p.TaskID)
	if err != nil {
		if dialectOf(ss) == Extension {
			return &ackResult{ResultType: "complete"}, nil // the extension acknowledges any id
		}
		return nil, backendError(p.TaskID, err)
	}
	d := dialectOf(ss)
	if st, _ := StatusOf(x.Facts, d); st.Terminal() {
		if d == Extension {
			return &ackResult{ResultType: "complete"}, nil
		}
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("task %s is already %s; nothing to cancel", p.TaskID, st)}
	}
	if x, err = s.be.Cancel(ctx, extra, p.TaskID); err != nil {
		return nil, backendError(p.TaskID, err)
	}
	if d == Extension {
		return &ackResult{ResultType: "complete"}, nil
	}
	return &taskResult{Task: s.task(x)}, nil
}

// update answers the extension's tasks/update: Postern's tasks never ask the client for
// input in-band through a task, so there is nothing outstanding; it acknowledges, as the
// extension requires for any id.
func (s *server) update(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
	return &ackResult{ResultType: "complete"}, nil
}

// Results.

type createTaskResult struct {
	mcp.ResultBase
	Task Task `json:"task"`
}

type taskResult struct {
	mcp.ResultBase
	Task
}

type listTasksResult struct {
	mcp.ResultBase
	Tasks      []Task `json:"tasks"`
	NextCursor string `json:"nextCursor,omitempty"`
}

type extCreateTaskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	ExtTask
}

type extTaskResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
	ExtTask
}

type ackResult struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

// initializeResult is go-sdk's initialize result with capabilities.tasks added (go-sdk's
// ServerCapabilities has no such field).
type initializeResult struct{ *mcp.InitializeResult }

func (r *initializeResult) MarshalJSON() ([]byte, error) {
	return withMember(r.InitializeResult, []string{"capabilities", "tasks"}, map[string]any{
		"list":     map[string]any{},
		"cancel":   map[string]any{},
		"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}},
	})
}

// listToolsResult is go-sdk's tools/list result with execution.taskSupport on the task
// tools (go-sdk's Tool has no such field).
type listToolsResult struct {
	*mcp.ListToolsResult
	tools map[string]bool
}

func (r *listToolsResult) MarshalJSON() ([]byte, error) {
	raw, err := json.Marshal(r.ListToolsResult)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	var tools []map[string]any
	if err := json.Unmarshal(m["tools"], &tools); err != nil {
		return nil, err
	}
	for _, t := range tools {
		if name, _ := t["name"].(string); r.tools[name] {
			t["execution"] = map[string]any{"taskSupport": "optional"}
		}
	}
	if m["tools"], err = json.Marshal(tools); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// withMember marshals v with value set at path (objects created as needed).
func withMember(v any, path []string, value any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	cur := m
	for _, k := range path[:len(path)-1] {
		next, ok := cur[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[k] = next
		}
		cur = next
	}
	cur[path[len(path)-1]] = value
	return json.Marshal(m)
}
