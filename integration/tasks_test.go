package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// These tests drive MCP tasks with the official TypeScript SDK's tasks client
// (tsclient/tasks.mjs, client.experimental.tasks): a task is an execution, answered from the
// journal, so it survives a SIGKILL of the bastion.

// tsTaskLine is one line tasks.mjs prints per step.
type tsTaskLine struct {
	Step        int                `json:"step"`
	Connected   bool               `json:"connected"`
	Task        *tsTask            `json:"task"`
	Tasks       []tsTask           `json:"tasks"`
	NextCursor  string             `json:"next_cursor"`
	TaskCaps    json.RawMessage    `json:"tasks_capability"`
	TaskSupport map[string]*string `json:"task_support"`
	Statuses    []string           `json:"statuses"`
	Result      *api.Execution     `json:"result"`
	IsError     bool               `json:"is_error"`
	Text        string             `json:"text"`
	Meta        map[string]any     `json:"meta"`
	Progress    []string           `json:"progress"`
	Error       string             `json:"error"`
	Code        *int               `json:"code"`
	raw         json.RawMessage
}

type tsTask struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           *int64 `json:"ttl"`
	PollInterval  int64  `json:"pollInterval"`
}

// runTSTasks runs tasks.mjs to the end and returns its lines.
func runTSTasks(t *testing.T, ctx context.Context, steps ...map[string]any) []tsTaskLine {
	t.Helper()
	out, err := tsScriptCommand(t, ctx, "tasks.mjs", steps).Output()
	if err != nil {
		t.Fatalf("TypeScript tasks client: %v; output:\n%s", err, out)
	}
	var lines []tsTaskLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l tsTaskLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("TypeScript tasks client printed %q: %v", sc.Text(), err)
		}
		l.raw = append(json.RawMessage(nil), sc.Bytes()...)
		lines = append(lines, l)
	}
	if len(lines) != len(steps) {
		t.Fatalf("TypeScript tasks client printed %d lines for %d steps:\n%s", len(lines), len(steps), out)
	}
	for _, l := range lines {
		t.Logf("ts: %s", l.raw)
	}
	return lines
}

func taskStep(args map[string]any) map[string]any {
	return map[string]any{"task": map[string]any{"name": "ssh_exec", "arguments": args}, "ttl": 60000}
}

// TestTSTasksSurviveRestart: a task-augmented ssh_exec returns a task at once (its id the
// execution id); a retry of the same call joins it (same task id); the bastion is SIGKILLed
// while the command runs and restarted; tasks/get and tasks/result still answer, with the
// same result on every tasks/result; tasks/list lists it; the command ran once. Another
// actor cannot see the task.
func TestTSTasksSurviveRestart(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	args := map[string]any{"host": "h1", "command": g.cmd}
	conn := httpConnect(f, "ts-tasks")

	first := runTSTasks(t, ctx, conn, map[string]any{"capabilities": true}, taskStep(args), taskStep(args))
	if got := first[1].TaskSupport["ssh_exec"]; got == nil || *got != "optional" {
		t.Fatalf("ssh_exec's execution.taskSupport = %v, want optional", got)
	}
	var caps struct {
		List     *struct{} `json:"list"`
		Cancel   *struct{} `json:"cancel"`
		Requests struct {
			Tools struct {
				Call *struct{} `json:"call"`
			} `json:"tools"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(first[1].TaskCaps, &caps); err != nil || caps.List == nil || caps.Cancel == nil || caps.Requests.Tools.Call == nil {
		t.Fatalf("capabilities.tasks = %s (%v), want list, cancel and requests.tools.call", first[1].TaskCaps, err)
	}
	created := first[2].Task
	if created == nil || !markers.ValidExecutionID(created.TaskID) || created.Status != "working" || created.TTL == nil || created.PollInterval <= 0 {
		t.Fatalf("task-augmented call returned %s, want a working task named by an execution id, with ttl and pollInterval", first[2].raw)
	}
	if again := first[3].Task; again == nil || again.TaskID != created.TaskID {
		t.Fatalf("the retried task-augmented call returned %s, want the same task %s", first[3].raw, created.TaskID)
	}
	id := created.TaskID
	waitForRunningMarker(t, ctx, hostControl(t, f.host))

	f.bastion.Kill(t)
	g.open(t) // the command ends while the bastion is down
	f.bastion.Start(t)

	// The client stays connected until the bastion has judged its tasks/result responses
	// delivered: an agent that exits the instant it has read a result may be judged "not
	// delivered" (safe: a retry replays it), which is not what this test is about.
	delivered := filepath.Join(t.TempDir(), "delivered")
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Go(func() {
		for watchCtx.Err() == nil {
			if d, err := readOperatorDetail(f.bastion, id); err == nil && d.Record.ResultDeliveredAt != nil {
				os.WriteFile(delivered, nil, 0o600)
				return
			}
			sleepCtx(watchCtx, 50*time.Millisecond)
		}
	})
	second := runTSTasks(t, ctx, conn,
		map[string]any{"get": id},
		map[string]any{"result": id},
		map[string]any{"result": id},
		map[string]any{"list": true},
		map[string]any{"wait_for": delivered},
	)
	stopWatch()
	watch.Wait()
	if got := second[1].Task; got == nil || got.Status != "completed" || got.TaskID != id {
		t.Fatalf("tasks/get after the restart = %s, want %s completed", second[1].raw, id)
	}
	res := second[2]
	if res.Result == nil || res.Result.ExecutionID != id || res.Result.State != "completed" || res.Result.Stdout != "done\n" || res.IsError {
		t.Fatalf("tasks/result = %s, want the completed execution with its output", res.raw)
	}
	if rel, _ := res.Meta["io.modelcontextprotocol/related-task"].(map[string]any); rel["taskId"] != id {
		t.Fatalf("tasks/result _meta = %v, want the related task %s", res.Meta, id)
	}
	if a, b := stripStep(t, second[2].raw), stripStep(t, second[3].raw); a != b {
		t.Fatalf("tasks/result answered differently the second time:\n%s\n%s", a, b)
	}
	if !listed(second[4].Tasks, id) {
		t.Fatalf("tasks/list = %s, want it to list %s", second[4].raw, id)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
	if journaled(t, f.bastion, id).ResultDeliveredAt == nil {
		t.Fatalf("the result tasks/result returned is not journaled as delivered")
	}

	// Another actor: the task does not exist for it.
	other := map[string]any{"connect": map[string]any{"url": f.bastion.URL, "token": f.bastion.Tokens["other"]}}
	theirs := runTSTasks(t, ctx, other, map[string]any{"get": id}, map[string]any{"result": id}, map[string]any{"list": true})
	for _, l := range theirs[1:3] {
		if l.Error == "" || l.Code == nil || *l.Code != -32602 {
			t.Fatalf("another actor's tasks/get or tasks/result = %s, want -32602 (not found)", l.raw)
		}
	}
	if listed(theirs[3].Tasks, id) {
		t.Fatalf("another actor's tasks/list shows %s: %s", id, theirs[3].raw)
	}
}

// TestTSTasksCancelAndStream: tasks/cancel stops a running task's command (TERM on its host;
// it never has its effect) and a second cancel of the now terminal task is refused
// (-32602); callToolStream drives a task to its result.
func TestTSTasksCancelAndStream(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	conn := httpConnect(f, "ts-tasks-cancel")
	quick, quickFile := appendCommand(t, "streamed")

	lines := runTSTasks(t, ctx, conn, taskStep(map[string]any{"host": "h1", "command": g.cmd}),
		map[string]any{"stream": map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": quick}}})
	id := lines[1].Task.TaskID
	if s := lines[2]; s.Result == nil || s.Result.State != "completed" || s.Task == nil || s.Task.TaskID != s.Result.ExecutionID {
		t.Fatalf("callToolStream = %s, want its task's completed result", s.raw)
	}
	waitForRunningMarker(t, ctx, hostControl(t, f.host))

	cancelled := runTSTasks(t, ctx, conn, map[string]any{"cancel": id}, map[string]any{"cancel": id}, map[string]any{"result": id})
	if got := cancelled[1].Task; got == nil || got.Status != "cancelled" {
		t.Fatalf("tasks/cancel = %s, want cancelled", cancelled[1].raw)
	}
	if l := cancelled[2]; l.Code == nil || *l.Code != -32602 {
		t.Fatalf("a second tasks/cancel = %s, want -32602 (already terminal)", l.raw)
	}
	if r := cancelled[3].Result; r == nil || r.State != "cancelled" {
		t.Fatalf("tasks/result of the cancelled task = %s", cancelled[3].raw)
	}
	g.open(t)
	if n := effects(t, g.file); n != 0 {
		t.Fatalf("the cancelled command had its effect %d times", n)
	}
	if n := effects(t, quickFile); n != 1 {
		t.Fatalf("the streamed command ran %d times, want 1", n)
	}

	// The same through the stdio bridge (`postern mcp`), as the README shows it.
	bridged, bridgedFile := appendCommand(t, "bridged")
	viaBridge := runTSTasks(t, ctx, stdioConnect(harness.Binary(t, "postern"), f.bastion.Socket),
		map[string]any{"capabilities": true},
		map[string]any{"stream": map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": bridged}}})
	if got := viaBridge[1].TaskSupport["ssh_exec"]; got == nil || *got != "optional" {
		t.Fatalf("through the bridge, ssh_exec's taskSupport = %v", got)
	}
	if s := viaBridge[2]; s.Result == nil || s.Result.State != "completed" || s.Task == nil || s.Task.TaskID != s.Result.ExecutionID {
		t.Fatalf("callToolStream through the bridge = %s, want its task's completed result", s.raw)
	}
	if n := effects(t, bridgedFile); n != 1 {
		t.Fatalf("the bridged command ran %d times, want 1", n)
	}
}

func listed(ts []tsTask, id string) bool {
	for _, x := range ts {
		if x.TaskID == id {
			return true
		}
	}
	return false
}

// stripStep returns a line without its step number, for comparing two answers.
func stripStep(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "step")
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// extPost sends one JSON-RPC request at protocol 2026-07-28 (the stateless protocol: the
// _meta triple and the routing headers) and returns its result; caps are the request's
// client capabilities.
func extPost(t *testing.T, f *testbed, method, name string, params map[string]any, caps map[string]any) map[string]any {
	t.Helper()
	res, rpcErr, err := extCall(t.Context(), f, method, name, params, caps)
	switch {
	case err != nil:
		t.Fatal(err)
	case rpcErr != nil:
		t.Fatalf("%s: error %v", method, rpcErr)
	}
	return res
}

// extCall is extPost under ctx, returning the JSON-RPC error instead of failing on it.
func extCall(ctx context.Context, f *testbed, method, name string, params map[string]any, caps map[string]any) (result, rpcErr map[string]any, err error) {
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw", "version": "0"},
		"io.modelcontextprotocol/clientCapabilities": caps,
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.bastion.URL, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+f.bastion.Tokens["agent"])
	req.Header.Set("Postern-Run", "ext-run")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "data:")
		if !ok && strings.HasPrefix(strings.TrimSpace(line), "{") {
			data, ok = line, true
		}
		var msg struct {
			Result map[string]any `json:"result"`
			Error  map[string]any `json:"error"`
		}
		if !ok || json.Unmarshal([]byte(strings.TrimSpace(data)), &msg) != nil {
			continue
		}
		if msg.Error != nil || msg.Result != nil {
			return msg.Result, msg.Error, nil
		}
	}
	return nil, nil, fmt.Errorf("%s: no result in HTTP %d:\n%s", method, resp.StatusCode, out)
}

// TestTaskResultWaitsAreBoundedPerActor: a tasks/result waits until its execution ends,
// which may be days, so one actor's waits at once are bounded; one past the bound is refused
// at once, and the waits that were let in all get the result once the command ends (which
// ran once).
func TestTaskResultWaitsAreBoundedPerActor(t *testing.T) {
	f := startFleet(t)
	g := newGatedCommand(t)
	ext := map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}
	task := extPost(t, f, "tools/call", "ssh_exec", map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}}, ext)
	id, _ := task["taskId"].(string)
	if task["resultType"] != "task" {
		t.Fatalf("tools/call = %v, want a task", task)
	}
	const bound = 64 // maxTaskWaitsPerActor
	results := make(chan map[string]any, bound)
	var waits sync.WaitGroup
	for range bound {
		waits.Go(func() {
			for {
				res, rpcErr, err := extCall(t.Context(), f, "tasks/result", "", map[string]any{"taskId": id}, ext)
				if msg, _ := rpcErr["message"].(string); strings.Contains(msg, "too_many_waits") {
					time.Sleep(50 * time.Millisecond) // a probe below holds a slot for a moment
					continue
				}
				if err != nil || rpcErr != nil {
					t.Errorf("tasks/result within the bound: %v %v", err, rpcErr)
				}
				results <- res
				return
			}
		})
	}
	// A probe either is refused (the bound is taken) or waits, and then gives up after a
	// moment, which frees its slot (for a wait above that was refused meanwhile).
	testutil.WaitFor(t, "a tasks/result past the bound is refused", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, rpcErr, err := extCall(ctx, f, "tasks/result", "", map[string]any{"taskId": id}, ext)
		msg, _ := rpcErr["message"].(string)
		return err == nil && strings.Contains(msg, "too_many_waits")
	})
	g.open(t)
	waits.Wait()
	close(results)
	for res := range results {
		if sc, _ := res["structuredContent"].(map[string]any); sc["state"] != "completed" {
			t.Fatalf("tasks/result = %v, want the completed execution", res)
		}
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
}

// TestTasksExtension: on protocol 2026-07-28 the server offers the
// io.modelcontextprotocol/tasks extension; a call that declares it and whose execution is
// still going gets a task (resultType "task"), a call that does not gets the running handle
// of the same execution, and tasks/get carries the result inline once it completed.
func TestTasksExtension(t *testing.T) {
	f := startFleet(t)
	g := newGatedCommand(t)
	ext := map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}

	disc := extPost(t, f, "server/discover", "", map[string]any{}, map[string]any{})
	caps, _ := disc["capabilities"].(map[string]any)
	if exts, _ := caps["extensions"].(map[string]any); exts["io.modelcontextprotocol/tasks"] == nil {
		t.Fatalf("server/discover capabilities = %v, want the tasks extension", caps)
	}
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}
	task := extPost(t, f, "tools/call", "ssh_exec", map[string]any{"name": "ssh_exec", "arguments": args}, ext)
	id, _ := task["taskId"].(string)
	if task["resultType"] != "task" || !markers.ValidExecutionID(id) || task["status"] != "working" || task["ttlSeconds"] == nil {
		t.Fatalf("tools/call declaring the extension = %v, want a working task", task)
	}
	plain := extPost(t, f, "tools/call", "ssh_exec", map[string]any{"name": "ssh_exec", "arguments": args}, map[string]any{})
	if sc, _ := plain["structuredContent"].(map[string]any); sc["execution_id"] != id || plain["resultType"] == "task" {
		t.Fatalf("tools/call without the extension = %v, want the running execution %s", plain, id)
	}
	g.open(t)
	var got map[string]any
	testutil.WaitFor(t, "the task completed", func() bool {
		got = extPost(t, f, "tasks/get", id, map[string]any{"taskId": id}, ext)
		return got["status"] == "completed"
	})
	res, _ := got["result"].(map[string]any)
	sc, _ := res["structuredContent"].(map[string]any)
	if got["resultType"] != "complete" || sc["state"] != "completed" || sc["stdout"] != "done\n" {
		t.Fatalf("tasks/get of the completed task = %v, want its result inline", got)
	}
	if ack := extPost(t, f, "tasks/cancel", id, map[string]any{"taskId": id}, ext); ack["resultType"] != "complete" {
		t.Fatalf("tasks/cancel = %v, want an acknowledgement", ack)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
}

// TestTSTasksResultProgress: tasks/result blocks while the command runs and reports its
// status — when it starts waiting, and each change — as progress notifications on its
// stream (the request's progress token), then returns the result.
func TestTSTasksResultProgress(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	created := runTSTasks(t, ctx, httpConnect(f, "ts-progress"), taskStep(map[string]any{"host": "h1", "command": g.cmd}))
	id := created[1].Task.TaskID
	waitForRunningMarker(t, ctx, hostControl(t, f.host))

	cmd := tsScriptCommand(t, ctx, "tasks.mjs", []map[string]any{httpConnect(f, "ts-progress"), {"result": id, "progress": true}})
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	for _, want := range []string{`"connected":true`, `"progress_event":`} {
		if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, want) {
			t.Fatalf("TypeScript tasks client printed %q (%v), want %s", line, err, want)
		}
	}
	g.open(t) // tasks/result is waiting: it reported the running status
	rest, err := io.ReadAll(r)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("TypeScript tasks client: %v\n%s", err, rest)
	}
	lines := strings.Split(strings.TrimSpace(string(rest)), "\n")
	var res tsTaskLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatal(err)
	}
	if res.Result == nil || res.Result.State != "completed" || len(res.Progress) == 0 || !strings.Contains(res.Progress[len(res.Progress)-1], "completed") {
		t.Fatalf("tasks/result = %s, want the completed result after progress notifications ending in completed", lines[len(lines)-1])
	}
}

// TestTSTasksThroughBridgeAcrossRestart: one agent process, through its stdio bridge, creates
// a task; the bastion is SIGKILLed and restarted under it; the same client, through the same
// bridge, gets the task's status and result.
func TestTSTasksThroughBridgeAcrossRestart(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	restarted := filepath.Join(t.TempDir(), "restarted")
	cmd := tsScriptCommand(t, ctx, "tasks.mjs", []map[string]any{
		stdioConnect(harness.Binary(t, "postern"), f.bastion.Socket),
		taskStep(map[string]any{"host": "h1", "command": g.cmd}),
		{"wait_for": restarted},
		{"get": "$last"},
		{"result": "$last"},
	})
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	var created tsTaskLine
	for created.Task == nil {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("TypeScript tasks client ended early: %v", err)
		}
		json.Unmarshal([]byte(line), &created)
	}
	id := created.Task.TaskID
	waitForRunningMarker(t, ctx, hostControl(t, f.host))
	f.bastion.Kill(t)
	g.open(t)
	f.bastion.Start(t)
	if err := os.WriteFile(restarted, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("TypeScript tasks client: %v\n%s", err, rest)
	}
	var got, res tsTaskLine
	lines := strings.Split(strings.TrimSpace(string(rest)), "\n")
	if len(lines) != 3 || json.Unmarshal([]byte(lines[1]), &got) != nil || json.Unmarshal([]byte(lines[2]), &res) != nil {
		t.Fatalf("TypeScript tasks client printed:\n%s", rest)
	}
	if got.Task == nil || got.Task.TaskID != id || got.Task.Status != "completed" {
		t.Fatalf("after the restart, through the same bridge, tasks/get = %s; want %s completed", lines[1], id)
	}
	if res.Result == nil || res.Result.ExecutionID != id || res.Result.Stdout != "done\n" {
		t.Fatalf("after the restart, through the same bridge, tasks/result = %s", lines[2])
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
}
