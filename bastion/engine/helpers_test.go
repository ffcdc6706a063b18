package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// These tests run the engine's public operations end to end: a real journal (Pebble in a
// temp state dir) and a real postern-hostagent process on 127.0.0.1, enrolled as "h1".
// Commands count their side effects in files of a scratch dir, so a test sees on disk how
// often something ran.

func TestMain(m *testing.M) {
	code := m.Run()
	harness.CleanupBinaries()
	os.Exit(code)
}

// The callers of the tests: two remote actors, each configured with its token.
var (
	alice = transport.Caller{Actor: "token:alice"}
	bob   = transport.Caller{Actor: "token:bob"}
)

// inRun is c calling from agent run run (its Postern-Run header).
func inRun(c transport.Caller, run string) transport.Caller {
	c.RunID = run
	return c
}

// testFleet is an engine on a fresh state dir with a real hostagent enrolled as "h1".
type testFleet struct {
	cfg   config.Config
	host  *harness.Hostagent
	dir   string // where commands write their side effects
	clock *clock
	logs  testutil.LockedBuffer

	mu     sync.Mutex // guards e and closed
	e      *engine.Engine
	closed bool
}

// testOperator decides approvals and reviews in the tests: a uid no agent runs as (the
// tests run the engine as root, the bastion's own user, which may not approve by default).
var testOperator = api.Operator{Name: "op", UID: 4242}

// newFleet starts a hostagent and opens an engine (recovered, serving) whose config — two
// actors alice and bob, no rules, a reconcile loop that does not tick during a test —
// adjust may change first.
func newFleet(t testing.TB, adjust ...func(*config.Config)) *testFleet {
	t.Helper()
	return newFleetOn(t, harness.StartHostagent(t), adjust...)
}

// newFleetOn is newFleet with host, started, as the fleet's hostagent.
func newFleetOn(t testing.TB, host *harness.Hostagent, adjust ...func(*config.Config)) *testFleet {
	t.Helper()
	f := &testFleet{dir: t.TempDir(), clock: &clock{}}
	f.host = host
	f.cfg = config.DefaultConfig(t.TempDir())
	f.cfg.Listen = ""
	f.cfg.ReconcileInterval = time.Hour
	f.cfg.Actors = []policy.Actor{
		{Name: "alice", TokenSHA256: transport.HashToken("alice")},
		{Name: "bob", TokenSHA256: transport.HashToken("bob")},
	}
	for _, fn := range adjust {
		fn(&f.cfg)
	}
	if err := os.MkdirAll(f.cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	f.host.ClientKey.WritePrivateKey(t, f.cfg.ClientKeyPath())
	f.enroll(t, f.hostAs("h1"))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("engine log:\n%s\nhostagent log:\n%s", f.logs.String(), f.host.Logs())
		}
	})
	f.open(t)
	return f
}

// enroll adds h to the inventory (the engine reads it on every lookup).
func (f *testFleet) enroll(t testing.TB, h fleet.Host) {
	t.Helper()
	if err := fleet.Enroll(f.cfg.InventoryPath(), h); err != nil {
		t.Fatal(err)
	}
}

// hostAs is the fleet's hostagent as an inventory entry named name.
func (f *testFleet) hostAs(name string) fleet.Host {
	return fleet.Host{Name: name, Addr: f.host.Addr, Account: f.host.Account, HostKey: f.host.HostKey}
}

// alias enrolls the fleet's hostagent under another name as well (its own policy rules can
// then apply to it).
func (f *testFleet) alias(t testing.TB, name string) {
	t.Helper()
	f.enroll(t, f.hostAs(name))
}

// approvalRule requires an operator's approval for every command on host.
func approvalRule(host string) policy.Rule {
	return policy.Rule{Name: "ask-on-" + host, Decision: policy.DecisionApprove, Hosts: []string{host}}
}

// open opens an engine on the fleet's state dir and recovers it; it is closed at cleanup.
func (f *testFleet) open(t testing.TB) *engine.Engine {
	t.Helper()
	e, err := engine.Open(engine.Options{
		Config: f.cfg,
		Logger: slog.New(slog.NewTextHandler(&f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:    f.clock.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.e, f.closed = e, false
	f.mu.Unlock()
	t.Cleanup(func() { f.closeEngine(t, e) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// engine is the engine open now.
func (f *testFleet) engine() *engine.Engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.e
}

// reopen closes the engine (commands go on on the host) and opens a new one on the same
// state dir, which recovers what the journal shows in flight.
func (f *testFleet) reopen(t testing.TB) *engine.Engine {
	t.Helper()
	f.closeEngine(t, f.engine())
	return f.open(t)
}

func (f *testFleet) closeEngine(t testing.TB, e *engine.Engine) {
	t.Helper()
	f.mu.Lock()
	if f.closed || f.e != e {
		f.mu.Unlock()
		return
	}
	f.closed = true
	f.mu.Unlock()
	if err := e.Close(); err != nil {
		t.Errorf("close engine: %v", err)
	}
}

// path is name in the fleet's scratch dir.
func (f *testFleet) path(name string) string { return filepath.Join(f.dir, name) }

// effect is a command line that appends one line to the side-effect file name.
func (f *testFleet) effect(name string) string { return "echo x >> " + f.path(name) }

// count is how many side effects name recorded.
func (f *testFleet) count(t testing.TB, name string) int {
	t.Helper()
	data, err := os.ReadFile(f.path(name))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// gate is a command line that waits until release(name) is called.
func (f *testFleet) gate(name string) string {
	return "while [ ! -e " + f.path(name+".open") + " ]; do sleep 0.02; done"
}

// release lets the commands waiting at gate name go on.
func (f *testFleet) release(t testing.TB, name string) {
	t.Helper()
	if err := os.WriteFile(f.path(name+".open"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// exec runs a call and fails the test if the engine refuses it.
func (f *testFleet) exec(t testing.TB, c transport.Caller, a api.ExecArgs) *api.Execution {
	t.Helper()
	x, err := f.engine().Exec(context.Background(), c, a, nil)
	if err != nil {
		t.Fatalf("exec %q as %s: %v", a.Command, c.Actor, err)
	}
	return x
}

// waitState waits until c's execution id is in state want.
func (f *testFleet) waitState(t testing.TB, c transport.Caller, id string, want markers.State) *api.ExecutionState {
	t.Helper()
	var st *api.ExecutionState
	testutil.WaitFor(t, id+" to be "+string(want), func() bool {
		var err error
		if st, err = f.engine().State(c, id); err != nil {
			t.Fatalf("state of %s: %v", id, err)
		}
		return st.State == string(want)
	})
	return st
}

// record is the journal's record of id.
func (f *testFleet) record(t testing.TB, id string) *markers.Record {
	t.Helper()
	rec, err := f.engine().Journal().Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// journaled is how many executions the journal holds.
func (f *testFleet) journaled(t testing.TB) int {
	t.Helper()
	page, err := f.engine().Executions(api.ExecutionQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(page.Executions)
}

// hostMarker asks the fleet's hostagent itself, not through the engine, for its marker of
// id (nil: it has none).
func (f *testFleet) hostMarker(t testing.TB, id string) *hostproto.Marker {
	t.Helper()
	client := f.host.Dial(t)
	defer client.Close()
	cc, err := hostproto.DialControl(client)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return harness.Marker(t, ctx, cc, id)
}

// investigated is the investigation of id, its answer index i (0..4: who sent the calls,
// authorization, outcome, delivery, later calls).
func (f *testFleet) investigated(t testing.TB, id string, i int) string {
	t.Helper()
	inv, err := f.engine().Investigate(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return inv.Answers[i]
}

// Answers of an investigation (testFleet.investigated).
const (
	answerWho = iota
	answerAuthorization
	answerOutcome
	answerDelivery
	answerLater
)

// joinIDs is the ids of xs (by id), comma-separated: a page as a test compares it with the
// ids it wants.
func joinIDs[T any](xs []T, id func(T) string) string {
	ids := make([]string, len(xs))
	for i, x := range xs {
		ids[i] = id(x)
	}
	return strings.Join(ids, ",")
}

// Ids of the engine's pages (joinIDs).
func recordID(r *markers.Record) string   { return r.ID }
func executionID(x *api.Execution) string { return x.ExecutionID }

// waitS is a wait_s argument.
func waitS(n int) *int { return &n }

// wantCode fails the test unless err is a ToolError with code.
func wantCode(t testing.TB, err error, code string) *api.ToolError {
	t.Helper()
	var te *api.ToolError
	if !errors.As(err, &te) || te.Code != code {
		t.Fatalf("err = %v; want a tool error %s", err, code)
	}
	return te
}

// finished checks that x completed with exit status 0.
func finished(t testing.TB, x *api.Execution) {
	t.Helper()
	if x.State != string(markers.Completed) || x.ExitCode == nil || *x.ExitCode != 0 {
		t.Fatalf("execution %s = %s (exit %v, evidence %q); want completed with exit 0", x.ExecutionID, x.State, x.ExitCode, x.Evidence)
	}
}

// clock is the engine's clock: real time, moved ahead by advance.
type clock struct {
	mu  sync.Mutex // guards off
	off time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}
