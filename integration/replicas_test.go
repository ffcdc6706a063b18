package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// haFleet is N bastion replicas (`postern serve` processes) on one journal in a 3-member
// etcd cluster started in the test, with one enrolled hostagent ("h1").
type haFleet struct {
	etcd     *etcdtest.Cluster
	replicas []*harness.Bastion
	host     *harness.Hostagent
	// journal is the [journal] table of replica i's config.
	journal func(i int) string
}

// startHAFleet starts the cluster, the hostagent and n replicas (extraConfig: settings, then
// tables, for every replica's config). Replica 0 starts first and
// makes the state every replica shares (fingerprint key, audit key, client key, inventory —
// what an operator copies to each replica); the others get copies of it.
func startHAFleet(t testing.TB, n int, extraConfig ...string) *haFleet {
	t.Helper()
	return startHAFleetTTL(t, n, "2s", extraConfig...)
}

// startHAFleetTTL is startHAFleet with the replicas' lease_ttl.
func startHAFleetTTL(t testing.TB, n int, leaseTTL string, extraConfig ...string) *haFleet {
	t.Helper()
	return startHAFleetJournal(t, n, fmt.Sprintf("lease_ttl = %q", leaseTTL), extraConfig...)
}

// startHAFleetJournal is startHAFleet with journalSettings (key = value lines) added to each
// replica's [journal] table; lease_ttl is 2s unless they set it.
func startHAFleetJournal(t testing.TB, n int, journalSettings string, extraConfig ...string) *haFleet {
	t.Helper()
	if !strings.Contains(journalSettings, "lease_ttl") {
		journalSettings += "\nlease_ttl = \"2s\""
	}
	f := &haFleet{etcd: etcdtest.Start(t, 3), host: harness.StartHostagent(t)}
	eps := `"` + strings.Join(f.etcd.Endpoints(), `", "`) + `"`
	prefix := "/" + t.Name() + "/"
	f.journal = func(i int) string {
		return fmt.Sprintf("[journal]\nbackend = \"etcd\"\nendpoints = [%s]\nprefix = %q\nreplica = \"r%d\"\ntimeout = \"2s\"\n%s", eps, prefix, i, journalSettings)
	}
	for i := range n {
		b := harness.NewBastion(t, f.host.ClientKey, append(extraConfig, f.journal(i))...)
		if i == 0 {
			b.Enroll(t, "h1", f.host)
			b.Start(t)
		} else {
			b.Tokens = f.replicas[0].Tokens
			shareState(t, f.replicas[0], b)
			b.Start(t)
		}
		f.replicas = append(f.replicas, b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, b := range f.replicas {
				t.Logf("replica %d log:\n%s", i, b.Logs())
			}
			t.Logf("hostagent log:\n%s", f.host.Logs())
		}
	})
	return f
}

// shareState copies from's keys, inventory and actors to to.
func shareState(t testing.TB, from, to *harness.Bastion) {
	t.Helper()
	for _, name := range []string{"fingerprint.key", "audit.key", "audit.key.pub", "hosts.toml"} {
		data, err := os.ReadFile(filepath.Join(from.StateDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to.StateDir(), name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The same actors (tokens): the config's [[actors]] tables.
	src, err := os.ReadFile(from.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.ReadFile(to.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(string(dst), "[[actors]]")
	_, actors, _ := strings.Cut(string(src), "[[actors]]")
	if err := os.WriteFile(to.ConfigPath, []byte(head+"[[actors]]"+actors), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *haFleet) session(t *testing.T, replica int, run string) *mcp.ClientSession {
	t.Helper()
	return f.replicas[replica].Connect(t, "agent", runHeader(run))
}

// Identical calls on different replicas at once are one execution: one side effect.
func TestReplicasIdenticalConcurrentCallsAreOneExecution(t *testing.T) {
	f := startHAFleet(t, 3)
	ctx := testContext(t)
	for round := range 3 {
		cmd, file := appendCommand(t, fmt.Sprint("once-", round))
		cmd += "; sleep 0.5"
		var wg sync.WaitGroup
		xs := make([]api.Execution, len(f.replicas))
		for i := range f.replicas {
			cs := f.session(t, i, "run-1")
			wg.Go(func() { xs[i] = mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd}) })
		}
		wg.Wait()
		for i, x := range xs {
			if x.ExecutionID != xs[0].ExecutionID {
				t.Fatalf("round %d: replica %d answered %s, replica 0 %s", round, i, x.ExecutionID, xs[0].ExecutionID)
			}
		}
		if n := effects(t, file); n != 1 {
			t.Fatalf("round %d: the command ran %d times, want 1", round, n)
		}
	}
}

// The replica driving a command is SIGKILLed mid-command: another replica takes it over
// (its lease expired) and reconciles it with the host; a retry on any replica attaches to
// it; the command ran once.
func TestReplicaKilledMidCommandIsTakenOver(t *testing.T) {
	f := startHAFleet(t, 3)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "taken-over")
	cmd += "; sleep 3; echo finished"
	args := map[string]any{"host": "h1", "command": cmd, "wait_s": 0}
	first := mustCall(t, ctx, f.session(t, 0, "run-1"), "ssh_exec", args)
	if first.State != "dispatched" && first.State != "running" {
		t.Fatalf("first call: %+v", first)
	}
	f.replicas[0].Kill(t)
	retry := mustCall(t, ctx, f.session(t, 1, "run-1"), "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 30})
	if retry.ExecutionID != first.ExecutionID || retry.State != "completed" || !strings.Contains(retry.Stdout, "finished") {
		t.Fatalf("retry on replica 1: %+v; want %s completed", retry, first.ExecutionID)
	}
	again := mustCall(t, ctx, f.session(t, 2, "run-1"), "execution_status", map[string]any{"execution_id": first.ExecutionID})
	if again.State != "completed" {
		t.Fatalf("status on replica 2: %+v", again)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
}

// A replica stopped cleanly (SIGTERM) hands its executions over: another replica takes the
// one it drove over at once — with no call arriving for it, and long before the stopped
// replica's lease (30s here) would have expired — reconciles it with its host (it attaches:
// the command runs once, and its outcome is journaled) and journals the take-over, naming both
// replicas, which investigate and executions show report with the replica of each call.
func TestReplicaStoppedHandsItsExecutionsOver(t *testing.T) {
	f := startHAFleetTTL(t, 3, "30s")
	ctx := testContext(t)
	cmd, file := appendCommand(t, "handed-over")
	// The command runs until the test releases it after the take-over (at most 60 s): a
	// fixed sleep could end on the loaded machine before the stop, and then there is
	// nothing to hand over.
	release := filepath.Join(t.TempDir(), "release")
	cmd += fmt.Sprintf("; i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo finished", release)
	first := mustCall(t, ctx, f.session(t, 0, "run-1"), "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 0})
	if first.State != "dispatched" && first.State != "running" {
		t.Fatalf("first call: %+v", first)
	}
	testutil.WaitFor(t, "the command to run on the host", func() bool { return effects(t, file) == 1 })
	stopped := time.Now()
	f.replicas[0].Stop(t)
	var takenOver time.Duration
	var by string
	testutil.WaitFor(t, "another replica to take the execution over", func() bool {
		rec := journaled(t, f.replicas[1], first.ExecutionID)
		if rec.Replica == "r0" {
			return false
		}
		takenOver, by = time.Since(stopped), rec.Replica
		return true
	})
	t.Logf("taken over by %s %v after the stop", by, takenOver.Round(time.Millisecond))
	if takenOver >= 30*time.Second {
		t.Fatalf("taken over %v after the stop: not before the lease expired", takenOver)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := waitForJournalState(t, f.replicas[1], first.ExecutionID, markers.Completed)
	if rec.Replica != by || !hasEvidence(rec, "taken over by replica "+by+" from r0 (r0 handed it over as it stopped)") || !hasEvidence(rec, "attaching") {
		t.Fatalf("the completed record: replica %s, evidence %q", rec.Replica, rec.Evidence)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}
	inv := string(postern(t, f.replicas[1], "investigate", first.ExecutionID))
	for _, want := range []string{"accepted by replica r0", "taken over by replica " + by + " from r0", "REPLICA", "  r0  "} {
		if !strings.Contains(inv, want) {
			t.Errorf("investigate does not say %q:\n%s", want, inv)
		}
	}
	show := string(postern(t, f.replicas[1], "executions", "show", first.ExecutionID))
	if !strings.Contains(show, "replica r0") || !strings.Contains(show, "taken over by replica "+by) {
		t.Errorf("executions show names no replica:\n%s", show)
	}
}

// A replica started without copies of the first one's keys makes its own, and is refused:
// with another fingerprint key no retry on it would match the others' executions, with
// another audit key the chain would not verify.
func TestReplicaWithItsOwnKeysIsRefused(t *testing.T) {
	f := startHAFleet(t, 1)
	b := harness.NewBastion(t, f.host.ClientKey, f.journal(1))
	out, err := exec.Command(harness.Binary(t, "postern"), "serve", "--config", b.ConfigPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "keys differ from the ones its journal's replicas share") ||
		!strings.Contains(string(out), "copy fingerprint.key, audit.key and audit.key.pub") {
		t.Fatalf("a replica with its own keys: %v\n%s", err, out)
	}
	shareState(t, f.replicas[0], b)
	b.Start(t)
}

// One etcd member stops while a command runs: quorum holds, nothing is interrupted. Then a
// second one stops: calls fail closed (nothing dispatched, a clear error); when a member
// returns, service does.
func TestReplicasAcrossEtcdMemberLoss(t *testing.T) {
	f := startHAFleet(t, 2)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "through")
	cmd += "; sleep 1"
	cs := f.session(t, 0, "run-1")
	started := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 0})
	f.etcd.Stop(0)
	done := mustCall(t, ctx, f.session(t, 1, "run-1"), "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 30})
	if done.ExecutionID != started.ExecutionID || done.State != "completed" {
		t.Fatalf("after one member stopped: %+v", done)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times, want 1", n)
	}

	f.etcd.Stop(1)
	lost, lostFile := appendCommand(t, "no-quorum")
	msg := mustRefuse(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": lost})
	if !strings.Contains(msg, "nothing was dispatched") {
		t.Fatalf("without quorum: %q; want a journal error saying nothing was dispatched", msg)
	}
	if n := effects(t, lostFile); n != 0 {
		t.Fatalf("a command ran %d times without quorum", n)
	}

	f.etcd.Restart(1)
	f.etcd.Ready()
	var back api.Execution
	testutil.WaitFor(t, "service after quorum returned", func() bool {
		x, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": lost, "wait_s": 30})
		if err != nil && !errors.Is(err, errToolError) {
			t.Fatal(err)
		}
		back = x
		return err == nil
	})
	if back.State != "completed" {
		t.Fatalf("after quorum returned: %+v", back)
	}
	if n := effects(t, lostFile); n != 1 {
		t.Fatalf("the command ran %d times after quorum returned, want 1", n)
	}
}

// A replica is SIGKILLed while the target holds an http_request (which took effect): another
// replica takes the execution over and the class decides, as after a single node's restart —
// idempotent_write is sent again with the same Idempotency-Key (the target replays it),
// irreversible stays unknown for review. The retry, on another replica, gets the same
// execution either way.
func TestReplicasHTTPReplicaKilledMidRequest(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, wantState string
		wantSent                  int
	}{
		{name: "idempotent_write", endpoint: epIdempotent, wantState: "completed", wantSent: 2},
		{name: "irreversible", endpoint: epIrreversible, wantState: "unknown", wantSent: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{})
			secret := filepath.Join(t.TempDir(), "api.secret")
			if err := os.WriteFile(secret, []byte("s3cr3t-ha\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			plugin, sum := harness.HTTPPlugin(t)
			f := startHAFleet(t, 2,
				fmt.Sprintf("[http_plugin]\npath = %q\nsha256 = %q", plugin, sum),
				fmt.Sprintf("[[credentials]]\nname = \"api\"\nkind = \"bearer\"\nfile = %q", secret),
				endpointTable(tc.endpoint, target.URL, map[string]string{epIdempotent: config.ClassIdempotentWrite, epIrreversible: config.ClassIrreversible}[tc.endpoint]))
			ctx := testContext(t)
			const path = "/v1/payments/ha"
			target.Arm(path, testutil.FaultHold)
			args := payment(tc.endpoint, path, 12)
			lost := make(chan error, 1)
			go func() {
				_, err := callExecution(ctx, f.session(t, 0, "run-ha"), "http_request", args)
				lost <- err
			}()
			target.WaitHeld(t, path)
			f.replicas[0].Kill(t)
			if err := <-lost; err == nil {
				t.Fatal("the call returned a result from a killed replica")
			}
			target.Release(path)
			x := mustCall(t, ctx, f.session(t, 1, "run-ha"), "http_request", args)
			if x.State != tc.wantState || !x.Replayed {
				t.Fatalf("retry on replica 1 = %+v; want the execution, replayed, %s", x, tc.wantState)
			}
			if reqs := target.RequestsTo(path); len(reqs) != tc.wantSent || target.Effects(x.ExecutionID) != 1 {
				t.Fatalf("target saw %d requests, %d effects for %s; want %d, 1", len(reqs), target.Effects(x.ExecutionID), x.ExecutionID, tc.wantSent)
			}
		})
	}
}

// A client's notifications/cancelled is a POST of its own, which the load balancer may send
// to another replica than the one that served the request: the cancel still revokes the
// delivery there (it is published through etcd), and the re-issue — on the other replica —
// gets the first execution replayed: one effect.
func TestReplicasCancelOnAnotherReplica(t *testing.T) {
	f := startHAFleet(t, 2)
	ctx := testContext(t)
	cmd, file := appendCommand(t, "cancel-elsewhere")
	_, post0 := rawPoster(t, ctx, f.replicas[0])
	_, post1 := rawPoster(t, ctx, f.replicas[1])
	call := func(id int) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
			"params": map[string]any{"name": "ssh_exec", "arguments": map[string]any{"host": "h1", "command": cmd, "wait_s": 30}}}
	}
	first := sseResult(t, post0(call(1)))
	if first.State != "completed" {
		t.Fatalf("first call = %+v; want completed", first)
	}
	testutil.WaitFor(t, "the first result to be journaled as delivered", func() bool {
		return journaled(t, f.replicas[0], first.ExecutionID).ResultDeliveredAt != nil
	})
	post1(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": 1, "reason": "timeout"}})
	testutil.WaitFor(t, "the replica that served the call to revoke its delivery", func() bool {
		return journaled(t, f.replicas[1], first.ExecutionID).ResultDeliveredAt == nil
	})
	again := sseResult(t, post1(call(2)))
	if again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Fatalf("re-issue = %s (replayed %v); want %s replayed: the client cancelled the first call", again.ExecutionID, again.Replayed, first.ExecutionID)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}
