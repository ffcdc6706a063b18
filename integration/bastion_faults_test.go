package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// gatedCommand appends a line to a file once gate exists: the test decides when the command
// may finish, so no step depends on how fast the machine is.
type gatedCommand struct {
	cmd, gate, file string
}

func newGatedCommand(t *testing.T) gatedCommand {
	t.Helper()
	dir := t.TempDir()
	g := gatedCommand{gate: filepath.Join(dir, "gate"), file: filepath.Join(dir, "effects")}
	// The loop also ends when the test's temp dir is gone, so a command the test left
	// behind never spins forever.
	g.cmd = "while [ ! -e " + g.gate + " ] && [ -d " + dir + " ]; do sleep 0.05; done; echo x >> " + g.file + "; echo done"
	return g
}

func (g gatedCommand) open(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(g.gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// callOutcome is what a call made in another goroutine returned.
type callOutcome struct {
	x   api.Execution
	err error
}

// journaled reads the record from the operator API: reading it there does not count as
// delivering a result (execution_status would).
func journaled(t *testing.T, b *harness.Bastion, id string) *markers.Record {
	t.Helper()
	return operatorDetail(t, b, id).Record
}

func hasEvidence(rec *markers.Record, substr string) bool {
	for _, e := range rec.Evidence {
		if strings.Contains(e, substr) {
			return true
		}
	}
	return false
}

// TestLostMCPResponseIsReplayed: the agent's connection to the bastion goes away after the
// call was sent and before its response; the agent re-issues it with a new JSON-RPC id (a new
// session) and gets the same execution — attached while it runs, or its stored result once
// it ended — and the command runs once.
func TestLostMCPResponseIsReplayed(t *testing.T) {
	for _, tc := range []struct {
		name string
		// viaProxy: the connection is cut by a TCP proxy in front of the bastion; otherwise
		// the client abandons the request (its context is cancelled).
		viaProxy bool
		// endBeforeRetry: the command ends (unseen by anyone) before the retry arrives.
		endBeforeRetry bool
	}{
		{name: "client gives up, retry attaches", viaProxy: false, endBeforeRetry: false},
		{name: "client gives up, retry replays the stored result", viaProxy: false, endBeforeRetry: true},
		{name: "connection cut, retry attaches", viaProxy: true, endBeforeRetry: false},
		{name: "connection cut, retry replays the stored result", viaProxy: true, endBeforeRetry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t)
			ctx := testContext(t)
			cc := hostControl(t, f.host)
			g := newGatedCommand(t)
			args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 30}

			hc := f.bastion.HTTPClient("agent", runHeader("run-lost"), nil)
			url := f.bastion.URL
			var proxy *testutil.FaultProxy
			if tc.viaProxy {
				proxy = testutil.StartFaultProxy(t, f.bastion.Addr)
				url = "http://" + proxy.Addr() + bastion.MCPPath
			}
			first := harness.ConnectMCP(t, url, hc, nil)
			callCtx, abandon := context.WithCancel(ctx)
			defer abandon()
			lost := make(chan error, 1)
			go func() {
				_, err := callExecution(callCtx, first, "ssh_exec", args)
				lost <- err
			}()
			marker := waitForRunningMarker(t, ctx, cc)
			if tc.viaProxy {
				proxy.Cut()
			} else {
				abandon()
			}
			if err := <-lost; err == nil {
				t.Fatal("the interrupted call returned a result; want an error")
			}
			if rec := journaled(t, f.bastion, marker.ID); rec.ResultDeliveredAt != nil {
				t.Fatalf("journal says the lost result was delivered: %+v", rec)
			}

			if tc.endBeforeRetry {
				g.open(t)
				testutil.WaitFor(t, "the command to complete unseen", func() bool {
					return journaled(t, f.bastion, marker.ID).State == markers.Completed
				})
				if rec := journaled(t, f.bastion, marker.ID); rec.ResultDeliveredAt != nil {
					t.Fatalf("completed with nobody listening, yet journaled as delivered: %+v", rec)
				}
			}
			retried := make(chan callOutcome, 1)
			retrySession := f.session(t, "agent", "run-lost")
			go func() {
				x, err := callExecution(ctx, retrySession, "ssh_exec", args)
				retried <- callOutcome{x, err}
			}()
			if !tc.endBeforeRetry {
				// Let the command end only once the retry has joined the execution.
				testutil.WaitFor(t, "the retry to join", func() bool {
					return metric(t, f.bastion, `postern_dedup_hits_total{by="fingerprint"}`) >= 1
				})
				g.open(t)
			}
			got := <-retried
			if got.err != nil {
				t.Fatal(got.err)
			}
			retry := got.x
			if retry.ExecutionID != marker.ID || !retry.Replayed || retry.State != "completed" || retry.Stdout != "done\n" {
				t.Fatalf("retry = %+v; want %s completed, replayed, with its output", retry, marker.ID)
			}
			if n := effects(t, g.file); n != 1 {
				t.Fatalf("command ran %d times; want 1", n)
			}
			testutil.WaitFor(t, "the replayed result to be journaled as delivered", func() bool {
				return journaled(t, f.bastion, marker.ID).ResultDeliveredAt != nil
			})
		})
	}
}

// TestHostConnectionCutAfterStart: the bastion's SSH connection to the host drops while the
// command runs. The bastion asks the host, finds the marker, attaches, and the waiting call
// gets the outcome; nothing runs twice.
func TestHostConnectionCutAfterStart(t *testing.T) {
	hostConnectionCutAfterStart(t, testContext(t), startFleetBehindProxy(t))
}

// hostConnectionCutAfterStart is TestHostConnectionCutAfterStart on fleet f, behind its proxy
// (TestSkew runs it across releases).
func hostConnectionCutAfterStart(t *testing.T, ctx context.Context, f *testbed) {
	cc := hostControl(t, f.host)
	g := newGatedCommand(t)
	cs := f.session(t, "agent", "run-cut")

	done := make(chan callOutcome, 1)
	go func() {
		x, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": g.cmd, "wait_s": 60})
		done <- callOutcome{x, err}
	}()
	marker := waitForRunningMarker(t, ctx, cc)
	f.proxy.Cut()
	testutil.WaitFor(t, "the bastion to reattach after asking the host", func() bool {
		return hasEvidence(journaled(t, f.bastion, marker.ID), "attaching")
	})
	g.open(t)

	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.x.ExecutionID != marker.ID || got.x.State != "completed" || got.x.Stdout != "done\n" {
		t.Fatalf("call = %+v; want %s completed with its output", got.x, marker.ID)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	if m := harness.Marker(t, ctx, cc, marker.ID); m == nil || m.State != hostproto.MarkerExited {
		t.Fatalf("host marker = %+v; want exited", m)
	}
}

// TestHostConnectionCutBeforeExecArrives: the exec request never reaches the host (held in
// a frozen link, which is then cut). The bastion cannot know that until it asks: the
// execution goes unknown, the host shows no marker, and the bastion dispatches the same
// execution id again — once.
func TestHostConnectionCutBeforeExecArrives(t *testing.T) {
	f := startFleetBehindProxy(t)
	ctx := testContext(t)
	cc := hostControl(t, f.host)
	cs := f.session(t, "agent", "run-frozen")
	// A first command opens the pooled connection: the exec below is held on it.
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "true"}); x.State != "completed" {
		t.Fatalf("warm-up = %+v", x)
	}
	cmd, file := appendCommand(t, "held")

	f.proxy.Freeze()
	done := make(chan callOutcome, 1)
	go func() {
		x, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 60})
		done <- callOutcome{x, err}
	}()
	var id string
	testutil.WaitFor(t, "the execution to be dispatched", func() bool {
		for _, x := range listOf(t, ctx, f.session(t, "agent", "")) {
			if x.Command == cmd && x.State == "dispatched" {
				id = x.ExecutionID
			}
		}
		return id != ""
	})
	// Nothing gets through while frozen: whenever the exec was sent, it is lost with the cut.
	f.proxy.Cut()
	testutil.WaitFor(t, "the outcome to be unknown after the cut", func() bool {
		return journaled(t, f.bastion, id).State == markers.Unknown
	})
	if m := harness.Marker(t, ctx, cc, id); m != nil {
		t.Fatalf("the host has a marker for the held exec: %+v", m)
	}
	f.proxy.Thaw()

	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.x.ExecutionID != id || got.x.State != "completed" || got.x.Stdout != "done\n" {
		t.Fatalf("call = %+v; want %s completed with its output", got.x, id)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	detail := operatorDetail(t, f.bastion, id)
	if !hasEvidence(detail.Record, "no marker") {
		t.Errorf("evidence %q does not say the host had no marker", detail.Record.Evidence)
	}
	if !redispatchedAfterUnknown(detail) {
		t.Errorf("events show no unknown → dispatched: %+v", detail.Events)
	}
}

// TestBastionKilledMidCommand: the bastion is SIGKILLed while a command runs and started
// again; the agent's retry (same actor and run) joins the same execution, whether the
// command ended while the bastion was down or still runs.
func TestBastionKilledMidCommand(t *testing.T) {
	for _, tc := range []struct {
		name string
		// endWhileDown: the command ends before the bastion is started again.
		endWhileDown bool
	}{
		{name: "still running after the restart", endWhileDown: false},
		{name: "ended while the bastion was down", endWhileDown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bastionKilledMidCommand(t, testContext(t), startFleet(t), tc.endWhileDown)
		})
	}
}

// bastionKilledMidCommand is TestBastionKilledMidCommand on fleet f (TestSkew runs it across
// releases).
func bastionKilledMidCommand(t *testing.T, ctx context.Context, f *testbed, endWhileDown bool) {
	cc := hostControl(t, f.host)
	g := newGatedCommand(t)
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}

	first := mustCall(t, ctx, f.session(t, "agent", "run-crash"), "ssh_exec", args)
	marker := waitForRunningMarker(t, ctx, cc)
	if marker.ID != first.ExecutionID {
		t.Fatalf("host runs %s; the bastion answered %s", marker.ID, first.ExecutionID)
	}
	f.bastion.Kill(t)
	if endWhileDown {
		g.open(t)
		testutil.WaitFor(t, "the command to end on the host", func() bool {
			m := harness.Marker(t, ctx, cc, first.ExecutionID)
			return m != nil && m.State == hostproto.MarkerExited
		})
	}
	f.bastion.Start(t)

	cs := f.session(t, "agent", "run-crash")
	again := mustCall(t, ctx, cs, "ssh_exec", args)
	if again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Fatalf("retry after restart = %+v; want %s replayed", again, first.ExecutionID)
	}
	if !endWhileDown {
		if again.State != "running" {
			t.Fatalf("retry after restart = %+v; want it running", again)
		}
		g.open(t)
	}
	x, out := followOutput(t, ctx, cs, first.ExecutionID)
	if x.State != "completed" || out != "done\n" {
		t.Fatalf("after restart: %+v, stdout %q; want completed with its output", x, out)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	if rec := journaled(t, f.bastion, first.ExecutionID); !hasEvidence(rec, "host marker") {
		t.Errorf("evidence %q does not show the reconciliation with the host", rec.Evidence)
	}
}

// TestConcurrentIdenticalCalls: 100 identical calls at once, over several sessions of one
// run, are one execution; every caller gets its outcome.
func TestConcurrentIdenticalCalls(t *testing.T) {
	const calls, sessions = 100, 4
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	var css []*mcp.ClientSession
	for range sessions {
		css = append(css, f.session(t, "agent", "run-herd"))
	}
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 60}

	results := make([]api.Execution, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			results[i], errs[i] = callExecution(ctx, css[i%sessions], "ssh_exec", args)
		})
	}
	// The command ends only after every call reached the bastion: all of them are waiting
	// for the execution, none arrives after its result was delivered.
	testutil.WaitFor(t, "every call to reach the bastion", func() bool {
		return metric(t, f.bastion, "postern_executions_accepted_total")+
			metric(t, f.bastion, `postern_dedup_hits_total{by="fingerprint"}`) >= calls
	})
	g.open(t)
	wg.Wait()

	ids := map[string]int{}
	replayed := 0
	for i, x := range results {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if x.State != "completed" || x.Stdout != "done\n" {
			t.Fatalf("call %d = %+v; want completed with output", i, x)
		}
		ids[x.ExecutionID]++
		if x.Replayed {
			replayed++
		}
	}
	if len(ids) != 1 || replayed != calls-1 {
		t.Fatalf("executions %v, %d replayed; want one execution, %d replayed", ids, replayed, calls-1)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	if n := metric(t, f.bastion, "postern_executions_accepted_total"); n != 1 {
		t.Fatalf("bastion accepted %v executions; want 1", n)
	}
}
