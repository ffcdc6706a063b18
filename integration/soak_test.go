package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// The fault soak: real processes on 127.0.0.1 (one bastion with the HTTP plugin, two
// hostagents each behind its own fault proxy, a counting HTTP target), MCP clients that
// retry blindly, and faults from a seeded schedule. The history checker
// (soak_checker_test.go) then judges what happened from the outside (effects files, the
// target's counters) and from the inside (journal, markers, audit chains).
//
// The seed fixes the workload and the fault schedule; the interleaving of processes is the
// machine's, so a replay re-runs the same schedule, not the same history.

const (
	// soakShortCalls is the CI size; POSTERN_SOAK_CALLS overrides it (e.g. 10000).
	soakShortCalls = 300
	soakClients    = 6
	// soakAttempts bounds how often one client tries one intended call.
	soakAttempts = 6
	// soakCallWait is the wait_s of every call: commands are short, so a live execution
	// answers well within it.
	soakCallWait = 20
	// soakCutChance is the chance that a client abandons a call after a random delay (an MCP
	// connection cut at a random moment).
	soakCutChance = 0.12
	// soakDupChance is the chance that an intended call is submitted by two goroutines at once.
	soakDupChance = 0.10
	// soakKeyedChance is the chance that a call carries an idempotency_key.
	soakKeyedChance = 0.5
)

// Fault kinds, as counted in the summary.
const (
	faultMCPCut        = "mcp_cut"
	faultHostCut       = "host_tcp_cut"
	faultHostFreeze    = "host_tcp_freeze"
	faultBastionKill   = "bastion_kill"
	faultHostagentKill = "hostagent_kill"
	faultShimKill      = "shim_kill"
	faultPluginKill    = "plugin_kill"
)

// soakCall is one intended call: one effect the agent wants, identified by its tag.
type soakCall struct {
	index int
	tag   string
	actor string // the client's actor; its Postern-Run is runOf(actor)
	tool  string
	// host is the inventory name (ssh_exec) or the endpoint (http_request).
	host  string
	args  map[string]any
	keyed bool
	dup   bool
	// bridged calls go through the stdio bridge, as the local actor in this process's run.
	bridged bool
	// exitCode is what the command exits with (ssh_exec).
	exitCode int
}

// soakObservation is what the client side saw of one intended call.
type soakObservation struct {
	mu sync.Mutex
	// views is the last view of each execution id the client saw.
	views    map[string]api.Execution
	attempts int
	errs     map[string]int // transport errors, by kind
	refusals []string       // tool errors (no execution)
	// settled: the last answer was a terminal state.
	settled bool
	// clientKilled: a client process making this call, or the stdio bridge carrying it, was
	// SIGKILLed; what it read before it died is unknown to the test (it may have had the
	// result and not passed it on).
	clientKilled bool
	// cancelUnsent: the client gave up on a call and its notifications/cancelled could not be
	// sent (the bastion was down): the server never learned it was abandoned.
	cancelUnsent bool
}

func (o *soakObservation) saw(x api.Execution) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.views[x.ExecutionID] = x
	o.settled = markers.JournalGraph.Terminal(markers.State(x.State))
}

func (o *soakObservation) cancelLost() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cancelUnsent = true
}

// sawEnd reports whether the client saw execution id in a terminal state.
func (o *soakObservation) sawEnd(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	x, ok := o.views[id]
	return ok && markers.JournalGraph.Terminal(markers.State(x.State))
}

// settledNow reports whether the last answer the client saw was terminal.
func (o *soakObservation) settledNow() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.settled
}

func (o *soakObservation) failed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs[errorKind(err)]++
}

// errorKind groups a client-side error for the summary.
func errorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "abandoned"
	case strings.Contains(err.Error(), "connection refused"):
		return "connection refused"
	case strings.Contains(err.Error(), "EOF"), strings.Contains(err.Error(), "reset"):
		return "connection lost"
	default:
		return "other"
	}
}

// soakCounter counts events by kind, from any goroutine.
type soakCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *soakCounter) add(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[kind]++
}

// owed reports whether kind has not been injected yet: a client-side fault is then forced
// wherever it applies, so a short soak injects each whatever its seed and load.
func (c *soakCounter) owed(kind string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[kind] == 0
}

func (c *soakCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// soakHost is one hostagent — or a stock sshd with the marker script (soak_stock_test.go) —
// reached by the bastion through its own fault proxy.
type soakHost struct {
	name  string
	agent *harness.Hostagent // nil for the stock host
	// sshd and home are the stock host's server and its account's home.
	sshd    *harness.SSHD
	home    string
	proxy   *testutil.FaultProxy
	effects string // the file every command on it appends its line to
}

type soak struct {
	seed   uint64
	fleet  *httpFleet
	hosts  []*soakHost
	actors []string
	calls  []*soakCall
	obs    map[string]*soakObservation // by tag
	faults soakCounter
	reads  soakCounter
	// bridgeBins are two copies of the postern binary at different paths, for the bridge.
	bridgeBins []string
	// localActor is the actor of bridged calls (the unix socket names it from our uid).
	localActor string
	started    time.Time
	// backgroundUnresolved are SSH executions the reconcile loop left unknown although their
	// host was reachable again (see waitReconciled).
	backgroundUnresolved []string
}

func runOf(actor string) string { return "run-" + actor }

// journalActor is the actor the journal records for c.
func (s *soak) journalActor(c *soakCall) string {
	if c.bridged {
		return s.localActor
	}
	return "token:" + c.actor
}

// soakTag names intended call i; the checker finds it again in commands and paths.
func soakTag(i int) string { return fmt.Sprintf("soak-%06d", i) }

func soakCalls(t *testing.T) int {
	t.Helper()
	s := os.Getenv("POSTERN_SOAK_CALLS")
	if s == "" {
		return soakShortCalls
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("POSTERN_SOAK_CALLS=%q: want a positive number", s)
	}
	return n
}

// TestSoak drives many MCP clients with retries against the whole system under random
// faults, then checks the history: no second side effect, nothing lost, every ambiguity
// reported as unknown with evidence.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs real processes for minutes; skipped with -short")
	}
	seed := testutil.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	setup := time.Now()
	s := newSoak(t, seed, soakCalls(t), rng)
	t.Logf("setup %v", time.Since(setup).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s.started = time.Now()
	done := make(chan struct{})
	var clients sync.WaitGroup
	clients.Go(func() {
		s.runClients(ctx)
		close(done)
	})
	// Faults are injected from the test goroutine: restarting processes may fail the test.
	s.injectFaults(t, rng, done)
	clients.Wait()
	load := time.Since(s.started)

	s.restoreAll(t)
	settle := time.Now()
	h := s.settle(t, ctx)
	t.Logf("settle %v", time.Since(settle).Round(time.Millisecond))
	s.check(t, ctx, h, load)
}

func newSoak(t *testing.T, seed uint64, calls int, rng *rand.Rand) *soak {
	t.Helper()
	f := newHTTPFleet(t, httpFleetOptions{noStart: true})
	s := &soak{seed: seed, fleet: f, obs: map[string]*soakObservation{}}
	for i := range soakClients {
		actor := fmt.Sprintf("soak-%d", i)
		f.bastion.AddActor(t, harness.ActorSpec{Name: actor})
		s.actors = append(s.actors, actor)
	}
	for _, name := range []string{"h1", "h2"} {
		h := harness.NewHostagent(t)
		// The bastion has one client key: every host authorizes it.
		h.ClientKey = f.bastion.ClientKey
		testutil.WriteAuthorizedKeys(t, filepath.Join(h.Dir, "authorized_keys"), h.ClientKey.AuthorizedLine())
		h.Start(t)
		sh := &soakHost{name: name, agent: h, proxy: testutil.StartFaultProxy(t, h.Addr), effects: filepath.Join(h.Dir, "effects")}
		f.bastion.EnrollAt(t, name, sh.proxy.Addr(), h)
		s.hosts = append(s.hosts, sh)
	}
	s.hosts = append(s.hosts, newStockSoakHost(t, f.bastion, "s1"))
	t.Cleanup(func() {
		if t.Failed() {
			for _, h := range s.hosts {
				if h.agent != nil {
					t.Logf("hostagent %s log (tail):\n%s", h.name, tail(h.agent.Logs(), 8000))
				}
			}
		}
	})
	f.bastion.Start(t)
	s.bridgeBins = copiesOf(t, harness.Binary(t, "postern"), 2)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	s.localActor = "local:" + u.Username

	for i := range calls {
		c := &soakCall{index: i, tag: soakTag(i), actor: s.actors[i%soakClients],
			keyed: rng.Float64() < soakKeyedChance, dup: rng.Float64() < soakDupChance,
			bridged: rng.Float64() < soakBridgedChance}
		switch p := rng.Float64(); {
		case p < 0.55:
			h := s.hosts[rng.IntN(len(s.hosts))]
			c.tool, c.host = "ssh_exec", h.name
			if rng.IntN(4) == 0 {
				c.exitCode = 3
			}
			// The line goes first: a command killed during its sleep has had its effect.
			sleep := []string{"0.02", "0.05", "0.1", "0.3"}[rng.IntN(4)]
			cmd := fmt.Sprintf(`echo "$POSTERN_EXECUTION_ID %s" >> '%s'; sleep %s; exit %d`, c.tag, h.effects, sleep, c.exitCode)
			c.args = map[string]any{"host": h.name, "command": cmd, "wait_s": soakCallWait}
		default:
			c.tool, c.host = "http_request", epIdempotent
			if p >= 0.8 {
				c.host = epIrreversible
			}
			c.args = map[string]any{"endpoint": c.host, "method": "POST", "path": "/v1/soak/" + c.tag,
				"json": map[string]any{"tag": c.tag, "n": i}, "wait_s": soakCallWait}
		}
		if c.keyed {
			c.args["idempotency_key"] = "key-" + c.tag
		}
		s.calls = append(s.calls, c)
		s.obs[c.tag] = &soakObservation{views: map[string]api.Execution{}, errs: map[string]int{}}
	}
	return s
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// runClients runs one goroutine per client; each works through its calls in order.
func (s *soak) runClients(ctx context.Context) {
	var wg sync.WaitGroup
	for i, actor := range s.actors {
		var mine []*soakCall
		for _, c := range s.calls {
			if c.actor == actor {
				mine = append(mine, c)
			}
		}
		wg.Go(func() {
			cl := &soakClient{s: s, actor: actor, transport: &http.Transport{}}
			defer cl.transport.CloseIdleConnections()
			defer cl.drains.Wait()
			for _, c := range mine {
				cl.run(ctx, c)
				cl.read(ctx, c, uint64(i))
			}
		})
	}
	wg.Wait()
}

// soakClient is one agent: an actor with its own run, over its own HTTP transport.
type soakClient struct {
	s         *soak
	actor     string
	transport *http.Transport
	// drains are the responses an aborting client still reads after it gave up.
	drains sync.WaitGroup
}

// connect opens a new MCP session: after any error the client starts over, so every retry
// has a new session and new JSON-RPC ids.
func (cl *soakClient) connect(ctx context.Context) (*mcp.ClientSession, error) {
	cs, _, err := cl.connectCancelling(ctx)
	return cs, err
}

// connectCancelling is connect over a transport that can post notifications/cancelled for
// the session's last call, as a client that gives up on a call does.
func (cl *soakClient) connectCancelling(ctx context.Context) (*mcp.ClientSession, func(context.Context) error, error) {
	rt := &abortingTransport{next: cl.transport, drains: &cl.drains}
	hc := cl.s.fleet.bastion.HTTPClient(cl.actor, runHeader(runOf(cl.actor)), rt)
	client := mcp.NewClient(&mcp.Implementation{Name: "postern-soak", Version: "0"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: cl.s.fleet.bastion.URL, HTTPClient: hc, MaxRetries: -1}, nil)
	return cs, func(ctx context.Context) error { return rt.cancelLastCall(ctx, hc) }, err
}

// run makes one intended call, submitted twice at once if it is a dup.
func (cl *soakClient) run(ctx context.Context, c *soakCall) {
	if !c.dup {
		cl.attempt(ctx, c, 0)
		return
	}
	var wg sync.WaitGroup
	for sub := range 2 {
		wg.Go(func() { cl.attempt(ctx, c, uint64(sub)) })
	}
	wg.Wait()
}

// attempt calls until a terminal state is seen or the attempts run out, then polls the
// status once if the last answer was not terminal. Errors are retried blindly: the same
// arguments, same actor and run, a new session.
func (cl *soakClient) attempt(ctx context.Context, c *soakCall, sub uint64) {
	rng := rand.New(rand.NewPCG(cl.s.seed+uint64(c.index), sub))
	o := cl.s.obs[c.tag]
	var cs *mcp.ClientSession
	defer func() {
		if cs != nil {
			cs.Close()
		}
	}()
	backoff := func(n int) {
		d := min(50*time.Millisecond<<n, time.Second)
		sleepCtx(ctx, d/2+time.Duration(rng.Int64N(int64(d/2))))
	}
	// The first try of an HTTP call may be made by a client that dies or aborts; the loop
	// below then re-issues it, as an agent would.
	if sub == 0 && !c.bridged {
		switch p := rng.Float64(); {
		case p < soakClientKillChance || cl.s.faults.owed(faultClientKill):
			cl.killedClient(ctx, c, rng)
		case p < soakClientKillChance+soakAbortChance || cl.s.faults.owed(faultSDKAbort):
			cl.abortedCall(ctx, c, rng)
		}
		if o.settledNow() {
			return
		}
	}
	var bridge *exec.Cmd
	var cancelCall func(context.Context) error
	lastID := ""
	for n := range soakAttempts {
		if ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		o.attempts++
		o.mu.Unlock()
		if cs == nil {
			var err error
			if c.bridged {
				cs, bridge, err = cl.connectBridge(ctx, n)
			} else {
				cs, cancelCall, err = cl.connectCancelling(ctx)
			}
			if err != nil {
				o.failed(err)
				backoff(n)
				continue
			}
		}
		callCtx, cancel := ctx, context.CancelFunc(func() {})
		var bridgeKilled func() bool
		cut := rng.Float64() < soakCutChance || cl.s.faults.owed(faultMCPCut)
		switch {
		case c.bridged && cl.s.faults.owed(faultBridgeRestart):
			bridgeKilled = killBridgeLater(bridge, rng, true)
		case c.bridged && rng.Float64() < soakBridgeKillChance:
			bridgeKilled = killBridgeLater(bridge, rng, false)
		case cut && !c.bridged:
			callCtx, cancel = context.WithTimeout(ctx, time.Duration(5+rng.IntN(300))*time.Millisecond)
		}
		var x api.Execution
		res, err := harness.CallTool(callCtx, cs, c.tool, c.args, &x)
		if cut && !c.bridged && callCtx.Err() != nil {
			// The client gives up on the call and says so (the go-sdk's own notification is
			// sent asynchronously and may be lost when the session closes at once).
			if cerr := cancelCall(ctx); cerr != nil {
				o.failed(cerr)
				o.cancelLost()
			}
			cl.s.faults.add(faultMCPCut)
		}
		if bridgeKilled != nil && bridgeKilled() {
			o.mu.Lock()
			o.clientKilled = true // the bridge is the client's proxy: it may have read the result
			o.mu.Unlock()
			cl.s.faults.add(faultBridgeRestart)
		}
		cancel()
		switch {
		case err != nil:
			o.failed(err)
			cs.Close()
			cs = nil
			backoff(n)
			continue
		case res.StructuredContent == nil || x.ExecutionID == "":
			o.mu.Lock()
			o.refusals = append(o.refusals, harness.ResultText(res))
			o.mu.Unlock()
			backoff(n)
			continue
		}
		o.saw(x)
		lastID = x.ExecutionID
		if markers.JournalGraph.Terminal(markers.State(x.State)) {
			return
		}
		// unknown, or still in flight: call again (the retry joins and reconciles).
		sleepCtx(ctx, time.Duration(100+rng.IntN(200))*time.Millisecond)
	}
	if lastID == "" {
		return
	}
	if cs == nil {
		var err error
		if c.bridged {
			cs, _, err = cl.connectBridge(ctx, 0)
		} else {
			cs, err = cl.connect(ctx)
		}
		if err != nil {
			o.failed(err)
			return
		}
	}
	var x api.Execution
	if res, err := harness.CallTool(ctx, cs, "execution_status", map[string]any{"execution_id": lastID}, &x); err == nil && res.StructuredContent != nil {
		o.saw(x)
	}
}

// read makes one read-only call now and then (status of the call just made, the client's
// list, the hosts), on a session of its own; failures are only counted.
func (cl *soakClient) read(ctx context.Context, c *soakCall, clientIndex uint64) {
	rng := rand.New(rand.NewPCG(cl.s.seed^uint64(c.index), clientIndex+100))
	if rng.Float64() > 0.3 {
		return
	}
	cs, err := cl.connect(ctx)
	if err != nil {
		cl.s.reads.add("error")
		return
	}
	defer cs.Close()
	var tool string
	var args map[string]any
	switch rng.IntN(3) {
	case 0:
		if c.bridged {
			return // its executions are the local actor's, not this client's
		}
		o := cl.s.obs[c.tag]
		o.mu.Lock()
		id := ""
		for k := range o.views {
			id = k
		}
		o.mu.Unlock()
		if id == "" {
			return
		}
		tool, args = "execution_status", map[string]any{"execution_id": id}
	case 1:
		tool, args = "executions_list", map[string]any{"limit": 20}
	default:
		tool, args = "hosts_list", map[string]any{}
	}
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args}); err != nil || res.IsError {
		cl.s.reads.add("error")
		return
	}
	cl.s.reads.add(tool)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// injectFaults runs the seeded fault schedule until done is closed. Every fault leaves the
// system whole again before the next one (a killed process is restarted, a frozen link
// thawed), after a random outage.
func (s *soak) injectFaults(t *testing.T, rng *rand.Rand, done <-chan struct{}) {
	t.Helper()
	kinds := []struct {
		kind   string
		weight int
	}{
		{faultHostCut, 4}, {faultHostFreeze, 1}, {faultBastionKill, 2}, {faultHostagentKill, 2},
		{faultShimKill, 3}, {faultPluginKill, 2},
	}
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	outage := func() time.Duration { return time.Duration(rng.IntN(400)) * time.Millisecond }
	// Every kind is owed once before the weighted picks begin, so a short soak injects each
	// whatever its seed (the checker fails a soak that injected a kind 0 times).
	owed := make([]string, len(kinds))
	for i, k := range kinds {
		owed[i] = k.kind
	}
	for {
		select {
		case <-done:
			return
		case <-time.After(time.Duration(100+rng.IntN(400)) * time.Millisecond):
		}
		var kind string
		if len(owed) > 0 {
			kind = owed[rng.IntN(len(owed))]
		} else {
			pick := rng.IntN(total)
			for _, k := range kinds {
				if pick < k.weight {
					kind = k.kind
					break
				}
				pick -= k.weight
			}
		}
		h := s.hosts[rng.IntN(len(s.hosts))]
		if h.agent == nil && (kind == faultHostagentKill || kind == faultShimKill) {
			h = s.hosts[rng.IntN(2)] // the hostagents
		}
		switch kind {
		case faultHostCut:
			h.proxy.Cut()
		case faultHostFreeze:
			h.proxy.Freeze()
			time.Sleep(time.Duration(100+rng.IntN(1500)) * time.Millisecond)
			h.proxy.Thaw()
		case faultBastionKill:
			s.fleet.bastion.Kill(t)
			time.Sleep(outage())
			s.fleet.bastion.Start(t)
		case faultHostagentKill:
			h.agent.Kill(t)
			time.Sleep(outage())
			h.agent.Start(t)
		case faultShimKill:
			if !killASupervisor(h, rng) {
				continue
			}
		case faultPluginKill:
			pid := pluginPID(t, s.fleet.bastion.PID())
			if pid == 0 || syscall.Kill(pid, syscall.SIGKILL) != nil {
				continue
			}
		}
		s.faults.add(kind)
		owed = slices.DeleteFunc(owed, func(k string) bool { return k == kind })
	}
}

// killASupervisor SIGKILLs the supervisor of a command running on h (one picked at random), found
// by the supervisor record in its spool dir — its keeper finishes every command it ran, so no
// outcome is lost (the checker fails an interrupted host marker); false if no command runs.
func killASupervisor(h *soakHost, rng *rand.Rand) bool {
	spool := filepath.Join(h.agent.DataDir, "spool")
	entries, err := os.ReadDir(spool)
	if err != nil {
		return false
	}
	var live []int
	for _, e := range entries {
		pid := supervisorPIDOf(filepath.Join(spool, e.Name()))
		if pid > 0 && !processGone(pid) {
			if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); filepath.Base(exe) == hostagent.SupervisorBinary {
				live = append(live, pid)
			}
		}
	}
	if len(live) == 0 {
		return false
	}
	sort.Ints(live)
	return syscall.Kill(live[rng.IntN(len(live))], syscall.SIGKILL) == nil
}

// restoreAll brings every process and link back once the faults stopped.
func (s *soak) restoreAll(t *testing.T) {
	t.Helper()
	for _, h := range s.hosts {
		h.proxy.Thaw()
		if h.agent != nil && h.agent.PID() == 0 {
			h.agent.Start(t)
		}
	}
	if s.fleet.bastion.PID() == 0 {
		s.fleet.bastion.Start(t)
	}
}

// supervisorPIDOf reads the supervisor record in an execution's spool dir (0 if there is none yet).
func supervisorPIDOf(spool string) int {
	var rec struct {
		PID int `json:"pid"`
	}
	b, err := os.ReadFile(filepath.Join(spool, supervisor.SupervisorFile))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return 0
	}
	return rec.PID
}
