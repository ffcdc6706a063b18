package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// TestIdempotencyKey: a client-made key finds its execution from any run of the same actor;
// the key with another request is refused before anything is dispatched, and so is the key
// from another principal (without naming the execution).
func TestIdempotencyKey(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "keyed")
	otherCmd, otherFile := appendCommand(t, "other-payload")
	keyed := func(command string) map[string]any {
		return map[string]any{"host": "h1", "command": command, "idempotency_key": "deploy-2026-07-22"}
	}

	first := mustCall(t, ctx, f.session(t, "agent", "run-a"), "ssh_exec", keyed(cmd))
	if first.State != "completed" || first.Replayed {
		t.Fatalf("first call = %+v; want a new execution, completed", first)
	}

	t.Run("same key and request from another run", func(t *testing.T) {
		x := mustCall(t, ctx, f.session(t, "agent", "run-b"), "ssh_exec", keyed(cmd))
		if x.ExecutionID != first.ExecutionID || !x.Replayed || x.State != "completed" || x.Stdout != "done\n" {
			t.Fatalf("call = %+v; want %s replayed with its result", x, first.ExecutionID)
		}
	})
	t.Run("same key, another command", func(t *testing.T) {
		dispatched := metric(t, f.bastion, "postern_executions_dispatched_total")
		msg := mustRefuse(t, ctx, f.session(t, "agent", "run-b"), "ssh_exec", keyed(otherCmd))
		if !strings.Contains(msg, "idempotency_key_reused") || !strings.Contains(msg, first.ExecutionID) {
			t.Fatalf("refusal %q; want idempotency_key_reused naming %s", msg, first.ExecutionID)
		}
		if n := metric(t, f.bastion, "postern_executions_dispatched_total"); n != dispatched {
			t.Fatalf("dispatches went from %v to %v; want nothing dispatched", dispatched, n)
		}
	})
	t.Run("same key, another actor of another principal", func(t *testing.T) {
		msg := mustRefuse(t, ctx, f.session(t, "other", "run-a"), "ssh_exec", keyed(cmd))
		if !strings.Contains(msg, "idempotency_key_held") || strings.Contains(msg, first.ExecutionID) {
			t.Fatalf("refusal %q; want idempotency_key_held, naming no execution", msg)
		}
	})

	if n := effects(t, file); n != 1 {
		t.Errorf("keyed command ran %d times; want 1", n)
	}
	if n := effects(t, otherFile); n != 0 {
		t.Errorf("the refused command ran %d times", n)
	}
	if list := listOf(t, ctx, f.session(t, "agent", "")); len(list) != 1 || list[0].ExecutionID != first.ExecutionID {
		t.Errorf("agent's executions = %+v; want only %s", list, first.ExecutionID)
	}
}

// TestChangedHostKeyIsRefused: the inventory pins another key than the one the host presents
// (re-keyed host, or someone in the middle). Nothing runs, and the execution says why.
func TestChangedHostKeyIsRefused(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cc := hostControl(t, f.host)
	cs := f.session(t, "agent", "run-rekey")
	// The pool holds a connection made with the enrolled key: it must not be reused either.
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "true"}); x.State != "completed" {
		t.Fatalf("warm-up = %+v", x)
	}
	if err := fleet.Enroll(config.DefaultConfig(f.bastion.StateDir()).InventoryPath(), fleet.Host{
		Name: "h1", Addr: f.host.Addr, Account: f.host.Account, HostKey: testutil.NewSSHKey(t).Public(),
	}); err != nil {
		t.Fatal(err)
	}

	cmd, file := appendCommand(t, "rekeyed")
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 30})
	// The handshake fails before anything is sent: provably no effect.
	if x.State != "failed" || !x.IsError {
		t.Fatalf("call = %+v; want failed", x)
	}
	if !strings.Contains(strings.Join(x.Evidence, "\n"), "host key") {
		t.Errorf("evidence %q does not mention the host key", x.Evidence)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("command ran %d times on a host with the wrong key", n)
	}
	if m := harness.Marker(t, ctx, cc, x.ExecutionID); m != nil {
		t.Fatalf("the host has a marker for it: %+v", m)
	}
}

// rawPost sends body to the bastion's MCP endpoint as a bare HTTP request with the given
// bearer token ("" sends none).
func rawPost(t *testing.T, b *harness.Bastion, token string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp.StatusCode, out.String()
}

func toolsCall(t *testing.T, args map[string]any) []byte {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "ssh_exec", "arguments": args},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestBadCallsAreRefusedAndNothingIsJournaled: every malformed, oversized, unauthenticated
// or invalid call gets a clear error and leaves no execution behind.
func TestBadCallsAreRefusedAndNothingIsJournaled(t *testing.T) {
	const maxCommand, maxBody = 1024, 8192
	f := newFleet(t, fleetOptions{settings: []string{
		"max_command_bytes = " + strconv.Itoa(maxCommand), "max_body_bytes = " + strconv.Itoa(maxBody),
	}})
	ctx := testContext(t)
	cs := f.session(t, "agent", "run-bad")
	cmd, file := appendCommand(t, "refused")
	with := func(extra map[string]any) map[string]any {
		args := map[string]any{"host": "h1", "command": cmd}
		for k, v := range extra {
			args[k] = v
		}
		return args
	}

	t.Run("tool errors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args map[string]any
			want string
		}{
			{name: "unknown host", args: with(map[string]any{"host": "nowhere"}), want: "unknown_host"},
			{name: "command over max_command_bytes", args: with(map[string]any{"command": cmd + "; #" + strings.Repeat("x", maxCommand)}), want: "invalid_argument"},
			{name: "empty command", args: with(map[string]any{"command": "  "}), want: "invalid_argument"},
			{name: "relative cwd", args: with(map[string]any{"cwd": "srv/app"}), want: "invalid_argument"},
			{name: "unclean cwd", args: with(map[string]any{"cwd": "/srv/../etc"}), want: "invalid_argument"},
			{name: "env name", args: with(map[string]any{"env": map[string]any{"1BAD": "x"}}), want: "invalid_argument"},
			{name: "env sets POSTERN_*", args: with(map[string]any{"env": map[string]any{"POSTERN_EXECUTION_ID": "ex_forged"}}), want: "invalid_argument"},
			{name: "negative timeout", args: with(map[string]any{"timeout_s": -1}), want: "invalid_argument"},
			{name: "wait_s over max_wait", args: with(map[string]any{"wait_s": 100000}), want: "invalid_argument"},
			{name: "run_id with spaces", args: with(map[string]any{"run_id": "a run"}), want: "invalid_argument"},
			{name: "timeout of the wrong type", args: with(map[string]any{"timeout_s": "soon"}), want: "timeout_s"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if msg := mustRefuse(t, ctx, cs, "ssh_exec", tc.args); !strings.Contains(msg, tc.want) {
					t.Fatalf("refusal %q; want it to contain %q", msg, tc.want)
				}
			})
		}
	})

	t.Run("HTTP refusals", func(t *testing.T) {
		valid := toolsCall(t, with(nil))
		for _, tc := range []struct {
			name  string
			token string
			body  []byte
			// wantStatus is the HTTP status; for 200, wantRPCError is the JSON-RPC error
			// code the body must carry.
			wantStatus   int
			wantRPCError int
		}{
			{name: "no token", token: "", body: valid, wantStatus: http.StatusUnauthorized},
			{name: "bad token", token: "pt_" + strings.Repeat("0", 43), body: valid, wantStatus: http.StatusUnauthorized},
			{name: "body over max_body_bytes", token: f.bastion.Tokens["agent"], body: toolsCall(t, with(map[string]any{"env": map[string]any{"PAD": strings.Repeat("x", maxBody)}})), wantStatus: http.StatusRequestEntityTooLarge},
			{name: "malformed JSON", token: f.bastion.Tokens["agent"], body: []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{`), wantStatus: http.StatusBadRequest},
		} {
			t.Run(tc.name, func(t *testing.T) {
				status, body := rawPost(t, f.bastion, tc.token, tc.body)
				if status == tc.wantStatus {
					return
				}
				// A JSON-RPC parse error in a 200 response is as clear as a 400.
				if tc.wantStatus == http.StatusBadRequest && status == http.StatusOK && strings.Contains(body, "-32700") {
					return
				}
				t.Fatalf("status %d, body %q; want %d", status, body, tc.wantStatus)
			})
		}
	})

	t.Run("go-sdk client with a bad token", func(t *testing.T) {
		hc := &http.Client{Transport: badBearer{}}
		c := mcp.NewClient(&mcp.Implementation{Name: "postern-test", Version: "0"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: f.bastion.URL, HTTPClient: hc, MaxRetries: -1}, nil)
		if err == nil {
			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "ssh_exec", Arguments: with(nil)})
			cs.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
			t.Fatalf("connect and call with a bad token: %v; want 401 Unauthorized", err)
		}
	})

	if n := effects(t, file); n != 0 {
		t.Errorf("a refused command ran %d times", n)
	}
	if list := listOf(t, ctx, cs); len(list) != 0 {
		t.Errorf("executions after refused calls: %+v; want none", list)
	}
	if n := metric(t, f.bastion, "postern_executions_accepted_total"); n != 0 {
		t.Errorf("bastion accepted %v executions; want 0", n)
	}
}

// badBearer authenticates with a token the bastion does not know.
type badBearer struct{}

func (badBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer pt_not-a-known-token")
	return http.DefaultTransport.RoundTrip(r)
}

// TestActorsSeeOnlyTheirOwnExecutions: another actor cannot read, follow or cancel an
// execution, nor learn that it exists.
func TestActorsSeeOnlyTheirOwnExecutions(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	agent := f.session(t, "agent", "run-mine")
	other := f.session(t, "other", "run-mine")
	x := mustCall(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "sleep 30", "wait_s": 0})
	defer mustCall(t, ctx, agent, "execution_cancel", map[string]any{"execution_id": x.ExecutionID})

	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{tool: "execution_status", args: map[string]any{"execution_id": x.ExecutionID}},
		{tool: "execution_output", args: map[string]any{"execution_id": x.ExecutionID, "wait_s": 0}},
		{tool: "execution_cancel", args: map[string]any{"execution_id": x.ExecutionID}},
		{tool: "execution_status", args: map[string]any{"execution_id": "ex_00000000000000000000000000"}},
		{tool: "execution_status", args: map[string]any{"execution_id": "../../etc/passwd"}},
	} {
		t.Run(tc.tool+" "+tc.args["execution_id"].(string), func(t *testing.T) {
			if msg := mustRefuse(t, ctx, other, tc.tool, tc.args); !strings.Contains(msg, "not_found") {
				t.Fatalf("refusal %q; want not_found", msg)
			}
		})
	}
	for _, e := range listOf(t, ctx, other) {
		if e.ExecutionID == x.ExecutionID {
			t.Fatalf("other's executions_list shows agent's %s", x.ExecutionID)
		}
	}
	if got := statusOf(t, ctx, agent, x.ExecutionID); got.State != "running" && got.State != "dispatched" {
		t.Fatalf("after other's cancel attempt agent's execution is %+v; want it still running", got)
	}
}

// TestLongCommandReturnsAHandle: a command that outlives wait_s comes back as running with
// its id, not as an error; execution_output follows it to the end.
func TestLongCommandReturnsAHandle(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cs := f.session(t, "agent", "run-long")
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ssh_exec", Arguments: map[string]any{"host": "h1", "command": "sleep 3; echo late", "wait_s": 1}})
	if err != nil {
		t.Fatal(err)
	}
	var x api.Execution
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &x); err != nil || res.IsError {
		t.Fatalf("result %s (is_error %v): %v; want an execution", raw, res.IsError, err)
	}
	// On a loaded machine the host's start confirmation may not be in yet: dispatched is
	// the same "still in progress" answer.
	if (x.State != "running" && x.State != "dispatched") || !markers.ValidExecutionID(x.ExecutionID) {
		t.Fatalf("after wait_s: %+v; want a running handle", x)
	}
	if !strings.Contains(harness.ResultText(res), "execution_output") {
		t.Errorf("text %q does not say how to follow it", harness.ResultText(res))
	}
	end, out := followOutput(t, ctx, cs, x.ExecutionID)
	if end.State != "completed" || out != "late\n" || end.ExitCode == nil || *end.ExitCode != 0 {
		t.Fatalf("followed to %+v, stdout %q; want completed with \"late\"", end, out)
	}
}

// TestCancelStopsTheCommand: execution_cancel ends a running command on its host and the
// execution says cancelled.
func TestCancelStopsTheCommand(t *testing.T) {
	cancelStopsTheCommand(t, testContext(t), startFleet(t))
}

// cancelStopsTheCommand is TestCancelStopsTheCommand on fleet f (TestSkew runs it across
// releases): the command started once, and is gone.
func cancelStopsTheCommand(t *testing.T, ctx context.Context, f *testbed) {
	cs := f.session(t, "agent", "run-cancel")
	dir := t.TempDir()
	started, pidFile := filepath.Join(dir, "started"), filepath.Join(dir, "pid")
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo x >> " + started + "; echo $$ > " + pidFile + "; exec sleep 30", "wait_s": 0})
	var pid int
	testutil.WaitFor(t, "the command to write its pid", func() bool {
		data, err := os.ReadFile(pidFile)
		if err != nil || !bytes.HasSuffix(data, []byte("\n")) {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil
	})

	got := mustCall(t, ctx, cs, "execution_cancel", map[string]any{"execution_id": x.ExecutionID})
	if got.ExecutionID != x.ExecutionID || got.State != "cancelled" {
		t.Fatalf("cancel = %+v; want cancelled", got)
	}
	testutil.WaitFor(t, "the cancelled process to be gone", func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
	if again := mustCall(t, ctx, cs, "execution_cancel", map[string]any{"execution_id": x.ExecutionID}); again.State != "cancelled" {
		t.Fatalf("second cancel = %+v; want it still cancelled", again)
	}
	if st := statusOf(t, ctx, cs, x.ExecutionID); st.State != "cancelled" {
		t.Fatalf("status = %+v; want cancelled", st)
	}
	ranOnce(t, started)
}
