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
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// These tests drive Postern with real MCP clients — the official TypeScript SDK (pinned in
// tsclient/package.json, installed by scripts/test) and curl — and count what ran on the
// host. A client that lost a result, gave up on it (timeout, AbortSignal) or restarted its
// stdio bridge and re-issues the call must get the same execution back, replayed; the command
// runs once.

// tsClientDir holds the TypeScript client and its node_modules.
const tsClientDir = "tsclient"

// tsLine is one line the TypeScript client prints per step.
type tsLine struct {
	Step      int            `json:"step"`
	Connected bool           `json:"connected"`
	Result    *api.Execution `json:"result"`
	// Text is the result's text content: what the model reads.
	Text    string `json:"text"`
	IsError bool   `json:"is_error"`
	Error   string `json:"error"`
	// Progress counts the progress notifications heard (reset_on_progress).
	Progress int `json:"progress"`
}

// tsCommand returns the node command that runs the TypeScript client's steps.
func tsCommand(t *testing.T, ctx context.Context, steps []map[string]any) *exec.Cmd {
	t.Helper()
	return tsScriptCommand(t, ctx, "call.mjs", steps)
}

// tsScriptCommand returns the node command that runs one of tsclient's scripts on steps.
func tsScriptCommand(t *testing.T, ctx context.Context, script string, steps []map[string]any) *exec.Cmd {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed (.ci/run installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(tsClientDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed: run `npm ci --prefix integration/tsclient` (scripts/test does): %v", err)
	}
	stepsJSON, err := json.Marshal(steps)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, script, string(stepsJSON))
	cmd.Dir = tsClientDir
	cmd.Stderr = testWriter{t}
	return cmd
}

// jsonLines decodes out, one JSON value of type T per line, as a TypeScript client script
// (named by who) prints its results.
func jsonLines[T any](t *testing.T, who string, out []byte) []T {
	t.Helper()
	var lines []T
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var l T
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s printed %q: %v", who, sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// runTS runs the TypeScript client to the end and returns its lines.
func runTS(t *testing.T, ctx context.Context, steps ...map[string]any) []tsLine {
	t.Helper()
	cmd := tsCommand(t, ctx, steps)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v; output:\n%s", err, out)
	}
	lines := jsonLines[tsLine](t, "TypeScript client", out)
	if len(lines) != len(steps) {
		t.Fatalf("TypeScript client printed %d lines for %d steps:\n%s", len(lines), len(steps), out)
	}
	return lines
}

// testWriter sends a child's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func httpConnect(f *testbed, run string) map[string]any {
	return map[string]any{"connect": map[string]any{"url": f.bastion.URL, "token": f.bastion.Tokens["agent"], "run": run}}
}

func stdioConnect(bin, socket string) map[string]any {
	return map[string]any{"connect": map[string]any{"command": bin, "args": []string{"mcp", "--socket", socket}}}
}

func sshExecStep(args map[string]any, opts map[string]any) map[string]any {
	step := map[string]any{"call": map[string]any{"name": "ssh_exec", "arguments": args}}
	for k, v := range opts {
		step[k] = v
	}
	return step
}

// waitForJournalState waits until the journal shows execution id in state.
func waitForJournalState(t *testing.T, b *harness.Bastion, id string, state markers.State) *markers.Record {
	t.Helper()
	var rec *markers.Record
	testutil.WaitFor(t, fmt.Sprintf("%s to be %s in the journal", id, state), func() bool {
		rec = journaled(t, b, id)
		return rec.State == state
	})
	return rec
}

// TestTSClientKilledWhileWaiting: the agent's HTTP client (the TypeScript SDK) is SIGKILLed
// while ssh_exec waits; the command ends; the journal must not call the result delivered, and
// the re-issue from a fresh client of the same run gets it replayed.
func TestTSClientKilledWhileWaiting(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 60}

	agent := tsCommand(t, ctx, []map[string]any{httpConnect(f, "ts-killed"), sshExecStep(args, nil)})
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	marker := waitForRunningMarker(t, ctx, hostControl(t, f.host))
	agent.Process.Signal(syscall.SIGKILL)
	agent.Wait()
	g.open(t)
	if rec := waitForJournalState(t, f.bastion, marker.ID, markers.Completed); rec.ResultDeliveredAt != nil {
		t.Fatalf("the result is journaled as delivered to a killed client: %+v", rec)
	}

	lines := runTS(t, ctx, httpConnect(f, "ts-killed"), sshExecStep(args, nil))
	if x := lines[1].Result; x == nil || x.ExecutionID != marker.ID || !x.Replayed || x.State != "completed" {
		t.Fatalf("re-issue = %+v; want %s completed, replayed", lines[1], marker.ID)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}

// TestTSClientGivesUpThenReissues: callTool with the SDK's timeout or an AbortSignal gives up
// on the call and sends notifications/cancelled; the agent then re-issues it. Whether the
// cancel came before the result was ready (the call in flight) or after it had reached the
// client's socket (a busy client: the bytes were received, the SDK had not looked yet), the
// re-issue gets the same execution, replayed, and the command runs once — over Streamable
// HTTP and through the stdio bridge.
func TestTSClientGivesUpThenReissues(t *testing.T) {
	f := startFleet(t)
	bin := harness.Binary(t, "postern")
	transports := map[string]func(run string) map[string]any{
		"http":  func(run string) map[string]any { return httpConnect(f, run) },
		"stdio": func(string) map[string]any { return stdioConnect(bin, f.bastion.Socket) },
	}
	giveUps := map[string]map[string]any{
		"timeout": {"timeout_ms": 700},
		"abort":   {"abort_after_ms": 700},
	}
	for tname, connect := range transports {
		for gname, giveUp := range giveUps {
			for _, when := range []string{"before delivery", "after delivery"} {
				name := tname + "/" + gname + "/" + strings.ReplaceAll(when, " ", "-")
				t.Run(name, func(t *testing.T) {
					ctx := testContext(t)
					cmd, file := appendCommand(t, name)
					opts := map[string]any{}
					for k, v := range giveUp {
						opts[k] = v
					}
					if when == "before delivery" {
						cmd = "sleep 1.5; " + cmd // still running when the client gives up
					} else {
						opts["hold_ms"] = 2500 // the result arrives; the SDK looks after its timer fired
					}
					args := map[string]any{"host": "h1", "command": cmd, "wait_s": 30}
					lines := runTS(t, ctx, connect(name), sshExecStep(args, opts), sshExecStep(args, nil))
					if lines[1].Error == "" {
						t.Fatalf("the first call did not give up: %+v", lines[1])
					}
					x := lines[2].Result
					if x == nil || !x.Replayed || x.State != "completed" {
						t.Fatalf("re-issue = %+v; want the first execution, completed and replayed", lines[2])
					}
					if n := effects(t, file); n != 1 {
						t.Fatalf("command ran %d times; want 1", n)
					}
					if when == "after delivery" {
						d := operatorDetail(t, f.bastion, x.ExecutionID)
						var revoked bool
						for _, ev := range d.Events {
							revoked = revoked || ev.Kind == markers.KindDeliveryRevoked
						}
						if !revoked {
							t.Errorf("no delivery_revoked event in the journal of %s", x.ExecutionID)
						}
					}
				})
			}
		}
	}
}

// TestStdioBridgeRestartedFromAnotherBinary: the agent process (the TypeScript client)
// launches `postern mcp`, gives up on a call, closes the bridge and launches another build of
// it (a copy at another path, as after an in-place upgrade or with `go run`), then re-issues
// the call: same agent process, same scope, the same execution replayed.
func TestStdioBridgeRestartedFromAnotherBinary(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	bin := harness.Binary(t, "postern")
	copyBin := filepath.Join(t.TempDir(), "postern-upgraded")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyBin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd, file := appendCommand(t, "bridge")
	args := map[string]any{"host": "h1", "command": "sleep 1; " + cmd, "wait_s": 30}
	lines := runTS(t, ctx,
		stdioConnect(bin, f.bastion.Socket),
		sshExecStep(args, map[string]any{"timeout_ms": 300}),
		map[string]any{"close": true},
		stdioConnect(copyBin, f.bastion.Socket),
		sshExecStep(args, nil),
	)
	if lines[1].Error == "" {
		t.Fatalf("the first call did not time out: %+v", lines[1])
	}
	if x := lines[4].Result; x == nil || !x.Replayed || x.State != "completed" {
		t.Fatalf("re-issue through the other bridge = %+v; want the first execution, completed and replayed", lines[4])
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}

// TestCurlKilledWhileWaiting: a raw HTTP client (curl) posts tools/call and is SIGKILLed
// while the command runs; the re-issue, by a fresh curl of the same run, is the same
// execution replayed.
func TestCurlKilledWhileWaiting(t *testing.T) {
	curlBin, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl is not installed: %v", err)
	}
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": g.cmd, "wait_s": 60}}})
	if err != nil {
		t.Fatal(err)
	}
	curl := func() *exec.Cmd {
		return exec.CommandContext(ctx, curlBin, "-sS", "-N", "--max-time", "50", f.bastion.URL,
			"-H", "Authorization: Bearer "+f.bastion.Tokens["agent"],
			"-H", "Postern-Run: curl-run",
			"-H", "Content-Type: application/json",
			"-H", "Accept: application/json, text/event-stream",
			"-H", "Mcp-Protocol-Version: 2025-06-18",
			"--data-binary", string(body))
	}
	first := curl()
	first.Stderr = testWriter{t}
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	marker := waitForRunningMarker(t, ctx, hostControl(t, f.host))
	first.Process.Signal(syscall.SIGKILL)
	first.Wait()
	g.open(t)
	if rec := waitForJournalState(t, f.bastion, marker.ID, markers.Completed); rec.ResultDeliveredAt != nil {
		t.Fatalf("the result is journaled as delivered to a killed curl: %+v", rec)
	}

	again := curl()
	again.Stderr = testWriter{t}
	out, err := again.Output()
	if err != nil {
		t.Fatalf("curl re-issue: %v: %s", err, out)
	}
	x := sseResult(t, out)
	if x.ExecutionID != marker.ID || !x.Replayed || x.State != "completed" {
		t.Fatalf("curl re-issue = %+v; want %s completed, replayed", x, marker.ID)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	testutil.WaitFor(t, "the replayed result to be journaled as delivered to the live curl", func() bool {
		return journaled(t, f.bastion, marker.ID).ResultDeliveredAt != nil
	})
}

// sseResult decodes the execution of the tools/call response in a Streamable HTTP body (an
// SSE stream or plain JSON).
func sseResult(t *testing.T, body []byte) api.Execution {
	t.Helper()
	var msg struct {
		Result struct {
			StructuredContent *api.Execution `json:"structuredContent"`
		} `json:"result"`
	}
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "data:")
		if !ok && strings.HasPrefix(strings.TrimSpace(line), "{") {
			data, ok = line, true
		}
		if !ok || json.Unmarshal([]byte(strings.TrimSpace(data)), &msg) != nil || msg.Result.StructuredContent == nil {
			continue
		}
		return *msg.Result.StructuredContent
	}
	t.Fatalf("no tool result in the response:\n%s", body)
	return api.Execution{}
}

// rawPoster returns send, which posts one JSON-RPC message to b as the agent of run
// "raw-run" and returns the response body (safe off the test goroutine), and post, send for
// the test goroutine.
func rawPoster(t *testing.T, ctx context.Context, b *harness.Bastion) (send func(map[string]any) ([]byte, error), post func(map[string]any) []byte) {
	send = func(msg map[string]any) ([]byte, error) {
		body, err := json.Marshal(msg)
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		for k, v := range map[string]string{"Authorization": "Bearer " + b.Tokens["agent"], "Postern-Run": "raw-run",
			"Content-Type": "application/json", "Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": "2025-06-18"} {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode/100 != 2 {
			err = fmt.Errorf("POST %s: %s: %s", msg["method"], resp.Status, out)
		}
		return out, err
	}
	post = func(msg map[string]any) []byte {
		t.Helper()
		out, err := send(msg)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	return send, post
}

// TestCancelOvertakenByReissue: over Streamable HTTP a client's notifications/cancelled is a
// POST of its own, and the re-issue that follows an abort can reach the bastion first. The
// re-issue waits out delivery_settle, the cancel revokes the delivery meanwhile, and the
// re-issue gets the first execution back: one effect. Raw HTTP, as any client sends it.
func TestCancelOvertakenByReissue(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "overtaken")
	send, post := rawPoster(t, ctx, f.bastion)
	call := func(id int) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
			"params": map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": cmd, "wait_s": 30}}}
	}
	first := sseResult(t, post(call(1)))
	if first.State != "completed" {
		t.Fatalf("first call = %+v; want completed", first)
	}
	testutil.WaitFor(t, "the first result to be journaled as delivered", func() bool {
		return journaled(t, f.bastion, first.ExecutionID).ResultDeliveredAt != nil
	})
	// The client gave up on call 1 after all; its re-issue leaves first, its cancel after.
	type answer struct {
		body []byte
		err  error
	}
	reissued := make(chan answer, 1)
	go func() {
		body, err := send(call(2))
		reissued <- answer{body, err}
	}()
	time.Sleep(100 * time.Millisecond) // the order of two sends, not a timing assertion
	post(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": 1, "reason": "timeout"}})
	a := <-reissued
	if a.err != nil {
		t.Fatalf("re-issue: %v", a.err)
	}
	again := sseResult(t, a.body)
	if again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Fatalf("re-issue = %s (replayed %v); want %s replayed: the cancel came within delivery_settle", again.ExecutionID, again.Replayed, first.ExecutionID)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}
