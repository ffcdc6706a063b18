package tasks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeBackend is a journal of a few executions, for the protocol layer alone.
type fakeBackend struct {
	mu        sync.Mutex
	execs     map[string]*Execution
	order     []string // newest first
	cancelled []string
}

func (f *fakeBackend) Created(_ context.Context, _ *mcp.RequestExtra, res *mcp.CallToolResult) (*Execution, error) {
	var x struct {
		ID string `json:"execution_id"`
	}
	raw, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(raw, &x)
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.execs[x.ID]; ok {
		return e, nil
	}
	return nil, ErrNotFound
}

func (f *fakeBackend) Get(_ context.Context, _ *mcp.RequestExtra, id string) (*Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.execs[id]; ok {
		return e, nil
	}
	return nil, ErrNotFound
}

func (f *fakeBackend) Result(ctx context.Context, extra *mcp.RequestExtra, id string, _ func(*Execution)) (*mcp.CallToolResult, error) {
	if _, err := f.Get(ctx, extra, id); err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "result of " + id}}}, nil
}

func (f *fakeBackend) Cancel(ctx context.Context, extra *mcp.RequestExtra, id string) (*Execution, error) {
	f.mu.Lock()
	f.cancelled = append(f.cancelled, id)
	f.execs[id].State = "cancelled"
	f.mu.Unlock()
	return f.Get(ctx, extra, id)
}

func (f *fakeBackend) List(_ context.Context, _ *mcp.RequestExtra, cursor string, limit int) ([]*Execution, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	start := 0
	if cursor != "" {
		start = -1
		for i, id := range f.order {
			if "after-"+id == cursor {
				start = i + 1
			}
		}
		if start < 0 {
			return nil, "", ErrBadCursor
		}
	}
	var out []*Execution
	for _, id := range f.order[start:] {
		if len(out) == limit {
			return out, "after-" + out[len(out)-1].ID, nil
		}
		out = append(out, f.execs[id])
	}
	return out, "", nil
}

// protocolServer serves a server with one task tool ("run") and one other tool ("look"),
// tasks installed over be, statelessly at protocol version; post sends one message (from
// 2026-07-28 with the _meta triple, declaring the tasks extension, and the routing headers).
// The tools' results carry _meta {"test/meta": "kept"}.
func protocolServer(t *testing.T, be Backend, version string) (post func(method string, params map[string]any) (result, rpcErr map[string]any), waits *[]json.RawMessage) {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
	var seen []json.RawMessage
	var mu sync.Mutex
	tool := func(name string) {
		srv.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args map[string]json.RawMessage
			json.Unmarshal(req.Params.Arguments, &args)
			mu.Lock()
			seen = append(seen, args["wait_s"])
			mu.Unlock()
			if version == "2025-11-25" && Creating(ctx) != (name == "run") {
				t.Errorf("tool %s: Creating = %v", name, Creating(ctx))
			}
			return &mcp.CallToolResult{StructuredContent: map[string]any{"execution_id": "ex_run"}, Meta: mcp.Meta{"test/meta": "kept"}}, nil
		})
	}
	tool("run")
	tool("look")
	if err := Install(srv, be, Options{Tools: []string{"run"}, WaitArgument: "wait_s", PageSize: 2}); err != nil {
		t.Fatal(err)
	}
	h := HTTPHandler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true}))
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	post = func(method string, params map[string]any) (map[string]any, map[string]any) {
		t.Helper()
		stateless := version >= "2026-07-28"
		if stateless {
			params["_meta"] = map[string]any{
				"io.modelcontextprotocol/protocolVersion":    version,
				"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw", "version": "0"},
				"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{ExtensionID: map[string]any{}}},
			}
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		req, _ := http.NewRequest(http.MethodPost, ts.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", version)
		if stateless {
			req.Header.Set("Mcp-Method", method)
			if name, _ := params["name"].(string); name != "" {
				req.Header.Set("Mcp-Name", name)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data := strings.TrimPrefix(sc.Text(), "data: ")
			var msg struct {
				Result map[string]any `json:"result"`
				Error  map[string]any `json:"error"`
			}
			if json.Unmarshal([]byte(data), &msg) == nil && (msg.Result != nil || msg.Error != nil) {
				return msg.Result, msg.Error
			}
		}
		t.Fatalf("%s: no answer (HTTP %d)", method, resp.StatusCode)
		return nil, nil
	}
	return post, &seen
}

func code(e map[string]any) int {
	c, _ := e["code"].(float64)
	return int(c)
}

// TestProtocol: the wire behaviour the spec asks for, over a fake journal.
func TestProtocol(t *testing.T) {
	at := time.Date(2026, 7, 28, 10, 0, 0, 0, time.UTC)
	be := &fakeBackend{execs: map[string]*Execution{
		"ex_run":  {ID: "ex_run", Facts: Facts{State: "running"}, CreatedAt: at, UpdatedAt: at, Retention: time.Hour},
		"ex_done": {ID: "ex_done", Facts: Facts{State: "completed"}, CreatedAt: at, UpdatedAt: at, Retention: time.Hour},
		"ex_old":  {ID: "ex_old", Facts: Facts{State: "failed"}, CreatedAt: at, UpdatedAt: at},
	}, order: []string{"ex_run", "ex_done", "ex_old"}}
	post, waits := protocolServer(t, be, "2025-11-25")

	res, rpcErr := post("tools/call", map[string]any{"name": "run", "arguments": map[string]any{"wait_s": 30}, "task": map[string]any{"ttl": 1000}})
	task, _ := res["task"].(map[string]any)
	if rpcErr != nil || task["taskId"] != "ex_run" || task["status"] != "working" || task["ttl"] != float64(time.Hour.Milliseconds()) || task["pollInterval"] != float64(1000) || task["createdAt"] != "2026-07-28T10:00:00Z" {
		t.Fatalf("task-augmented call = %v, %v", res, rpcErr)
	}
	if got := string((*waits)[0]); got != "0" {
		t.Fatalf("the task-augmented call reached the tool with wait_s %s, want 0", got)
	}
	if _, rpcErr = post("tools/call", map[string]any{"name": "look", "task": map[string]any{}}); code(rpcErr) != -32601 {
		t.Fatalf("a task-augmented call of a tool without taskSupport = %v, want -32601", rpcErr)
	}
	if res, rpcErr = post("tools/call", map[string]any{"name": "look"}); rpcErr != nil || res["task"] != nil {
		t.Fatalf("a plain call = %v, %v, want the tool's result", res, rpcErr)
	}

	if res, _ = post("tasks/get", map[string]any{"taskId": "ex_old"}); res["status"] != "failed" || res["ttl"] != nil || res["pollInterval"] != nil {
		t.Fatalf("tasks/get of a failed task without retention = %v, want failed, ttl null, no pollInterval", res)
	}
	if _, rpcErr = post("tasks/get", map[string]any{"taskId": "ex_nobody"}); code(rpcErr) != -32602 {
		t.Fatalf("tasks/get of an unknown id = %v, want -32602", rpcErr)
	}
	res, _ = post("tasks/result", map[string]any{"taskId": "ex_done"})
	if meta, _ := res["_meta"].(map[string]any); meta[MetaRelatedTask].(map[string]any)["taskId"] != "ex_done" {
		t.Fatalf("tasks/result = %v, want the related-task _meta", res)
	}

	res, _ = post("tasks/list", map[string]any{})
	if tasks, _ := res["tasks"].([]any); len(tasks) != 2 || res["nextCursor"] != "after-ex_done" {
		t.Fatalf("tasks/list page 1 = %v", res)
	}
	res, _ = post("tasks/list", map[string]any{"cursor": "after-ex_done"})
	if tasks, _ := res["tasks"].([]any); len(tasks) != 1 || res["nextCursor"] != nil {
		t.Fatalf("tasks/list page 2 = %v", res)
	}
	if _, rpcErr = post("tasks/list", map[string]any{"cursor": "forged"}); code(rpcErr) != -32602 {
		t.Fatalf("tasks/list with a forged cursor = %v, want -32602", rpcErr)
	}

	if _, rpcErr = post("tasks/cancel", map[string]any{"taskId": "ex_done"}); code(rpcErr) != -32602 {
		t.Fatalf("tasks/cancel of a completed task = %v, want -32602", rpcErr)
	}
	if res, _ = post("tasks/cancel", map[string]any{"taskId": "ex_run"}); res["status"] != "cancelled" || len(be.cancelled) != 1 {
		t.Fatalf("tasks/cancel of a working task = %v (backend cancelled %v)", res, be.cancelled)
	}
}

// TestServerDirectedTaskKeepsTheResultMeta: with the tasks extension, a call whose execution
// is still going is answered with a task instead of the tool's result; the result's _meta
// (the approval offer the stdio bridge asks its user about) goes with it, not dropped.
func TestServerDirectedTaskKeepsTheResultMeta(t *testing.T) {
	at := time.Date(2026, 7, 28, 10, 0, 0, 0, time.UTC)
	be := &fakeBackend{execs: map[string]*Execution{
		"ex_run": {ID: "ex_run", Facts: Facts{State: "awaiting_approval"}, CreatedAt: at, UpdatedAt: at, Retention: time.Hour},
	}, order: []string{"ex_run"}}
	post, _ := protocolServer(t, be, "2026-07-28")
	res, rpcErr := post("tools/call", map[string]any{"name": "run", "arguments": map[string]any{}})
	if meta, _ := res["_meta"].(map[string]any); rpcErr != nil || res["resultType"] != "task" || res["taskId"] != "ex_run" || meta["test/meta"] != "kept" {
		t.Fatalf("tools/call declaring the extension = %v, %v; want a task with the result's _meta", res, rpcErr)
	}
}
