package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
)

// endpoint is the server behind the bastion's stateless HTTP stack (bastion.Serve): a front
// end that identifies every request as one caller, the delivery tracker (journaling into
// journal), tasks.HTTPHandler and go-sdk's stateless Streamable HTTP handler, on a real
// connection whose kernel state is the delivery evidence.
type endpoint struct {
	url     string
	journal *fakeJournal
}

func serveHTTP(t testing.TB, e Engine, c transport.Caller) *endpoint {
	t.Helper()
	ep := &endpoint{journal: &fakeJournal{}}
	srv, tracker := newServer(t, e, ep.journal, nil)
	streamable := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true, Logger: discardLogger})
	identify := auth.RequireBearerToken(func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
		return transport.TokenInfoFor(c), nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	ts := httptest.NewUnstartedServer(identify(tracker.Handler(tasks.HTTPHandler(streamable))))
	ts.Config.ConnContext = delivery.RememberConn(nil)
	ts.Start()
	t.Cleanup(ts.Close)
	ep.url = ts.URL
	return ep
}

// rpcAnswer is a JSON-RPC response as the client read it.
type rpcAnswer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// post sends one request at protocol version 2025-11-25, with header, and reads the whole
// response: it returns once the server's handler has ended, delivery judged.
func (ep *endpoint) post(t testing.TB, method string, params map[string]any, header http.Header) rpcAnswer {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, ep.url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var a rpcAnswer
		if json.Unmarshal([]byte(strings.TrimPrefix(sc.Text(), "data: ")), &a) == nil && (a.Result != nil || a.Error != nil) {
			return a
		}
	}
	t.Fatalf("%s: no answer in HTTP %d %q", method, resp.StatusCode, raw)
	return rpcAnswer{}
}

// TestDelivery: a response that carries a terminal execution's undelivered result is
// journaled delivered once the client has it; a result already delivered, an execution not
// ended yet, an error, and a task-augmented call (which answers with the task, not the
// result) deliver nothing. tasks/result carries the result like a tools/call.
func TestDelivery(t *testing.T) {
	delivered := execution("ex_1", "completed")
	delivered.ResultDelivered = true
	type call struct {
		method string
		params map[string]any
	}
	sshExec := call{"tools/call", map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "make"}}}
	tests := []struct {
		name string
		x    *api.Execution
		err  error
		call call
		want []string
	}{
		{name: "ssh_exec: completed", x: execution("ex_1", "completed"), call: sshExec, want: []string{"ex_1"}},
		{name: "ssh_exec: failed", x: execution("ex_1", "failed"), call: sshExec, want: []string{"ex_1"}},
		{name: "ssh_exec: rejected", x: execution("ex_1", "rejected"), call: sshExec, want: []string{"ex_1"}},
		{name: "ssh_exec: already delivered", x: delivered, call: sshExec},
		{name: "ssh_exec: running", x: execution("ex_1", "running"), call: sshExec},
		{name: "ssh_exec: unknown", x: execution("ex_1", "unknown"), call: sshExec},
		{name: "ssh_exec: refused", err: &api.ToolError{Code: api.CodeQuotaExceeded, Message: "quota"}, call: sshExec},
		{
			name: "execution_status: completed", x: execution("ex_1", "completed"),
			call: call{"tools/call", map[string]any{"name": "execution_status", "arguments": map[string]any{"execution_id": "ex_1"}}},
			want: []string{"ex_1"},
		},
		{
			name: "execution_output: completed", x: execution("ex_1", "completed"),
			call: call{"tools/call", map[string]any{"name": "execution_output", "arguments": map[string]any{"execution_id": "ex_1"}}},
			want: []string{"ex_1"},
		},
		{
			name: "ssh_exec as a task: completed", x: execution("ex_1", "completed"),
			call: call{"tools/call", map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "make"}, "task": map[string]any{}}},
		},
		{name: "tasks/result: completed", x: execution("ex_1", "completed"), call: call{"tasks/result", map[string]any{"taskId": "ex_1"}}, want: []string{"ex_1"}},
		{name: "tasks/result: failed", x: execution("ex_1", "failed"), call: call{"tasks/result", map[string]any{"taskId": "ex_1"}}, want: []string{"ex_1"}},
		{name: "tasks/result: already delivered", x: delivered, call: call{"tasks/result", map[string]any{"taskId": "ex_1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answer := func() (*api.Execution, error) {
				if tt.err != nil {
					return nil, tt.err
				}
				x := *tt.x
				return &x, nil
			}
			e := answering(answer)
			e.state = func(string) (*api.ExecutionState, error) {
				x, err := answer()
				if err != nil {
					return nil, err
				}
				return stateOf(x), nil
			}
			e.awaitEnd = func(context.Context, string, func(*api.ExecutionState)) (*api.Execution, error) { return answer() }
			ep := serveHTTP(t, e, remoteCaller)
			if a := ep.post(t, tt.call.method, tt.call.params, nil); a.Error != nil {
				t.Fatalf("%s: %+v", tt.call.method, a.Error)
			}
			if got := ep.journal.deliveredIDs(); !slices.Equal(got, tt.want) {
				t.Errorf("journaled delivered = %v; want %v", got, tt.want)
			}
		})
	}
}

// TestTaskAugmentedCall: a task-augmented tools/call of ssh_exec starts the execution
// without waiting (wait_s 0) and answers with its task; one that leaves the execution
// awaiting approval asks nobody — neither an offer to the bridge nor the engine's
// AskInClient — since the task answers, not the result. A call refused before any
// execution existed makes no task. tools/list marks the tools that take tasks.
func TestTaskAugmentedCall(t *testing.T) {
	var next *api.Execution
	var refuse error
	e := &fakeEngine{
		exec: func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) {
			if refuse != nil {
				return nil, refuse
			}
			return next, nil
		},
		state:       func(string) (*api.ExecutionState, error) { return stateOf(next), nil },
		askInClient: func(id string) (*api.ApprovalRequest, error) { return &api.ApprovalRequest{ExecutionID: id}, nil },
	}
	ep := serveHTTP(t, e, bridgedCaller)
	form := http.Header{transport.BridgeElicitationHeader: {"form"}}

	next = execution("ex_1", "awaiting_approval")
	a := ep.post(t, "tools/call", map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "make", "wait_s": 30},
		"task": map[string]any{"ttl": 60000}}, form)
	if a.Error != nil {
		t.Fatalf("task-augmented call: %+v", a.Error)
	}
	var created struct {
		Task tasks.Task     `json:"task"`
		Meta map[string]any `json:"_meta"`
	}
	if err := json.Unmarshal(a.Result, &created); err != nil {
		t.Fatal(err)
	}
	if created.Task.TaskID != "ex_1" || created.Task.Status != tasks.InputRequired {
		t.Errorf("task = %+v; want ex_1 input_required", created.Task)
	}
	if created.Meta[transport.MetaApprovalOffer] != nil {
		t.Errorf("the task carries an approval offer: %v", created.Meta)
	}
	if calls := e.callsTo("AskInClient"); len(calls) != 0 {
		t.Errorf("the engine was asked to ask the user: %+v", calls)
	}
	if calls := e.callsTo("Exec"); len(calls) != 1 || !reflect.DeepEqual(calls[0].Arg.(api.ExecArgs).WaitS, ptr(0)) || calls[0].Caller != bridgedCaller {
		t.Errorf("engine Exec calls = %+v; want one with wait_s 0 for the transport's caller", calls)
	}

	// The same call, not as a task, is offered (TestOffer has the rules).
	a = ep.post(t, "tools/call", map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "make"}}, form)
	var res mcp.CallToolResult
	if err := json.Unmarshal(a.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Meta[transport.MetaApprovalOffer] == nil {
		t.Errorf("the plain call of a bridged caller was not offered the approval: %+v", res.Meta)
	}

	refuse = &api.ToolError{Code: api.CodeIdempotencyKeyReused, Message: "the key was used with other arguments"}
	a = ep.post(t, "tools/call", map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": "make"}, "task": map[string]any{}}, nil)
	if a.Error == nil || a.Error.Code != codeInvalidParams || !strings.Contains(a.Error.Message, "no execution was created: idempotency_key_reused") {
		t.Errorf("a refused task-augmented call = %+v, %s; want -32602 saying no execution was created and why", a.Error, a.Result)
	}

	a = ep.post(t, "tools/list", map[string]any{}, nil)
	var list struct {
		Tools []struct {
			Name      string `json:"name"`
			Execution *struct {
				TaskSupport string `json:"taskSupport"`
			} `json:"execution"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(a.Result, &list); err != nil {
		t.Fatal(err)
	}
	for _, tl := range list.Tools {
		support := ""
		if tl.Execution != nil {
			support = tl.Execution.TaskSupport
		}
		if want := map[string]string{"ssh_exec": "optional", "fleet_exec": "optional", "http_request": "optional"}[tl.Name]; support != want {
			t.Errorf("tools/list: %s taskSupport = %q; want %q", tl.Name, support, want)
		}
	}
}
