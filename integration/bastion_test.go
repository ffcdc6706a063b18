package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// testbed is a bastion with one enrolled hostagent ("h1").
type testbed struct {
	bastion *harness.Bastion
	host    *harness.Hostagent
	// proxy sits between the bastion and the hostagent (startFleetBehindProxy only).
	proxy *testutil.FaultProxy
}

func startFleet(t *testing.T, bastionConfig ...string) *testbed {
	t.Helper()
	return newFleet(t, fleetOptions{tables: bastionConfig})
}

// startFleetBehindProxy is startFleet with the bastion reaching "h1" through a fault proxy.
func startFleetBehindProxy(t *testing.T) *testbed {
	t.Helper()
	return newFleet(t, fleetOptions{proxy: true})
}

type fleetOptions struct {
	// proxy puts a fault proxy between the bastion and the hostagent.
	proxy bool
	// settings are top-level bastion config lines (key = value); tables are TOML tables.
	settings, tables []string
}

func newFleet(t *testing.T, opts fleetOptions) *testbed {
	t.Helper()
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey, append(opts.settings, opts.tables...)...)
	f := &testbed{bastion: b, host: h}
	addr := h.Addr
	if opts.proxy {
		f.proxy = testutil.StartFaultProxy(t, h.Addr)
		addr = f.proxy.Addr()
	}
	b.EnrollAt(t, "h1", addr, h)
	b.Start(t)
	f.logOnFailure(t)
	return f
}

// logOnFailure shows the bastion's and the hostagent's logs when the test fails.
func (f *testbed) logOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s\nhostagent log:\n%s", f.bastion.Logs(), f.host.Logs())
		}
	})
}

// session connects to the bastion over Streamable HTTP as actor, in agent run run ("" sends
// no Postern-Run header).
func (f *testbed) session(t *testing.T, actor, run string) *mcp.ClientSession {
	t.Helper()
	return f.bastion.Connect(t, actor, runHeader(run))
}

func runHeader(run string) http.Header {
	if run == "" {
		return nil
	}
	return http.Header{"Postern-Run": {run}}
}

// appendCommand appends a line to a file in dir: its line count is the number of times the
// command ran.
func appendCommand(t *testing.T, tag string) (cmd, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "effects")
	return "echo " + tag + " >> " + file + "; echo done", file
}

func effects(t *testing.T, file string) int {
	t.Helper()
	data, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// testContext is a context bounded for one end-to-end test.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// errToolError is a tool result that reports an error instead of an execution.
var errToolError = errors.New("tool error")

// callExecution calls an execution tool and returns the execution it reports. A tool error
// (the call was refused: no execution) is returned as an error wrapping errToolError with the
// result text; a command that failed on its host is an execution with is_error, not an error.
func callExecution(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (api.Execution, error) {
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, tool, args, &x)
	if err != nil {
		return x, err
	}
	if res.StructuredContent == nil {
		return x, fmt.Errorf("%w: %s", errToolError, harness.ResultText(res))
	}
	return x, nil
}

// mustCall is callExecution for calls that must return an execution.
func mustCall(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) api.Execution {
	t.Helper()
	x, err := callExecution(ctx, cs, tool, args)
	if err != nil {
		t.Fatalf("%s %v: %v", tool, args, err)
	}
	if x.ExecutionID == "" {
		t.Fatalf("%s %v: no execution id in %+v", tool, args, x)
	}
	return x
}

// mustRefuse calls a tool that must answer with a tool error and returns its text.
func mustRefuse(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	x, err := callExecution(ctx, cs, tool, args)
	if !errors.Is(err, errToolError) {
		t.Fatalf("%s %v = %+v, %v; want a tool error", tool, args, x, err)
	}
	return err.Error()
}

func statusOf(t *testing.T, ctx context.Context, cs *mcp.ClientSession, id string) api.Execution {
	t.Helper()
	return mustCall(t, ctx, cs, "execution_status", map[string]any{"execution_id": id})
}

// waitForState polls execution_status until the execution is in one of states.
func waitForState(t *testing.T, ctx context.Context, cs *mcp.ClientSession, id string, states ...string) api.Execution {
	t.Helper()
	var x api.Execution
	testutil.WaitFor(t, id+" to be "+strings.Join(states, " or "), func() bool {
		x = statusOf(t, ctx, cs, id)
		for _, s := range states {
			if x.State == s {
				return true
			}
		}
		return false
	})
	return x
}

// stdoutOffsetArg is the name of execution_output's stdout offset argument on the server of
// cs: stdout_offset, or offset on a bastion of the previous release (skew tests).
func stdoutOffsetArg(t *testing.T, ctx context.Context, cs *mcp.ClientSession) string {
	t.Helper()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range res.Tools {
		if raw, _ := json.Marshal(tl.InputSchema); tl.Name == "execution_output" && !strings.Contains(string(raw), `"stdout_offset"`) {
			return "offset"
		}
	}
	return "stdout_offset"
}

// followOutput reads an execution's stdout with execution_output from offset 0 until the
// execution ends, and returns its final view with the whole stdout.
func followOutput(t *testing.T, ctx context.Context, cs *mcp.ClientSession, id string) (api.Execution, string) {
	t.Helper()
	var out strings.Builder
	var offset int64
	offsetArg := stdoutOffsetArg(t, ctx, cs)
	for {
		x := mustCall(t, ctx, cs, "execution_output", map[string]any{"execution_id": id, offsetArg: offset, "wait_s": 10})
		if x.StdoutOffset > offset {
			t.Fatalf("execution_output from %d skipped to %d: %+v", offset, x.StdoutOffset, x)
		}
		out.WriteString(x.Stdout[offset-x.StdoutOffset:])
		offset = x.StdoutOffset + int64(len(x.Stdout))
		if markers.JournalGraph.Terminal(markers.State(x.State)) {
			return x, out.String()
		}
		if ctx.Err() != nil {
			t.Fatalf("%s did not end: %+v", id, x)
		}
	}
}

// listOf returns the caller's executions (executions_list).
func listOf(t *testing.T, ctx context.Context, cs *mcp.ClientSession) []*api.Execution {
	t.Helper()
	var out api.ListResult
	res, err := harness.CallTool(ctx, cs, "executions_list", map[string]any{"limit": 500}, &out)
	if err != nil || res.IsError {
		t.Fatalf("executions_list: %v %v", err, res)
	}
	return out.Executions
}

// operatorDetail reads an execution from the operator API (the journal's full record,
// actor and scope included, and its events).
func operatorDetail(t *testing.T, b *harness.Bastion, id string) api.ExecutionDetail {
	t.Helper()
	d, err := readOperatorDetail(b, id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// readOperatorDetail is operatorDetail for a goroutine that polls (it cannot fail the test).
func readOperatorDetail(b *harness.Bastion, id string) (api.ExecutionDetail, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", b.OperatorSocket)
	}}}
	defer hc.CloseIdleConnections()
	var d api.ExecutionDetail
	resp, err := hc.Get("http://operator/v1/executions/" + id)
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK || d.Record == nil {
		return d, fmt.Errorf("operator show %s: %s, %v", id, resp.Status, err)
	}
	return d, nil
}

// metric reads one series (name and labels as exposed, e.g.
// `postern_dedup_hits_total{by="fingerprint"}`) from the bastion's /metrics; 0 if absent.
func metric(t *testing.T, b *harness.Bastion, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + b.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return 0
}

// hostControl opens the hostagent's control subsystem over SSH (straight to the agent, not
// through any proxy), to read markers from the host's side.
func hostControl(t *testing.T, h *harness.Hostagent) *hostproto.ControlClient {
	t.Helper()
	cc, err := hostproto.DialControl(h.Dial(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// waitForRunningMarker waits until the host has exactly one marker in state running and
// returns it: the command has started on the host.
func waitForRunningMarker(t *testing.T, ctx context.Context, cc *hostproto.ControlClient) *hostproto.Marker {
	t.Helper()
	var m *hostproto.Marker
	testutil.WaitFor(t, "a running marker on the host", func() bool {
		page, _, err := cc.List(ctx, hostproto.ControlListQuery{State: hostproto.MarkerRunning})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 1 {
			m = page[0]
		}
		return m != nil
	})
	return m
}

func TestIdenticalCallsAreOneExecution(t *testing.T) {
	f := startFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, file := appendCommand(t, "once")
	cs := f.bastion.Connect(t, "agent", map[string][]string{"Postern-Run": {"run-1"}})

	var first, second api.Execution
	if _, err := harness.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 0}, &first); err != nil {
		t.Fatal(err)
	}
	if _, err := harness.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd}, &second); err != nil {
		t.Fatal(err)
	}
	if second.ExecutionID != first.ExecutionID || !second.Replayed {
		t.Fatalf("second call: %+v; want the first execution %s replayed", second, first.ExecutionID)
	}
	if second.State != "completed" || second.Stdout != "done\n" {
		t.Fatalf("second call: %+v; want completed with output", second)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1\n%s", n, f.bastion.Logs())
	}
}

// TestWhoAndWhenDecideANewExecution: the same command is a new intent for another actor, in
// another run, and in the same run once the first result was delivered.
func TestWhoAndWhenDecideANewExecution(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "again")
	args := map[string]any{"host": "h1", "command": cmd}
	agentRun1 := f.session(t, "agent", "run-1")

	first := mustCall(t, ctx, agentRun1, "ssh_exec", args)
	if first.State != "completed" || first.Replayed {
		t.Fatalf("first call = %+v; want a new, completed execution", first)
	}
	testutil.WaitFor(t, "the first result to be journaled as delivered", func() bool {
		return statusOf(t, ctx, agentRun1, first.ExecutionID).ResultDelivered
	})

	seen := map[string]bool{first.ExecutionID: true}
	for i, tc := range []struct {
		name, actor, run string
	}{
		{name: "another actor, same run", actor: "other", run: "run-1"},
		{name: "same actor, another run", actor: "agent", run: "run-2"},
		{name: "same actor and run after the result was delivered", actor: "agent", run: "run-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := mustCall(t, ctx, f.session(t, tc.actor, tc.run), "ssh_exec", args)
			if seen[x.ExecutionID] || x.Replayed || x.State != "completed" {
				t.Fatalf("call = %+v; want a new execution, completed (seen: %v)", x, seen)
			}
			seen[x.ExecutionID] = true
			if n, want := effects(t, file), i+2; n != want {
				t.Fatalf("command ran %d times; want %d", n, want)
			}
		})
	}
}
