package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// Fleet runs on real processes: a bastion and several hostagents, each its own process on
// its own port, enrolled as w1…wn with the label role=web. Every command a run sends writes
// its execution id and its start and end times to one file on this machine's disk, so the
// test counts what each host ran and how many ran at once.

// fleetBed is a bastion and its hostagents.
type fleetBed struct {
	bastion *harness.Bastion
	hosts   []*harness.Hostagent
	// spans is where the commands write "start|end ID NANOSECONDS" lines.
	spans string
}

// startFleetOf starts n hostagents that trust the same bastion key, and the bastion with
// all of them enrolled.
func startFleetOf(t *testing.T, n int) *fleetBed {
	t.Helper()
	// Each starts as soon as it is made: its free port is taken at once.
	hosts := []*harness.Hostagent{harness.StartHostagent(t)}
	for range n - 1 {
		h := harness.NewHostagent(t)
		testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath(), hosts[0].ClientKey.AuthorizedLine())
		h.Start(t)
		hosts = append(hosts, h)
	}
	b := harness.NewBastion(t, hosts[0].ClientKey)
	inv := config.DefaultConfig(b.StateDir()).InventoryPath()
	for i, h := range hosts {
		if err := fleet.Enroll(inv, fleet.Host{Name: "w" + strconv.Itoa(i+1), Addr: h.Addr, Account: h.Account, HostKey: h.HostKey,
			Labels: map[string]string{"role": "web"}}); err != nil {
			t.Fatal(err)
		}
	}
	b.Start(t)
	fb := &fleetBed{bastion: b, hosts: hosts, spans: filepath.Join(t.TempDir(), "spans")}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s", b.Logs())
		}
	})
	return fb
}

// command is a command that records its start and end around rest, keeping rest's status.
func (fb *fleetBed) command(rest string) string {
	return `echo "start $POSTERN_EXECUTION_ID $(date +%s%N)" >> ` + fb.spans + "; " + rest +
		`; s=$?; echo "end $POSTERN_EXECUTION_ID $(date +%s%N)" >> ` + fb.spans + "; exit $s"
}

// runs counts the starts of each execution id on the hosts.
func (fb *fleetBed) runs(t *testing.T) map[string]int {
	t.Helper()
	data, err := os.ReadFile(fb.spans)
	if os.IsNotExist(err) {
		return map[string]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "start" {
			out[f[1]]++
		}
	}
	return out
}

// started is how many commands started on the hosts.
func (fb *fleetBed) started(t *testing.T) int {
	n := 0
	for _, c := range fb.runs(t) {
		n += c
	}
	return n
}

// mostAtOnce is the most commands that ran at the same time, from their spans.
func (fb *fleetBed) mostAtOnce(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile(fb.spans)
	if err != nil {
		t.Fatal(err)
	}
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		at, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			t.Fatalf("span %q: %v", line, err)
		}
		edges = append(edges, edge{at, map[string]int{"start": 1, "end": -1}[f[0]]})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.delta - b.delta
	})
	cur, most := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// checkOnce checks the runs made on fb against the hosts' disk and the journal: every
// command that ran is one of the runs' executions, each ran at most once, and each names
// its run.
func (fb *fleetBed) checkOnce(t *testing.T, runs ...api.Execution) {
	t.Helper()
	ids := map[string]string{}
	for _, x := range runs {
		for _, h := range x.Fleet.Hosts {
			if h.ExecutionID == "" {
				continue
			}
			ids[h.ExecutionID] = h.Host
			rec := journaled(t, fb.bastion, h.ExecutionID)
			if rec.FleetRun != x.ExecutionID || rec.Host != h.Host {
				t.Errorf("%s: %s names run %q on %q; want %s on %s", h.Host, h.ExecutionID, rec.FleetRun, rec.Host, x.ExecutionID, h.Host)
			}
		}
	}
	for id, n := range fb.runs(t) {
		if ids[id] == "" {
			t.Errorf("%s ran on a host but is none of the run's executions", id)
		}
		if n > 1 {
			t.Errorf("%s (%s) ran %d times", id, ids[id], n)
		}
	}
}

// TestFleetRunOnHostagents: one fleet_exec over six hostagents runs once on each, never
// more than max_concurrency at once; the same keyed call again joins the run (its result
// was delivered, so without the key it would be a new intent); a run whose hosts
// fail stops after max_errors and starts no more.
func TestFleetRunOnHostagents(t *testing.T) {
	fb := startFleetOf(t, 6)
	ctx := testContext(t)
	cs := fb.bastion.Connect(t, "agent", runHeader("run-fleet"))
	args := map[string]any{"targets": []string{"role=web"}, "command": fb.command("sleep 0.3"), "max_concurrency": 2, "max_errors": "0", "wait_s": 50,
		"idempotency_key": "web-roll-1"}
	t0 := time.Now()
	x := mustCall(t, ctx, cs, "fleet_exec", args)
	t.Logf("six hosts, two at once, 0.3 s each: %v", time.Since(t0))
	if x.State != "completed" || x.IsError || x.Fleet == nil || x.Fleet.Counts["completed"] != 6 || x.Fleet.Outcome != "completed" {
		t.Fatalf("run = %s (is_error %v), fleet %+v; want completed on all 6", x.State, x.IsError, x.Fleet)
	}
	fb.checkOnce(t, x)
	if n := fb.started(t); n != 6 {
		t.Fatalf("%d commands ran; want 6", n)
	}
	if most := fb.mostAtOnce(t); most > 2 {
		t.Errorf("%d commands ran at once; want at most max_concurrency 2", most)
	}
	again := mustCall(t, ctx, cs, "fleet_exec", args)
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("the same call again = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	if n := fb.started(t); n != 6 {
		t.Fatalf("after the retry %d commands ran; want still 6", n)
	}
	// A host's output is its execution's.
	out := mustCall(t, ctx, cs, "execution_output", map[string]any{"execution_id": x.Fleet.Hosts[0].ExecutionID, "wait_s": 0})
	if out.Host != "w1" || out.FleetRun != x.ExecutionID {
		t.Fatalf("w1's execution = %+v; want w1's, of run %s", out, x.ExecutionID)
	}

	// Every host fails: one at a time, one failure tolerated, so exactly two start.
	before := fb.started(t)
	failing := map[string]any{"targets": []string{"w1", "w2", "w3", "w4", "w5", "w6"}, "command": fb.command("echo broken >&2; exit 3"),
		"max_concurrency": 1, "max_errors": 1, "wait_s": 50}
	var stopped api.Execution
	t0 = time.Now()
	res, err := harness.CallTool(ctx, cs, "fleet_exec", failing, &stopped)
	if err != nil || !res.IsError {
		t.Fatalf("failing run: %v, isError %v; want a result that is an error", err, res != nil && res.IsError)
	}
	t.Logf("the failing run: %v", time.Since(t0))
	if stopped.Fleet.Outcome != "stopped" || stopped.Fleet.Failures != 2 || stopped.Fleet.Counts[api.NotStarted] != 4 {
		t.Fatalf("failing run = %s, fleet %+v; want stopped after 2 failures, 4 never started", stopped.State, stopped.Fleet)
	}
	if n := fb.started(t) - before; n != 2 {
		t.Fatalf("the failing run started %d commands; want 2", n)
	}
	if h := stopped.Fleet.Failed[0]; h.Cause != "stderr: broken" || h.ExitCode == nil || *h.ExitCode != 3 {
		t.Errorf("first failed host %+v; want exit 3 with its stderr as the cause", h)
	}
	if text := harness.ResultText(res); !strings.Contains(text, "Failed: w1") || !strings.Contains(text, "4 not_started") {
		t.Errorf("result text %q; want the failed hosts and the counts", text)
	}
	fb.checkOnce(t, x, stopped)
}

// TestFleetRunSurvivesBastionKill: the bastion is SIGKILLed while a run's first hosts run
// and started again: it goes on from the journal — the started hosts are reconciled, never
// started again; the others start under the same max_concurrency — and the operator's
// investigate answers for the run and each host.
func TestFleetRunSurvivesBastionKill(t *testing.T) {
	fb := startFleetOf(t, 5)
	ctx := testContext(t)
	gate := filepath.Join(t.TempDir(), "gate")
	dir := filepath.Dir(gate)
	cmd := fb.command("while [ ! -e " + gate + " ] && [ -d " + dir + " ]; do sleep 0.05; done")
	args := map[string]any{"targets": []string{"role=web"}, "command": cmd, "max_concurrency": 2, "max_errors": 0, "wait_s": 0, "idempotency_key": "roll-1"}
	x := mustCall(t, ctx, fb.bastion.Connect(t, "agent", runHeader("run-a")), "fleet_exec", args)
	testutil.WaitFor(t, "two hosts to start", func() bool { return fb.started(t) == 2 })

	t0 := time.Now()
	fb.bastion.Kill(t)
	fb.bastion.Start(t)
	t.Logf("kill and start: %v", time.Since(t0))
	// A restarted agent retries with its key: it joins the run, which the bastion carries.
	cs := fb.bastion.Connect(t, "agent", runHeader("run-b"))
	again := mustCall(t, ctx, cs, "fleet_exec", args)
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("retry after the restart = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	if n := fb.started(t); n != 2 {
		t.Fatalf("after the restart %d commands started; want still 2 (max_concurrency, and nothing twice)", n)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	end := waitForState(t, ctx, cs, x.ExecutionID, "completed", "failed", "cancelled")
	t.Logf("the rest of the run after the gate opened: %v", time.Since(t0))
	if end.State != "completed" || end.IsError || end.Fleet.Counts["completed"] != 5 {
		t.Fatalf("run = %s (is_error %v), counts %v; want 5 completed", end.State, end.IsError, end.Fleet.Counts)
	}
	fb.checkOnce(t, end)
	if n := fb.started(t); n != 5 {
		t.Fatalf("%d commands ran; want 5, once each", n)
	}
	if most := fb.mostAtOnce(t); most > 2 {
		t.Errorf("%d commands ran at once; want at most 2", most)
	}

	var inv api.Investigation
	if err := json.Unmarshal(postern(t, fb.bastion, "investigate", x.ExecutionID, "--json"), &inv); err != nil {
		t.Fatal(err)
	}
	if len(inv.Answers) != 5 || len(inv.Hosts) != 5 || !strings.Contains(inv.Answers[2], "5 completed") {
		t.Fatalf("investigation: %d answers, %d hosts, outcome %q; want 5 and 5, all completed", len(inv.Answers), len(inv.Hosts), inv.Answers[2])
	}
	text := string(postern(t, fb.bastion, "investigate", x.ExecutionID))
	for i := 1; i <= 5; i++ {
		if !strings.Contains(text, fmt.Sprintf("host w%d: ex_", i)) {
			t.Errorf("investigate text lacks host w%d:\n%s", i, text)
		}
	}
}

// TestFleetRunOperator: an operator runs, reads and cancels a fleet run with postern fleet:
// the cancel starts no more hosts and stops the running ones.
func TestFleetRunOperator(t *testing.T) {
	fb := startFleetOf(t, 4)
	gate := filepath.Join(t.TempDir(), "gate")
	cmd := fb.command("while [ ! -e " + gate + " ]; do sleep 0.05; done")
	out := string(postern(t, fb.bastion, "fleet", "run", cmd, "--actor", "agent", "--target", "role=web",
		"--max-concurrency", "50%", "--max-errors", "0", "--wait", "1ms", "--json"))
	var x api.Execution
	if err := json.Unmarshal([]byte(out), &x); err != nil || x.Fleet == nil {
		t.Fatalf("fleet run --json: %v\n%s", err, out)
	}
	testutil.WaitFor(t, "two hosts to start", func() bool { return fb.started(t) == 2 })
	out = string(postern(t, fb.bastion, "fleet", "cancel", x.ExecutionID))
	if !strings.Contains(out, "cancelled") {
		t.Fatalf("fleet cancel:\n%s", out)
	}
	testutil.WaitFor(t, "the run to end", func() bool {
		var now api.Execution
		return json.Unmarshal(postern(t, fb.bastion, "fleet", "show", x.ExecutionID, "--json"), &now) == nil && now.State == "cancelled"
	})
	var end api.Execution
	if err := json.Unmarshal(postern(t, fb.bastion, "fleet", "show", x.ExecutionID, "--json"), &end); err != nil {
		t.Fatal(err)
	}
	if end.Fleet.Counts["cancelled"] != 2 || end.Fleet.Counts[api.NotStarted] != 2 {
		t.Fatalf("counts %v; want 2 cancelled, 2 never started", end.Fleet.Counts)
	}
	if n := fb.started(t); n != 2 {
		t.Fatalf("%d commands started; want 2", n)
	}
	fb.checkOnce(t, end)
	if show := string(postern(t, fb.bastion, "fleet", "show", x.ExecutionID)); !strings.Contains(show, "HOST") || !strings.Contains(show, "w4") {
		t.Errorf("fleet show:\n%s", show)
	}
}

// TestReplicaKilledMidFleetRunIsTakenOver: on etcd, the replica driving a fleet run is
// SIGKILLed while its first hosts run: another replica takes the run over from the journal
// and finishes it under the same brakes, no host run twice.
func TestReplicaKilledMidFleetRunIsTakenOver(t *testing.T) {
	f := startHAFleet(t, 2)
	ctx := testContext(t)
	// The one hostagent under four names: four hosts to the bastion, one disk for the test.
	for _, b := range f.replicas {
		inv := config.DefaultConfig(b.StateDir()).InventoryPath()
		for i := 1; i <= 4; i++ {
			if err := fleet.Enroll(inv, fleet.Host{Name: "w" + strconv.Itoa(i), Addr: f.host.Addr, Account: f.host.Account, HostKey: f.host.HostKey,
				Labels: map[string]string{"role": "web"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	fb := &fleetBed{bastion: f.replicas[1], spans: filepath.Join(t.TempDir(), "spans")}
	gate := filepath.Join(t.TempDir(), "gate")
	cmd := fb.command("while [ ! -e " + gate + " ] && [ -d " + filepath.Dir(gate) + " ]; do sleep 0.05; done")
	args := map[string]any{"targets": []string{"role=web"}, "command": cmd, "max_concurrency": 2, "max_errors": 0, "wait_s": 0, "idempotency_key": "ha-roll"}
	x := mustCall(t, ctx, f.session(t, 0, "run-1"), "fleet_exec", args)
	testutil.WaitFor(t, "two hosts to start", func() bool { return fb.started(t) == 2 })
	f.replicas[0].Kill(t)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cs := f.session(t, 1, "run-2")
	again := mustCall(t, ctx, cs, "fleet_exec", args)
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("the keyed call on replica 1 = %s (replayed %v); want %s", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	end := waitForState(t, ctx, cs, x.ExecutionID, "completed", "failed", "cancelled")
	if end.State != "completed" || end.IsError || end.Fleet.Counts["completed"] != 4 {
		t.Fatalf("run = %s (is_error %v), counts %v; want 4 completed", end.State, end.IsError, end.Fleet.Counts)
	}
	fb.checkOnce(t, end)
	if n := fb.started(t); n != 4 {
		t.Fatalf("%d commands ran; want 4, once each", n)
	}
	if most := fb.mostAtOnce(t); most > 2 {
		t.Errorf("%d commands ran at once; want at most 2", most)
	}
}

// TestFleetRunAsTask: a task-augmented fleet_exec returns a task at once, its id the run's;
// tasks/get carries the run's answer inline once its hosts are done.
func TestFleetRunAsTask(t *testing.T) {
	f := startFleet(t)
	g := newGatedCommand(t)
	ext := map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}
	args := map[string]any{"targets": []string{"h1"}, "command": g.cmd, "max_concurrency": 1, "max_errors": 0, "wait_s": 0}
	task := extPost(t, f, "tools/call", "fleet_exec", map[string]any{"name": "fleet_exec", "arguments": args}, ext)
	id, _ := task["taskId"].(string)
	if task["resultType"] != "task" || !strings.HasPrefix(id, "fr_") || task["status"] != "working" {
		t.Fatalf("tools/call of fleet_exec as a task = %v; want a working task named by the run", task)
	}
	g.open(t)
	var got map[string]any
	testutil.WaitFor(t, "the task completed", func() bool {
		got = extPost(t, f, "tasks/get", id, map[string]any{"taskId": id}, ext)
		return got["status"] == "completed"
	})
	res, _ := got["result"].(map[string]any)
	sc, _ := res["structuredContent"].(map[string]any)
	fl, _ := sc["fleet"].(map[string]any)
	counts, _ := fl["counts"].(map[string]any)
	if sc["execution_id"] != id || counts["completed"] != float64(1) {
		t.Fatalf("tasks/get of the completed run = %v; want its answer with 1 completed host", got)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("the command ran %d times; want 1", n)
	}
}
