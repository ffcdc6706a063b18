package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// Fleet runs at fleet size (issue 28, "Measured at fleet size"): real hostagents, each its
// own process on its own loopback port, enrolled by one `postern hosts import`.

// startAgents starts n hostagents that authorize key, one at a time: each takes its free
// port the moment before it listens there.
func startAgents(tb testing.TB, n int, key testutil.SSHKey) []*harness.Hostagent {
	tb.Helper()
	agents := make([]*harness.Hostagent, n)
	for i := range agents {
		h := harness.NewHostagent(tb)
		testutil.WriteAuthorizedKeys(tb, h.AuthorizedKeysPath(), key.AuthorizedLine())
		h.Start(tb)
		agents[i] = h
	}
	return agents
}

// agentCSVLine is h's line of an import file (columns name,addr,account,labels,host_key,cwd).
func agentCSVLine(name string, h *harness.Hostagent, labels, cwd string) string {
	return fmt.Sprintf("%s,%s,%s,%s,%s,%s\n", name, h.Addr, h.Account, labels, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(h.HostKey))), cwd)
}

// importHosts enrolls the hosts of csv (with its header row) by `postern hosts import`.
func importHosts(tb testing.TB, bs *harness.Bastion, csv string) {
	tb.Helper()
	file := filepath.Join(tb.TempDir(), "fleet.csv")
	if err := os.WriteFile(file, []byte(csv), 0o600); err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command(harness.Binary(tb, "postern"), "hosts", "import", file, "--config", bs.ConfigPath).CombinedOutput(); err != nil {
		tb.Fatalf("hosts import: %v\n%s", err, out)
	}
}

// fleetScale is the number of hostagents of TestFleetRunAtScale: issue 28's 100 by default
// (20-35 s on a 2-core machine, 10-20 of them starting the hostagents), or
// POSTERN_FLEET_SCALE (e.g. 24 on a smaller machine: about 17 s).
func fleetScale(t *testing.T) int {
	s := os.Getenv("POSTERN_FLEET_SCALE")
	if s == "" {
		return 100
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 12 || n > 500 {
		t.Fatalf("POSTERN_FLEET_SCALE=%q: want 12..500 hosts", s)
	}
	return n
}

// span is one command's run on one host, as the command itself wrote it down.
type span struct {
	host, id   string
	start, end int64 // Unix nanoseconds; end 0 when no end was written
}

// scaleSpans reads the spans the commands wrote in each host's working directory: one
// "start ID NS" line when a command starts there, one "end ID NS" when it ends.
func scaleSpans(t *testing.T, cwds map[string]string) []span {
	t.Helper()
	var out []span
	for host, dir := range cwds {
		data, err := os.ReadFile(filepath.Join(dir, "ran"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		// Only whole lines: a command may be writing one as it is read.
		if i := strings.LastIndexByte(string(data), '\n'); i >= 0 {
			data = data[:i]
		} else {
			continue
		}
		open := map[string]int{}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 {
				t.Fatalf("%s: line %q", host, line)
			}
			at, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatalf("%s: line %q: %v", host, line, err)
			}
			switch f[0] {
			case "start":
				open[f[1]] = len(out)
				out = append(out, span{host: host, id: f[1], start: at})
			case "end":
				out[open[f[1]]].end = at
			}
		}
	}
	return out
}

// mostOverlapping is the most spans that were running at the same instant; a span without
// an end counts as running to the end.
func mostOverlapping(spans []span) int {
	type edge struct {
		at    int64
		delta int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.start, 1})
		if s.end != 0 {
			edges = append(edges, edge{s.end, -1})
		}
	}
	// At the same instant an end comes before a start: a slot is freed, then taken.
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

// runStatus reads a run through execution_status, on a session of the bastion as it runs
// now.
func runStatus(t *testing.T, ctx context.Context, bs *harness.Bastion, id string) api.Execution {
	t.Helper()
	return mustCall(t, ctx, bs.Connect(t, "agent", runHeader("scale-status")), "execution_status", map[string]any{"execution_id": id})
}

// waitRunEnd polls a fleet run every 250 ms (not faster: at fleet size each answer reads
// every host's execution) until its rollout has an outcome.
func waitRunEnd(t *testing.T, ctx context.Context, bs *harness.Bastion, id string, within time.Duration) api.Execution {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		x := runStatus(t, ctx, bs, id)
		if x.Fleet != nil && x.Fleet.Outcome != "" {
			return x
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s did not end within %v: %s, counts %v", id, within, x.State, x.Fleet.Counts)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestFleetRunAtScale: a fleet_exec over N real hostagents (100 by default, in CI too;
// POSTERN_FLEET_SCALE sets N), every one enrolled by one `postern hosts import`, at
// max_concurrency N/5 (20 at 100), with faults: three hosts down from the start, two
// hostagents killed while their command runs and started again, the bastion SIGKILLed
// mid-run and started again. Then the history, from what each command wrote in its host's working directory
// and from the journal: each host ran the command at most once, every host is accounted
// for (completed, failed with a cause, or unknown with one), never more than
// max_concurrency commands ran at once. A second run whose command fails everywhere, with
// max_errors 2, stops starting hosts once a third has failed.
func TestFleetRunAtScale(t *testing.T) {
	n := fleetScale(t)
	concurrency := n / 5
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	harness.Binary(t, "postern")
	key := testutil.NewSSHKey(t)
	t0 := time.Now()
	agents := startAgents(t, n, key)
	t.Logf("%d hostagents started in %v", n, time.Since(t0).Round(time.Millisecond))

	bs := harness.NewBastion(t, key)
	bs.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log (tail):\n%s", tail(bs.Logs(), 8000))
		}
	})
	// Every host works in its own directory, where its commands write their spans: a
	// command that ran twice on a host shows as two start lines there.
	names := make([]string, n)
	cwds := map[string]string{}
	var csv strings.Builder
	csv.WriteString("name,addr,account,labels,host_key,cwd\n")
	for i, h := range agents {
		names[i] = fmt.Sprintf("s%03d", i)
		cwds[names[i]] = filepath.Join(t.TempDir(), names[i])
		if err := os.Mkdir(cwds[names[i]], 0o700); err != nil {
			t.Fatal(err)
		}
		csv.WriteString(agentCSVLine(names[i], h, "role=scale", cwds[names[i]]))
	}
	importHosts(t, bs, csv.String())

	// Three hosts are down before the run starts (spread over its waves).
	down := map[string]bool{}
	for _, i := range []int{1, n / 2, n - 2} {
		agents[i].Kill(t)
		down[names[i]] = true
	}

	spanned := func(rest string) string {
		return `echo "start $POSTERN_EXECUTION_ID $(date +%s%N)" >> ran; (` + rest +
			`); s=$?; echo "end $POSTERN_EXECUTION_ID $(date +%s%N)" >> ran; exit $s`
	}
	args := map[string]any{"targets": []string{"role=scale"}, "command": spanned("sleep 0.5"), "max_concurrency": concurrency,
		"max_errors": "50%", "wait_s": 0, "idempotency_key": "scale-roll-1"}
	t0 = time.Now()
	x := mustCall(t, ctx, bs.Connect(t, "agent", runHeader("scale-a")), "fleet_exec", args)
	running := func() []span {
		var out []span
		for _, s := range scaleSpans(t, cwds) {
			if s.end == 0 {
				out = append(out, s)
			}
		}
		return out
	}

	// Two hostagents killed while their command runs (the command lives on under the
	// hostagent's supervisor), each started again a moment later.
	var first []span
	testutil.WaitFor(t, "the first hosts to run", func() bool { first = running(); return len(first) >= 2 })
	var killed []string
	for _, s := range first[:2] {
		i := slices.Index(names, s.host)
		agents[i].Kill(t)
		killed = append(killed, s.host)
	}
	time.Sleep(300 * time.Millisecond)
	for _, host := range killed {
		agents[slices.Index(names, host)].Start(t)
	}
	t.Logf("killed and restarted the hostagents of %v", killed)

	// The bastion SIGKILLed once about a third of the hosts started, and started again: the
	// same keyed call joins the run, which goes on from the journal.
	testutil.WaitFor(t, "a third of the hosts to start", func() bool { return len(scaleSpans(t, cwds)) >= n/3 })
	bs.Kill(t)
	startedAtKill := len(scaleSpans(t, cwds))
	bs.Start(t)
	again := mustCall(t, ctx, bs.Connect(t, "agent", runHeader("scale-b")), "fleet_exec", args)
	if again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("the keyed call after the restart = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	t.Logf("bastion killed with %d hosts started, and started again", startedAtKill)

	end := waitRunEnd(t, ctx, bs, x.ExecutionID, 4*time.Minute)
	t.Logf("run of %d hosts at max_concurrency %d with the faults: %v; counts %v", n, concurrency, time.Since(t0).Round(time.Millisecond), end.Fleet.Counts)

	// The history.
	spans := scaleSpans(t, cwds)
	ranOn := map[string]int{}
	for _, s := range spans {
		ranOn[s.host]++
	}
	if len(end.Fleet.Hosts) != n {
		t.Fatalf("the run lists %d hosts; want %d", len(end.Fleet.Hosts), n)
	}
	failed := map[string]api.FleetHost{}
	for _, h := range end.Fleet.Failed {
		failed[h.Host] = h
	}
	total := 0
	for _, c := range end.Fleet.Counts {
		total += c
	}
	if total != n {
		t.Errorf("counts %v add up to %d; want every one of %d hosts", end.Fleet.Counts, total, n)
	}
	for _, h := range end.Fleet.Hosts {
		if ranOn[h.Host] > 1 {
			t.Errorf("%s ran the command %d times; want at most once", h.Host, ranOn[h.Host])
		}
		switch {
		case down[h.Host]:
			// Never reached: failed, with why, and nothing ran there.
			if ranOn[h.Host] != 0 || h.State == "completed" || failed[h.Host].Cause == "" {
				t.Errorf("down host %s: state %s, ran %d times, failed as %+v; want failed with a cause, nothing run", h.Host, h.State, ranOn[h.Host], failed[h.Host])
			}
		case h.State == "completed":
			if ranOn[h.Host] != 1 || h.ExitCode == nil || *h.ExitCode != 0 {
				t.Errorf("%s completed (exit %v) but ran %d times; want exit 0, once", h.Host, h.ExitCode, ranOn[h.Host])
			}
		case h.State == "unknown" || h.State == "failed":
			// A killed hostagent may leave an outcome that only a review settles; it must
			// say why.
			if failed[h.Host].Cause == "" {
				t.Errorf("%s is %s without a cause: %+v", h.Host, h.State, h)
			}
			t.Logf("%s: %s: %s", h.Host, h.State, failed[h.Host].Cause)
		default:
			t.Errorf("%s ended %s; want completed, failed or unknown", h.Host, h.State)
		}
	}
	if c := end.Fleet.Counts["completed"]; c < n-len(down)-len(killed) {
		t.Errorf("%d hosts completed; want at least every host up and not killed (%d)", c, n-len(down)-len(killed))
	}
	if most := mostOverlapping(spans); most > concurrency {
		t.Errorf("%d commands ran at once; want at most max_concurrency %d:\n%s", most, concurrency, spansText(spans))
	} else {
		t.Logf("at most %d commands ran at once (max_concurrency %d)", most, concurrency)
	}

	// max_errors: a command that fails everywhere, max_errors 2. Once a third host failed no
	// new host starts; the ones running then finish. So at most 2 + concurrency hosts start
	// (the third failure with concurrency-1 others still running), and the rest never do.
	for _, dir := range cwds {
		if err := os.Remove(filepath.Join(dir, "ran")); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	failing := map[string]any{"targets": []string{"role=scale"}, "command": spanned("sleep 0.2; echo broken >&2; exit 3"),
		"max_concurrency": concurrency, "max_errors": 2, "wait_s": 0}
	y := mustCall(t, ctx, bs.Connect(t, "agent", runHeader("scale-c")), "fleet_exec", failing)
	stopped := waitRunEnd(t, ctx, bs, y.ExecutionID, 2*time.Minute)
	started := len(scaleSpans(t, cwds))
	t.Logf("the failing run: %s, %d failures, %d hosts started on disk, counts %v", stopped.Fleet.Outcome, stopped.Fleet.Failures, started, stopped.Fleet.Counts)
	if stopped.Fleet.Outcome != "stopped" || stopped.Fleet.Failures < 3 {
		t.Fatalf("failing run: outcome %q after %d failures; want stopped after more than 2", stopped.Fleet.Outcome, stopped.Fleet.Failures)
	}
	notStarted := stopped.Fleet.Counts[api.NotStarted]
	if begun := n - notStarted; begun > 2+concurrency {
		t.Errorf("%d hosts were started; want at most max_errors + max_concurrency = %d", begun, 2+concurrency)
	}
	if started > n-notStarted {
		t.Errorf("%d commands started on the hosts but the run started %d hosts", started, n-notStarted)
	}
	if spans := scaleSpans(t, cwds); mostOverlapping(spans) > concurrency {
		t.Errorf("the failing run: %d commands at once; want at most %d:\n%s", mostOverlapping(spans), concurrency, spansText(spans))
	}
}

// spansText lists spans by start, in milliseconds from the first.
func spansText(spans []span) string {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b span) int { return int(a.start - b.start) })
	var sb strings.Builder
	for _, s := range spans {
		end := "-"
		if s.end != 0 {
			end = strconv.FormatInt((s.end-spans[0].start)/1e6, 10)
		}
		fmt.Fprintf(&sb, "%s %s %d..%s ms\n", s.host, s.id, (s.start-spans[0].start)/1e6, end)
	}
	return sb.String()
}
