package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// readEngineMethods are the engine's methods that change nothing.
var readEngineMethods = []string{"Status", "Output", "List", "HostsOf"}

// TestToolList: the tools, their titles and annotations a client sees; http_request only
// when an HTTP plugin is configured. The hints are checked against what each tool does: a
// tool that says it is read-only calls only the engine's reads (TestToolsCallTheEngine).
func TestToolList(t *testing.T) {
	startsWork := &mcp.ToolAnnotations{ReadOnlyHint: false, DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(true)}
	reads := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)}
	type tool struct {
		title string
		hints *mcp.ToolAnnotations
	}
	always := map[string]tool{
		"ssh_exec":         {"Run a command on a host", startsWork},
		"fleet_exec":       {"Run a command on many hosts", startsWork},
		"execution_status": {"Status of an execution", reads},
		"execution_output": {"Read or follow an execution's output", reads},
		"execution_cancel": {"Cancel an execution", &mcp.ToolAnnotations{ReadOnlyHint: false, DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(true)}},
		"executions_list":  {"List your executions", reads},
		"hosts_list":       {"List enrolled hosts", reads},
	}
	withHTTP := map[string]tool{"http_request": {"Call a configured HTTP API", startsWork}}
	for k, v := range always {
		withHTTP[k] = v
	}
	tests := []struct {
		name        string
		httpEnabled bool
		want        map[string]tool
	}{
		{"without an HTTP plugin", false, always},
		{"with an HTTP plugin", true, withHTTP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := connect(t, &fakeEngine{httpEnabled: tt.httpEnabled}, session{caller: &remoteCaller})
			res, err := cs.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var names, wantNames []string
			for _, tl := range res.Tools {
				names = append(names, tl.Name)
				want, ok := tt.want[tl.Name]
				if !ok {
					continue
				}
				if tl.Title != want.title {
					t.Errorf("%s: title = %q; want %q", tl.Name, tl.Title, want.title)
				}
				if !reflect.DeepEqual(tl.Annotations, want.hints) {
					t.Errorf("%s: annotations = %+v; want %+v", tl.Name, tl.Annotations, want.hints)
				}
				if tl.Description == "" {
					t.Errorf("%s: no description", tl.Name)
				}
			}
			for name := range tt.want {
				wantNames = append(wantNames, name)
			}
			slices.Sort(names)
			slices.Sort(wantNames)
			if !slices.Equal(names, wantNames) {
				t.Errorf("tools = %v; want %v", names, wantNames)
			}
		})
	}
}

// TestWhatToolsPromise: the server's instructions and the tools' descriptions say exactly
// what joins an earlier execution (the same actor and run, or the same idempotency_key from
// any run and any actor of the principal; a restarted agent is a new run), to keep wait_s
// below the client's request timeout, and execution_output names its offsets one way, in
// bytes, in its description and its schema alike.
func TestWhatToolsPromise(t *testing.T) {
	cs := connect(t, &fakeEngine{httpEnabled: true}, session{caller: &remoteCaller})
	init := cs.InitializeResult()
	for _, want := range []string{"same actor and the same run", "same idempotency_key", "any actor of your principal",
		"A restarted agent process is a new run", "pass idempotency_key", "below your client's own request timeout", "60 s", "progress"} {
		if !strings.Contains(init.Instructions, want) {
			t.Errorf("instructions lack %q:\n%s", want, init.Instructions)
		}
	}
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
	}
	for _, name := range []string{"ssh_exec", "http_request"} {
		for _, want := range []string{"same actor and run", "A restarted agent process is a new run", "idempotency_key", "any actor of your principal"} {
			if !strings.Contains(tools[name].Description, want) {
				t.Errorf("%s: description lacks %q", name, want)
			}
		}
		schema, _ := json.Marshal(tools[name].InputSchema)
		for _, want := range []string{"request timeout", "60 s", "idempotency_key_held", "any actor of your principal"} {
			if !strings.Contains(string(schema), want) {
				t.Errorf("%s: input schema lacks %q", name, want)
			}
		}
	}
	if d := tools["ssh_exec"].Description; !strings.Contains(d, "below your client's request timeout") {
		t.Errorf("ssh_exec: description does not say to keep wait_s below the client's timeout:\n%s", d)
	}
	out := tools["execution_output"]
	var schema struct {
		Properties map[string]struct {
			Description string `json:"description"`
		} `json:"properties"`
	}
	raw, _ := json.Marshal(out.InputSchema)
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(schema.Properties)); !slices.Equal(got, []string{"execution_id", "stderr_offset", "stdout_offset", "wait_s"}) {
		t.Errorf("execution_output arguments = %v; want execution_id, stdout_offset, stderr_offset, wait_s", got)
	}
	for _, p := range []string{"stdout_offset", "stderr_offset"} {
		if !strings.Contains(schema.Properties[p].Description, "byte offset") {
			t.Errorf("execution_output %s: %q does not say it counts bytes", p, schema.Properties[p].Description)
		}
		if !strings.Contains(out.Description, p) {
			t.Errorf("execution_output: description does not name %s", p)
		}
	}
	if strings.Contains(out.Description, " offset,") || strings.Contains(out.Description, "(stdout offset") {
		t.Errorf("execution_output: description names an offset argument that does not exist:\n%s", out.Description)
	}
}

// TestToolsCallTheEngine: each tool decodes its arguments into the engine's call, with the
// caller the transport identified — a run_id argument is an argument, never the caller's —
// and a read-only tool calls only the engine's reads.
func TestToolsCallTheEngine(t *testing.T) {
	e := answering(func() (*api.Execution, error) { return execution("ex_1", "completed"), nil })
	cs := connect(t, e, session{caller: &remoteCaller})
	tests := []struct {
		tool     string
		args     map[string]any
		want     engineCall
		readOnly bool
	}{
		{
			tool: "ssh_exec",
			args: map[string]any{"host": "h1", "command": "make deploy", "cwd": "/srv", "env": map[string]string{"LANG": "C"},
				"timeout_s": 60, "wait_s": 0, "run_id": "run-from-argument", "idempotency_key": "k1", "operation_key": "migration:1"},
			want: engineCall{Method: "Exec", Caller: remoteCaller, Arg: api.ExecArgs{Host: "h1", Command: "make deploy", Cwd: "/srv",
				Env: map[string]string{"LANG": "C"}, TimeoutS: 60, OperationKey: "migration:1",
				CallOptions: api.CallOptions{WaitS: ptr(0), RunID: "run-from-argument", IdempotencyKey: "k1"}}},
		},
		{
			tool: "ssh_exec",
			args: map[string]any{"host": "h1", "command": "uptime"},
			want: engineCall{Method: "Exec", Caller: remoteCaller, Arg: api.ExecArgs{Host: "h1", Command: "uptime"}},
		},
		{
			tool: "http_request",
			args: map[string]any{"endpoint": "billing", "method": "POST", "path": "/v1/charges", "query": map[string][]string{"dry": {"1"}},
				"json": map[string]any{"amount": 5}, "headers": map[string]string{"X-Trace": "t1"}, "run_id": "run-from-argument", "idempotency_key": "k2", "wait_s": 5},
			want: engineCall{Method: "HTTPRequest", Caller: remoteCaller, Arg: api.HTTPArgs{Endpoint: "billing", Method: "POST", Path: "/v1/charges",
				Query: map[string][]string{"dry": {"1"}}, JSON: map[string]any{"amount": float64(5)}, Headers: map[string]string{"X-Trace": "t1"},
				CallOptions: api.CallOptions{RunID: "run-from-argument", IdempotencyKey: "k2", WaitS: ptr(5)}}},
		},
		{
			tool: "http_request",
			args: map[string]any{"endpoint": "billing", "method": "PUT", "path": "/v1/notes/1", "text": "hello"},
			want: engineCall{Method: "HTTPRequest", Caller: remoteCaller, Arg: api.HTTPArgs{Endpoint: "billing", Method: "PUT", Path: "/v1/notes/1", Text: ptr("hello")}},
		},
		{
			tool: "fleet_exec",
			args: map[string]any{"targets": []string{"web-1", "group:db", "role=db,env=prod"}, "command": "make deploy", "max_concurrency": 5,
				"max_errors": "10%", "cwd": "/srv", "env": map[string]string{"LANG": "C"}, "timeout_s": 60, "wait_s": 0, "idempotency_key": "k3", "reason": "roll out 1.2"},
			want: engineCall{Method: "FleetExec", Caller: remoteCaller, Arg: api.FleetArgs{Targets: []string{"web-1", "group:db", "role=db,env=prod"},
				Command: "make deploy", MaxConcurrency: "5", MaxErrors: "10%", Cwd: "/srv", Env: map[string]string{"LANG": "C"}, TimeoutS: 60,
				CallOptions: api.CallOptions{WaitS: ptr(0), IdempotencyKey: "k3", Reason: "roll out 1.2"}}},
		},
		{
			tool: "fleet_exec",
			args: map[string]any{"targets": []string{"group:db"}, "command": "uptime", "max_concurrency": "25%", "max_errors": 0},
			want: engineCall{Method: "FleetExec", Caller: remoteCaller, Arg: api.FleetArgs{Targets: []string{"group:db"}, Command: "uptime", MaxConcurrency: "25%", MaxErrors: "0"}},
		},
		{
			tool:     "execution_status",
			args:     map[string]any{"execution_id": "ex_1"},
			want:     engineCall{Method: "Status", Caller: remoteCaller, Arg: "ex_1"},
			readOnly: true,
		},
		{
			tool:     "execution_status",
			args:     map[string]any{"execution_id": "ex_1", "evidence": "full"},
			want:     engineCall{Method: "Status", Caller: remoteCaller, Arg: "ex_1"},
			readOnly: true,
		},
		{
			tool:     "execution_output",
			args:     map[string]any{"execution_id": "ex_1", "stdout_offset": 10, "stderr_offset": 3, "wait_s": 1},
			want:     engineCall{Method: "Output", Caller: remoteCaller, Arg: api.OutputArgs{ExecutionID: "ex_1", StdoutOffset: 10, StderrOffset: 3, WaitS: ptr(1)}},
			readOnly: true,
		},
		{
			tool: "execution_cancel",
			args: map[string]any{"execution_id": "ex_1"},
			want: engineCall{Method: "Cancel", Caller: remoteCaller, Arg: "ex_1"},
		},
		{
			tool:     "executions_list",
			args:     map[string]any{"state": "running", "host": "h1", "since": "2026-07-28T00:00:00Z", "limit": 5},
			want:     engineCall{Method: "List", Caller: remoteCaller, Arg: api.ListArgs{State: "running", Host: "h1", Since: "2026-07-28T00:00:00Z", Limit: 5}},
			readOnly: true,
		},
		{
			tool:     "hosts_list",
			args:     map[string]any{"labels": "role=db,env=prod", "cursor": "h1", "limit": 5},
			want:     engineCall{Method: "HostsOf", Caller: remoteCaller, Arg: api.HostsArgs{Labels: "role=db,env=prod", Cursor: "h1", Limit: 5}},
			readOnly: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			before := len(e.methods())
			if res := callTool(t, cs, tt.tool, tt.args); res.IsError {
				t.Fatalf("%s: isError: %s", tt.tool, textOf(t, res))
			}
			calls := e.callsTo(tt.want.Method)
			if got := len(e.methods()) - before; got != 1 || len(calls) == 0 {
				t.Fatalf("%s made %d engine calls (%v); want one call of %s", tt.tool, got, e.methods()[before:], tt.want.Method)
			}
			got := calls[len(calls)-1]
			got.NilCallback = false
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("engine call = %+v; want %+v", got, tt.want)
			}
			if tt.readOnly && !slices.Contains(readEngineMethods, got.Method) {
				t.Errorf("%s says it is read-only but called %s", tt.tool, got.Method)
			}
		})
	}
}

// TestArgumentsNameNoCaller: a call cannot name its caller in its arguments: such an
// argument is refused before the engine, which only ever hears the transport's caller.
func TestArgumentsNameNoCaller(t *testing.T) {
	e := &fakeEngine{exec: func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) {
		return execution("ex_1", "completed"), nil
	}}
	cs := connect(t, e, session{caller: &remoteCaller})
	for _, field := range []string{"actor", "caller", "scope"} {
		res := callTool(t, cs, "ssh_exec", map[string]any{"host": "h1", "command": "id", field: "token:mallory"})
		if !res.IsError {
			t.Errorf("ssh_exec with argument %q: not refused", field)
		}
	}
	for _, c := range e.callsTo("Exec") {
		if c.Caller != remoteCaller {
			t.Errorf("engine call %s with caller %+v; want the transport's %+v", c.Method, c.Caller, remoteCaller)
		}
	}
}

// TestUnauthenticated: a request the transport did not identify is refused with code
// unauthenticated by every tool, and the engine hears nothing of it.
func TestUnauthenticated(t *testing.T) {
	sessions := []struct {
		name string
		s    session
	}{
		{"no request extra", session{}},
		{"a header but no token info", session{header: http.Header{"Postern-Run": {"r1"}}}},
	}
	for _, ss := range sessions {
		t.Run(ss.name, func(t *testing.T) {
			e := &fakeEngine{httpEnabled: true}
			cs := connect(t, e, ss.s)
			for tool, a := range toolArgs {
				res := callTool(t, cs, tool, a)
				if got, want := textOf(t, res), api.CodeUnauthenticated+": the transport did not identify the caller"; !res.IsError || got != want {
					t.Errorf("%s: isError %v, %q; want isError, %q", tool, res.IsError, got, want)
				}
			}
			if m := e.methods(); len(m) != 0 {
				t.Errorf("the engine was called: %v", m)
			}
		})
	}
}

// TestExecutionResults: the result of every tool that returns an execution: its text is the
// execution's Summary, its structured content the execution itself, and isError says the
// call failed — for ssh_exec and http_request, that the command or request failed
// (CallFailed); reading or cancelling an execution never fails because of its state.
func TestExecutionResults(t *testing.T) {
	finished := at.Add(time.Minute)
	full := func(id, state string) *api.Execution {
		x := execution(id, state)
		x.ExitCode, x.FinishedAt, x.Evidence = ptr(0), &finished, []string{"host marker: exited 0"}
		x.OutputSHA256 = "abc"
		return x
	}
	httpX := full("ex_http", "completed")
	httpX.ExitCode, httpX.HTTPStatus, httpX.ResponseHeader, httpX.ResponseBody = nil, 200, map[string][]string{"Content-Type": {"application/json"}}, "{}"
	exit1 := full("ex_exit1", "completed")
	exit1.ExitCode, exit1.IsError = ptr(1), true
	failed := full("ex_failed", "failed")
	failed.ExitCode, failed.Cause = nil, "cwd /srv does not exist"
	unknown := execution("ex_unknown", "unknown")
	unknown.ReviewRequired, unknown.Cause = true, "the host keeps no markers"
	executions := []struct {
		x          *api.Execution
		callFailed bool
	}{
		{full("ex_ok", "completed"), false},
		{httpX, false},
		{exit1, true},
		{failed, true},
		{execution("ex_rejected", "rejected"), true},
		{execution("ex_cancelled", "cancelled"), true},
		{execution("ex_timed_out", "timed_out"), true},
		{unknown, true},
		{execution("ex_running", "running"), false},
		{execution("ex_awaiting", "awaiting_approval"), false},
	}
	tools := []struct {
		name       string
		startsWork bool
	}{
		{"ssh_exec", true},
		{"http_request", true},
		{"execution_status", false},
		{"execution_output", false},
		{"execution_cancel", false},
	}
	var mu sync.Mutex
	var next *api.Execution
	e := answering(func() (*api.Execution, error) {
		mu.Lock()
		defer mu.Unlock()
		cp := *next
		return &cp, nil
	})
	cs := connect(t, e, session{caller: &remoteCaller})
	for _, tool := range tools {
		for _, ex := range executions {
			t.Run(tool.name+"/"+ex.x.ExecutionID, func(t *testing.T) {
				mu.Lock()
				next = ex.x
				mu.Unlock()
				res := callTool(t, cs, tool.name, toolArgs[tool.name])
				if want := tool.startsWork && ex.callFailed; res.IsError != want {
					t.Errorf("isError = %v; want %v", res.IsError, want)
				}
				want := ex.x.Summary()
				if tool.name == "execution_output" {
					want += "\n" + ex.x.ReadOn() // where to read on, last
				}
				if got := textOf(t, res); got != want {
					t.Errorf("text = %q; want %q", got, want)
				}
				if got := decode[*api.Execution](t, res.StructuredContent); !reflect.DeepEqual(got, ex.x) {
					t.Errorf("structured content = %+v; want %+v", got, ex.x)
				}
				if res.Meta[transport.MetaApprovalOffer] != nil {
					t.Errorf("a remote caller without a session was offered an approval: %v", res.Meta)
				}
			})
		}
	}
}

// TestEngineErrors: an engine error (a ToolError with its stable code) is the tool's error
// result, with no structured content.
func TestEngineErrors(t *testing.T) {
	refused := &api.ToolError{Code: api.CodeNotFound, Message: "no execution ex_404 of yours", ExecutionID: "ex_404"}
	e := answering(func() (*api.Execution, error) { return nil, refused })
	cs := connect(t, e, session{caller: &remoteCaller})
	for tool, args := range toolArgs {
		res := callTool(t, cs, tool, args)
		if got, want := textOf(t, res), "not_found: no execution ex_404 of yours"; !res.IsError || got != want {
			t.Errorf("%s: isError %v, %q; want isError, %q", tool, res.IsError, got, want)
		}
		if res.StructuredContent != nil {
			t.Errorf("%s: structured content %v with an error", tool, res.StructuredContent)
		}
	}
}

// TestListResults: executions_list and hosts_list answer one line per item (or say there
// is none) and the engine's result as structured content. Times are shown in UTC, whatever
// zone the engine's time is in.
func TestListResults(t *testing.T) {
	paris := time.FixedZone("CEST", 2*3600)
	tests := []struct {
		name     string
		list     *api.ListResult
		hosts    *api.HostsResult
		wantList string
		wantHost string
	}{
		{
			name:     "none",
			list:     &api.ListResult{Executions: []*api.Execution{}},
			hosts:    &api.HostsResult{Hosts: []api.HostInfo{}},
			wantList: "No executions.",
			wantHost: "No hosts are enrolled that you may use.",
		},
		{
			name: "some",
			list: &api.ListResult{Executions: []*api.Execution{
				{ExecutionID: "ex_2", State: "running", Host: "h2", Command: "sleep 60", AcceptedAt: at.Add(time.Minute)},
				{ExecutionID: "ex_1", State: "completed", Host: "h1", Command: "uptime", AcceptedAt: at.In(paris)},
			}},
			hosts: &api.HostsResult{Total: 2, Hosts: []api.HostInfo{
				{Name: "h1", Addr: "10.0.0.1:22", Account: "deploy", HostKeyType: "ssh-ed25519", HostKey: "SHA256:abc", Guarantee: "hostagent", Connected: true},
				{Name: "h2", Addr: "10.0.0.2:22", Account: "root", HostKeyType: "ssh-rsa", HostKey: "SHA256:def", Guarantee: "none",
					Description: "primary database", Labels: map[string]string{"role": "db", "env": "prod"}, OS: "Debian 12"},
			}},
			wantList: "ex_2 2026-07-28T10:01:00Z running on h2: sleep 60\nex_1 2026-07-28T10:00:00Z completed on h1: uptime\n",
			wantHost: "h1 (deploy@10.0.0.1:22, ssh-ed25519 SHA256:abc, guarantee hostagent)\n" +
				"h2: primary database (env=prod, role=db, os Debian 12, root@10.0.0.2:22, ssh-rsa SHA256:def, guarantee none)\n",
		},
		{
			name: "a page",
			list: &api.ListResult{Executions: []*api.Execution{}},
			hosts: &api.HostsResult{Total: 250, NextCursor: "h1", Hosts: []api.HostInfo{
				{Name: "h1", Addr: "10.0.0.1:22", Account: "deploy", HostKeyType: "@cert-authority", Guarantee: "hostagent"},
			}},
			wantList: "No executions.",
			wantHost: "h1 (deploy@10.0.0.1:22, @cert-authority, guarantee hostagent)\n1 of 250 hosts; for more, call hosts_list again with cursor \"h1\".\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{
				list:  func(api.ListArgs) (*api.ListResult, error) { return tt.list, nil },
				hosts: func() (*api.HostsResult, error) { return tt.hosts, nil },
			}
			cs := connect(t, e, session{caller: &remoteCaller})
			res := callTool(t, cs, "executions_list", map[string]any{})
			if got := textOf(t, res); res.IsError || got != tt.wantList {
				t.Errorf("executions_list = isError %v, %q; want %q", res.IsError, got, tt.wantList)
			}
			if got := decode[*api.ListResult](t, res.StructuredContent); len(got.Executions) != len(tt.list.Executions) {
				t.Errorf("executions_list structured content = %+v; want %+v", got, tt.list)
			} else {
				for i, x := range got.Executions {
					if want := tt.list.Executions[i]; x.ExecutionID != want.ExecutionID || !x.AcceptedAt.Equal(want.AcceptedAt) {
						t.Errorf("executions_list structured content [%d] = %+v; want %+v", i, x, want)
					}
				}
			}
			res = callTool(t, cs, "hosts_list", map[string]any{})
			if got := textOf(t, res); res.IsError || got != tt.wantHost {
				t.Errorf("hosts_list = isError %v, %q; want %q", res.IsError, got, tt.wantHost)
			}
			if got := decode[*api.HostsResult](t, res.StructuredContent); !reflect.DeepEqual(got, tt.hosts) {
				t.Errorf("hosts_list structured content = %+v; want %+v", got, tt.hosts)
			}
		})
	}
}

// TestProgress: a call that passed a progress token hears the engine's progress as
// notifications/progress for that token, each with a greater progress value than the last
// (the MCP spec's MUST) even while the command prints nothing; a call without a token
// gives the engine no progress func.
func TestProgress(t *testing.T) {
	for _, tool := range []struct {
		name string
		args map[string]any
	}{
		{"ssh_exec", map[string]any{"host": "h1", "command": "make deploy"}},
		{"http_request", map[string]any{"endpoint": "e", "method": "GET", "path": "/"}},
	} {
		t.Run(tool.name, func(t *testing.T) {
			outputs := []int64{10, 10, 10, 25}
			run := func(ctx context.Context, progress func(*api.Execution)) (*api.Execution, error) {
				if progress != nil {
					for _, out := range outputs {
						x := execution("ex_1", "running")
						x.StdoutBytes, x.StderrBytes = out, 0
						progress(x)
					}
				}
				return execution("ex_1", "completed"), nil
			}
			e := &fakeEngine{
				httpEnabled: true,
				exec: func(ctx context.Context, _ api.ExecArgs, p func(*api.Execution)) (*api.Execution, error) {
					return run(ctx, p)
				},
				httpRequest: func(ctx context.Context, _ api.HTTPArgs, p func(*api.Execution)) (*api.Execution, error) {
					return run(ctx, p)
				},
			}
			notes := make(chan *mcp.ProgressNotificationParams, 16)
			cs := connect(t, e, session{caller: &remoteCaller, client: &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { notes <- req.Params },
			}})

			params := &mcp.CallToolParams{Name: tool.name, Arguments: tool.args}
			params.SetProgressToken("p-1")
			if _, err := cs.CallTool(t.Context(), params); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			last := -1.0
			for i := range outputs {
				var n *mcp.ProgressNotificationParams
				select {
				case n = <-notes:
				case <-ctx.Done():
					t.Fatalf("got %d progress notifications; want %d", i, len(outputs))
				}
				if n.ProgressToken != "p-1" {
					t.Errorf("notification %d: token = %v; want p-1", i, n.ProgressToken)
				}
				if want := fmt.Sprintf("ex_1 running: %d bytes of output", outputs[i]); n.Message != want {
					t.Errorf("notification %d: message = %q; want %q", i, n.Message, want)
				}
				if n.Progress <= last {
					t.Errorf("notification %d: progress = %v after %v; want it to increase", i, n.Progress, last)
				}
				last = n.Progress
			}

			callTool(t, cs, tool.name, tool.args)
			calls := e.callsTo(map[string]string{"ssh_exec": "Exec", "http_request": "HTTPRequest"}[tool.name])
			if len(calls) != 2 || calls[0].NilCallback || !calls[1].NilCallback {
				t.Errorf("engine calls = %+v; want a progress func with the token only", calls)
			}
		})
	}
}

// TestFleetProgress: a fleet run's progress notifications say how many of its hosts are in
// which state.
func TestFleetProgress(t *testing.T) {
	e := &fakeEngine{fleetExec: func(ctx context.Context, _ api.FleetArgs, progress func(*api.Execution)) (*api.Execution, error) {
		x := execution("fr_1", "running")
		x.Fleet = &api.FleetRun{Total: 3, Counts: map[string]int{"completed": 1, "running": 2}}
		if progress != nil {
			progress(x)
		}
		x.State, x.Fleet.Counts = "completed", map[string]int{"completed": 3}
		return x, nil
	}}
	notes := make(chan *mcp.ProgressNotificationParams, 4)
	cs := connect(t, e, session{caller: &remoteCaller, client: &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { notes <- req.Params },
	}})
	params := &mcp.CallToolParams{Name: "fleet_exec", Arguments: toolArgs["fleet_exec"]}
	params.SetProgressToken("p-1")
	res, err := cs.CallTool(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if text := textOf(t, res); !strings.Contains(text, "fleet run on 3 hosts") || !strings.Contains(text, "3 completed") {
		t.Errorf("result text %q; want the run's counts", text)
	}
	select {
	case n := <-notes:
		if want := "fr_1 running: 3 hosts: 1 completed, 2 running"; n.Message != want {
			t.Errorf("progress message %q; want %q", n.Message, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no progress notification")
	}
}
