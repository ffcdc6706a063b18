package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// soakHAShortCalls is the CI size of the HA soak; POSTERN_HA_SOAK_CALLS overrides it.
const soakHAShortCalls = 48

// TestSoakReplicas is the soak in HA mode: three bastion replicas on a 3-member etcd cluster,
// clients that retry blindly on any replica (and sometimes send one call to two replicas at
// once), and replicas SIGKILLed and restarted from a seeded schedule. It then checks from the
// outside (the host's effects file) and the inside (each execution's final state, the audit
// chain): 0 duplicates, 0 lost.
func TestSoakReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("the HA soak runs real processes; skipped with -short")
	}
	calls := soakHAShortCalls
	if s := os.Getenv("POSTERN_HA_SOAK_CALLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("POSTERN_HA_SOAK_CALLS=%q: want a positive number", s)
		}
		calls = n
	}
	seed := testutil.Seed(t)
	f := startHAFleet(t, 3)
	effectsFile := filepath.Join(t.TempDir(), "effects")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	const clients = 4
	// seen are the execution ids clients were answered with, by call; ended those they saw
	// end (a delivered result); keyed the calls with an idempotency_key.
	seen := make([]map[string]bool, calls)
	ended := make([]map[string]bool, calls)
	keyed := make([]bool, calls)
	for i := range calls {
		seen[i], ended[i] = map[string]bool{}, map[string]bool{}
	}
	var seenMu sync.Mutex
	var kills int
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for i := c; i < calls; i += clients {
				tag := fmt.Sprintf("ha-%05d", i)
				cmd := fmt.Sprintf(`echo "$POSTERN_EXECUTION_ID %s" >> '%s'; sleep %s`, tag, effectsFile, []string{"0.05", "0.3", "1", "2"}[rng.IntN(4)])
				args := map[string]any{"host": "h1", "command": cmd, "wait_s": 10}
				if rng.IntN(2) == 0 {
					args["idempotency_key"] = "key-" + tag
					keyed[i] = true
				}
				senders := 1
				if rng.IntN(5) == 0 {
					senders = 2 // the same call to two replicas at once
				}
				var sw sync.WaitGroup
				for s := range senders {
					sw.Go(func() {
						id, end := haCall(ctx, f, fmt.Sprint("run-", c), args, rand.New(rand.NewPCG(seed^uint64(i), uint64(s))))
						seenMu.Lock()
						if id != "" {
							seen[i][id] = true
						}
						if end {
							ended[i][id] = true
						}
						seenMu.Unlock()
					})
				}
				sw.Wait()
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	// Faults: a replica SIGKILLed (mid-command or not), restarted after a random outage.
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
faults:
	for {
		select {
		case <-done:
			break faults
		case <-time.After(time.Duration(500+rng.IntN(1500)) * time.Millisecond):
		}
		r := f.replicas[rng.IntN(len(f.replicas))]
		r.Kill(t)
		kills++
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		r.Start(t)
	}
	load := time.Since(start)

	// Settle: every execution a client was answered with ends (taken over where its replica
	// died, reconciled with the host).
	cs := f.session(t, 0, "checker")
	lost := 0
	final := map[string]api.Execution{}
	for i := range seen {
		if len(seen[i]) == 0 {
			t.Errorf("call %d was never answered with an execution", i)
			lost++
		}
		for id := range seen[i] {
			var x api.Execution
			deadline := time.Now().Add(time.Minute)
			for {
				var err error
				x, err = callExecution(ctx, cs, "execution_status", map[string]any{"execution_id": id})
				if err == nil && markers.JournalGraph.Terminal(markers.State(x.State)) || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if x.State != "completed" {
				t.Errorf("call %d (%s) ended %q, want completed: %+v", i, id, x.State, x)
				lost++
			}
			final[id] = x
		}
	}
	// The outside: every call's line once, by an execution a client was answered with. A
	// second execution of an unkeyed call after a client received the first's result is the
	// matching rule's new intent (one of the two senders of a call sent to two replicas came
	// back after the other had its result), counted apart.
	data, err := os.ReadFile(effectsFile)
	if err != nil {
		t.Fatal(err)
	}
	byTag := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		id, tag, _ := strings.Cut(line, " ")
		byTag[tag] = append(byTag[tag], id)
	}
	dups, newIntents := 0, 0
	for i := range seen {
		tag := fmt.Sprintf("ha-%05d", i)
		got := byTag[tag]
		for _, id := range got {
			if !seen[i][id] {
				t.Errorf("%s ran as %s, which no client was answered with", tag, id)
				lost++
			}
		}
		if len(got) == 0 && len(seen[i]) > 0 {
			t.Errorf("%s (%v) never ran", tag, seen[i])
			lost++
		}
		for k := 1; k < len(got); k++ {
			prev, next := final[got[k-1]], final[got[k]]
			if !keyed[i] && ended[i][prev.ExecutionID] && prev.FinishedAt != nil && prev.FinishedAt.Before(next.AcceptedAt) {
				newIntents++
				continue
			}
			t.Errorf("%s (keyed %v) ran as %s and %s", tag, keyed[i], prev.ExecutionID, next.ExecutionID)
			dups++
		}
	}
	out, err := exec.Command(harness.Binary(t, "postern"), "audit", "verify", "--require-sealed", "--config", f.replicas[0].ConfigPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Errorf("audit verify: %v\n%s", err, out)
	}
	t.Logf("HA soak (seed %d): %d calls by %d clients over %v, %d replica kills; %d duplicates, %d lost, %d new intents after a delivered result (unkeyed); %s",
		seed, calls, clients, load.Round(time.Millisecond), kills, dups, lost, newIntents, strings.TrimSpace(string(out)))
}

// haCall makes one call until it sees a terminal state, retrying blindly on a random replica
// after any error; it returns the execution id it was last answered with ("" if never) and
// whether it saw that execution end.
func haCall(ctx context.Context, f *haFleet, run string, args map[string]any, rng *rand.Rand) (string, bool) {
	id := ""
	for attempt := range 20 {
		r := f.replicas[rng.IntN(len(f.replicas))]
		if r.PID() == 0 {
			continue
		}
		x, err := func() (api.Execution, error) {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			cs, err := connectQuietly(cctx, r, run)
			if err != nil {
				return api.Execution{}, err
			}
			defer cs.Close()
			return callExecution(cctx, cs, "ssh_exec", args)
		}()
		if err == nil && x.ExecutionID != "" {
			id = x.ExecutionID
			if markers.JournalGraph.Terminal(markers.State(x.State)) {
				return id, true
			}
		}
		time.Sleep(time.Duration(50+rng.IntN(100*(attempt+1))) * time.Millisecond)
	}
	return id, false
}

// connectQuietly is Connect returning the error (the replica may be down).
func connectQuietly(ctx context.Context, b *harness.Bastion, run string) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "postern-ha-soak", Version: "0"}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL, HTTPClient: b.HTTPClient("agent", runHeader(run), nil), MaxRetries: -1}, nil)
}
