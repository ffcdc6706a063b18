package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
)

// The callers the tests' transports identify.
var (
	remoteCaller = transport.Caller{Actor: "token:agent", RunID: "run-from-header"}
	// bridgedCaller is a stdio bridge of the daemon's own binary: the only caller offered
	// approvals to ask its client's user.
	bridgedCaller = transport.Caller{Actor: "local:alice", Scope: "run:4242-99", Local: true, PID: 4242, UID: 1000,
		Bridged: true, BridgeBinary: true}
)

// errUnscripted is what fakeEngine answers for a method the test did not script.
var errUnscripted = errors.New("fake engine: unscripted call")

// fakeEngine is the engine as the MCP surface sees it (Engine): it records every call with
// the caller the surface handed it, and answers as the test scripts it. A method left nil
// answers errUnscripted.
type fakeEngine struct {
	httpEnabled bool

	exec           func(ctx context.Context, a api.ExecArgs, progress func(*api.Execution)) (*api.Execution, error)
	httpRequest    func(ctx context.Context, a api.HTTPArgs, progress func(*api.Execution)) (*api.Execution, error)
	fleetExec      func(ctx context.Context, a api.FleetArgs, progress func(*api.Execution)) (*api.Execution, error)
	status         func(id string) (*api.Execution, error)
	output         func(a api.OutputArgs) (*api.Execution, error)
	cancel         func(id string) (*api.Execution, error)
	list           func(a api.ListArgs) (*api.ListResult, error)
	hosts          func() (*api.HostsResult, error)
	state          func(id string) (*api.ExecutionState, error)
	states         func(cursor string, limit int) ([]*api.ExecutionState, string, error)
	awaitEnd       func(ctx context.Context, id string, changed func(*api.ExecutionState)) (*api.Execution, error)
	askInClient    func(id string) (*api.ApprovalRequest, error)
	decideInClient func(id, decision, note string, redeem func() bool) (*api.Execution, error)

	mu    sync.Mutex // guards calls
	calls []engineCall
}

var _ Engine = (*fakeEngine)(nil)

// engineCall is one call of the engine: the method, the caller it was given (zero for
// methods without one) and its arguments (the execution id for the methods that take one).
type engineCall struct {
	Method string
	Caller transport.Caller
	Arg    any
	// NilCallback is true when the method's progress or changed callback was nil.
	NilCallback bool
}

func (f *fakeEngine) record(c engineCall) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

// callsTo returns the calls of method, oldest first.
func (f *fakeEngine) callsTo(method string) []engineCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []engineCall
	for _, c := range f.calls {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// methods returns the names of the methods called, oldest first.
func (f *fakeEngine) methods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.Method)
	}
	return out
}

func (f *fakeEngine) Exec(ctx context.Context, c transport.Caller, a api.ExecArgs, progress func(*api.Execution)) (*api.Execution, error) {
	f.record(engineCall{Method: "Exec", Caller: c, Arg: a, NilCallback: progress == nil})
	if f.exec == nil {
		return nil, errUnscripted
	}
	return f.exec(ctx, a, progress)
}

func (f *fakeEngine) HTTPRequest(ctx context.Context, c transport.Caller, a api.HTTPArgs, progress func(*api.Execution)) (*api.Execution, error) {
	f.record(engineCall{Method: "HTTPRequest", Caller: c, Arg: a, NilCallback: progress == nil})
	if f.httpRequest == nil {
		return nil, errUnscripted
	}
	return f.httpRequest(ctx, a, progress)
}

func (f *fakeEngine) FleetExec(ctx context.Context, c transport.Caller, a api.FleetArgs, progress func(*api.Execution)) (*api.Execution, error) {
	f.record(engineCall{Method: "FleetExec", Caller: c, Arg: a, NilCallback: progress == nil})
	if f.fleetExec == nil {
		return nil, errUnscripted
	}
	return f.fleetExec(ctx, a, progress)
}

func (f *fakeEngine) HTTPEnabled() bool { return f.httpEnabled }

func (f *fakeEngine) Status(_ context.Context, c transport.Caller, id string) (*api.Execution, error) {
	f.record(engineCall{Method: "Status", Caller: c, Arg: id})
	if f.status == nil {
		return nil, errUnscripted
	}
	return f.status(id)
}

func (f *fakeEngine) Output(_ context.Context, c transport.Caller, a api.OutputArgs) (*api.Execution, error) {
	f.record(engineCall{Method: "Output", Caller: c, Arg: a})
	if f.output == nil {
		return nil, errUnscripted
	}
	return f.output(a)
}

func (f *fakeEngine) Cancel(_ context.Context, c transport.Caller, id string) (*api.Execution, error) {
	f.record(engineCall{Method: "Cancel", Caller: c, Arg: id})
	if f.cancel == nil {
		return nil, errUnscripted
	}
	return f.cancel(id)
}

func (f *fakeEngine) List(c transport.Caller, a api.ListArgs) (*api.ListResult, error) {
	f.record(engineCall{Method: "List", Caller: c, Arg: a})
	if f.list == nil {
		return nil, errUnscripted
	}
	return f.list(a)
}

func (f *fakeEngine) HostsOf(c transport.Caller, a api.HostsArgs) (*api.HostsResult, error) {
	f.record(engineCall{Method: "HostsOf", Caller: c, Arg: a})
	if f.hosts == nil {
		return nil, errUnscripted
	}
	return f.hosts()
}

func (f *fakeEngine) State(c transport.Caller, id string) (*api.ExecutionState, error) {
	f.record(engineCall{Method: "State", Caller: c, Arg: id})
	if f.state == nil {
		return nil, errUnscripted
	}
	return f.state(id)
}

// statesArgs are the arguments of States.
type statesArgs struct {
	Cursor string
	Limit  int
}

func (f *fakeEngine) States(c transport.Caller, cursor string, limit int) ([]*api.ExecutionState, string, error) {
	f.record(engineCall{Method: "States", Caller: c, Arg: statesArgs{cursor, limit}})
	if f.states == nil {
		return nil, "", errUnscripted
	}
	return f.states(cursor, limit)
}

func (f *fakeEngine) AwaitEnd(ctx context.Context, c transport.Caller, id string, changed func(*api.ExecutionState)) (*api.Execution, error) {
	f.record(engineCall{Method: "AwaitEnd", Caller: c, Arg: id, NilCallback: changed == nil})
	if f.awaitEnd == nil {
		return nil, errUnscripted
	}
	return f.awaitEnd(ctx, id, changed)
}

func (f *fakeEngine) AskInClient(_ context.Context, c transport.Caller, id string) (*api.ApprovalRequest, error) {
	f.record(engineCall{Method: "AskInClient", Caller: c, Arg: id})
	if f.askInClient == nil {
		return nil, errUnscripted
	}
	return f.askInClient(id)
}

// decision is what DecideInClient was asked to journal.
type decision struct {
	ID, Decision, Note string
	// Redeemed is what the redeem func answered ("true" or "false"), "" when it was not
	// called.
	Redeemed string
}

func (f *fakeEngine) DecideInClient(_ context.Context, c transport.Caller, id, d, note string, redeem func() bool) (*api.Execution, error) {
	if f.decideInClient == nil {
		f.record(engineCall{Method: "DecideInClient", Caller: c, Arg: decision{ID: id, Decision: d, Note: note}, NilCallback: redeem == nil})
		return nil, errUnscripted
	}
	// Redeem as the engine does, once its other checks passed, and record the answer.
	redeemed := ""
	wrapped := redeem
	if redeem != nil {
		wrapped = func() bool {
			ok := redeem()
			redeemed = strconv.FormatBool(ok)
			return ok
		}
	}
	x, err := f.decideInClient(id, d, note, wrapped)
	f.record(engineCall{Method: "DecideInClient", Caller: c, Arg: decision{ID: id, Decision: d, Note: note, Redeemed: redeemed}, NilCallback: redeem == nil})
	return x, err
}

// answering is an engine with an HTTP plugin whose tools all answer what answer returns:
// the execution tools its execution, executions_list and hosts_list an empty result (or
// its error).
func answering(answer func() (*api.Execution, error)) *fakeEngine {
	return &fakeEngine{
		httpEnabled: true,
		exec:        func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) { return answer() },
		httpRequest: func(context.Context, api.HTTPArgs, func(*api.Execution)) (*api.Execution, error) { return answer() },
		fleetExec:   func(context.Context, api.FleetArgs, func(*api.Execution)) (*api.Execution, error) { return answer() },
		status:      func(string) (*api.Execution, error) { return answer() },
		output:      func(api.OutputArgs) (*api.Execution, error) { return answer() },
		cancel:      func(string) (*api.Execution, error) { return answer() },
		list: func(api.ListArgs) (*api.ListResult, error) {
			if _, err := answer(); err != nil {
				return nil, err
			}
			return &api.ListResult{Executions: []*api.Execution{}}, nil
		},
		hosts: func() (*api.HostsResult, error) {
			if _, err := answer(); err != nil {
				return nil, err
			}
			return &api.HostsResult{Hosts: []api.HostInfo{}}, nil
		},
	}
}

// toolArgs are arguments each tool accepts.
var toolArgs = map[string]map[string]any{
	"ssh_exec":         {"host": "h1", "command": "make deploy"},
	"fleet_exec":       {"targets": []string{"group:db"}, "command": "make deploy", "max_concurrency": 2, "max_errors": "10%"},
	"http_request":     {"endpoint": "billing", "method": "POST", "path": "/v1/charges"},
	"execution_status": {"execution_id": "ex_1"},
	"execution_output": {"execution_id": "ex_1"},
	"execution_cancel": {"execution_id": "ex_1"},
	"executions_list":  {},
	"hosts_list":       {},
}

// fakeJournal is the engine's delivery journal (delivery.Journal): it records the
// executions journaled delivered.
type fakeJournal struct {
	mu        sync.Mutex // guards delivered
	delivered []string
}

func (j *fakeJournal) Delivered(_ context.Context, id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.delivered = append(j.delivered, id)
	return nil
}

func (j *fakeJournal) RevokeDelivery(context.Context, string) (bool, error) { return false, nil }

func (j *fakeJournal) NotDelivered(context.Context, string, string) error { return nil }

func (j *fakeJournal) Delivering(string) func() { return func() {} }

func (j *fakeJournal) deliveredIDs() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.delivered...)
}

var discardLogger = slog.New(slog.DiscardHandler)

// newServer is New over e with a real delivery tracker that journals into j, and the clock
// now (nil: New's default).
func newServer(t testing.TB, e Engine, j *fakeJournal, now func() time.Time) (*mcp.Server, *delivery.Tracker) {
	t.Helper()
	tracker := delivery.NewTracker(j, nil, time.Minute, time.Now, discardLogger)
	srv, err := New(e, Options{Tracker: tracker, Logger: discardLogger, Now: now})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return srv, tracker
}

// session configures connect.
type session struct {
	// caller is who the transport identifies; nil: nobody (a plain in-memory transport).
	caller *transport.Caller
	// header is the HTTP header every request arrives with (what a front end passes on).
	header http.Header
	// id is the session id the server's end reports ("" as on a stateless endpoint).
	id string
	// client configures the client (its handlers, hence its capabilities).
	client *mcp.ClientOptions
	// version is the protocol version the client asks for (default 2025-11-25).
	version string
	// now is the server's clock (default time.Now).
	now func() time.Time
}

// connect serves e over go-sdk's in-memory transports and returns a connected client.
// Requests reach the server as the front ends deliver them: with the caller in TokenInfo
// (transport.TokenInfoFor) and the header of the request that carried them.
func connect(t testing.TB, e Engine, s session) *mcp.ClientSession {
	t.Helper()
	srv, _ := newServer(t, e, &fakeJournal{}, s.now)
	ct, st := mcp.NewInMemoryTransports()
	ctx := t.Context()
	ss, err := srv.Connect(ctx, &identifiedTransport{Transport: st, s: s}, nil)
	if err != nil {
		t.Fatalf("server connect: %v", err)
	}
	t.Cleanup(func() { ss.Close() })
	if s.version == "" {
		s.version = "2025-11-25"
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "0"}, s.client)
	if err := errors.Join(
		mcp.AddSendingCustomMethod[*taskRef, *taskAnswer](c, "tasks/get"),
		mcp.AddSendingCustomMethod[*taskRef, *taskAnswer](c, "tasks/cancel"),
		mcp.AddSendingCustomMethod[*taskRef, *mcp.CallToolResult](c, "tasks/result"),
		mcp.AddSendingCustomMethod[*listRef, *listAnswer](c, "tasks/list"),
		mcp.AddSendingCustomMethod[*approvalParams, *approvalResult](c, transport.MethodApproval),
	); err != nil {
		t.Fatal(err)
	}
	cs, err := c.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: s.version})
	if err != nil {
		t.Fatalf("client connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// identifiedTransport is the server's end of an in-memory connection whose requests carry
// what a front end attaches.
type identifiedTransport struct {
	mcp.Transport
	s session
}

func (t *identifiedTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &identifiedConn{Connection: c, s: t.s}, nil
}

type identifiedConn struct {
	mcp.Connection
	s session
}

func (c *identifiedConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && (c.s.caller != nil || c.s.header != nil) {
		extra := &mcp.RequestExtra{Header: c.s.header.Clone()}
		if c.s.caller != nil {
			extra.TokenInfo = transport.TokenInfoFor(*c.s.caller)
		}
		req.Extra = extra
	}
	return msg, err
}

func (c *identifiedConn) SessionID() string { return c.s.id }

// taskRef are the params of tasks/get, tasks/cancel and tasks/result.
type taskRef struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
}

// listRef are the params of tasks/list.
type listRef struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

// taskAnswer is the result of tasks/get and tasks/cancel (2025-11-25).
type taskAnswer struct {
	mcp.ResultBase
	tasks.Task
}

// listAnswer is the result of tasks/list.
type listAnswer struct {
	mcp.ResultBase
	Tasks      []tasks.Task `json:"tasks"`
	NextCursor string       `json:"nextCursor,omitempty"`
}

// callTool calls a tool and fails the test on a protocol error.
func callTool(t testing.TB, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// textOf is the text of a result's only content.
func textOf(t testing.TB, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("result has %d contents; want 1: %+v", len(res.Content), res.Content)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T; want text", res.Content[0])
	}
	return tc.Text
}

// decode re-decodes v (structured content as the client received it) into T.
func decode[T any](t testing.TB, v any) T {
	t.Helper()
	var out T
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return out
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// at is the clock of the executions the tests' engines return.
var at = time.Date(2026, 7, 28, 10, 0, 0, 0, time.UTC)

// execution is an execution in state on h1, with everything a result shows.
func execution(id, state string) *api.Execution {
	return &api.Execution{ExecutionID: id, State: state, Host: "h1", Command: "make deploy", Class: "default",
		Stdout: "out\n", StdoutBytes: 4, AcceptedAt: at, Next: "what to do next"}
}
