package etcdjournal_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
)

// replicas opens n journals on one prefix of a 3-member cluster: n bastion replicas.
func replicas(t *testing.T, c *etcdtest.Cluster, n int, ttl time.Duration) ([]*etcdjournal.Journal, string) {
	t.Helper()
	prefix := "/" + t.Name() + "/"
	signer, verifier, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	var js []*etcdjournal.Journal
	for i := range n {
		j, err := etcdjournal.Open(etcdjournal.Options{
			Client: c.Client(), Prefix: prefix, Replica: fmt.Sprintf("r%d", i), LeaseTTL: ttl, OpTimeout: 3 * time.Second,
			Markers: markers.Options{Signer: signer, Origin: "postern test journal", CheckpointEvery: 7},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		js = append(js, j)
	}
	return js, verifier
}

// TestJournal runs the journal's semantics on one 3-member cluster, each on its own prefix.
func TestJournal(t *testing.T) {
	c := etcdtest.Start(t, 3)
	for name, f := range map[string]func(*testing.T, *etcdtest.Cluster){
		"CreateIfAbsentAcrossReplicas": testCreateIfAbsentAcrossReplicas,
		"IntentRaceIsDetected":         testIntentRaceIsDetected,
		"UnseenIndexEntryIsRaced":      testUnseenIndexEntryIsRaced,
		"CancelsReachOtherReplicas":    testCancelsReachOtherReplicas,
		"CloseHandsOverAtOnce":         testCloseHandsOverAtOnce,
		"TransitionsCompareAndSet":     testTransitionsCompareAndSet,
		"OneChainAcrossReplicas":       testOneChainAcrossReplicas,
		"OwnershipFollowsTheLease":     testOwnershipFollowsTheLease,
	} {
		t.Run(name, func(t *testing.T) { f(t, c) })
	}
}

func newRecord(id, fp string) *markers.Record {
	return &markers.Record{ID: id, Actor: "alice", IntentScope: "run:1", Fingerprint: fp, Host: "web1", Channel: "ssh"}
}

func testCreateIfAbsentAcrossReplicas(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 3, 5*time.Second)
	ctx := context.Background()
	for round := range 5 {
		id := fmt.Sprintf("01JCREATE%017d", round)
		var wg sync.WaitGroup
		errs := make([]error, len(js))
		for i, j := range js {
			wg.Go(func() { _, errs[i] = j.Create(ctx, newRecord(id, fmt.Sprintf("fp%d", round))) })
		}
		wg.Wait()
		created := 0
		for _, err := range errs {
			switch {
			case err == nil:
				created++
			case !errors.Is(err, markers.ErrExists):
				t.Fatalf("create: %v", err)
			}
		}
		if created != 1 {
			t.Fatalf("round %d: %d creates succeeded, want 1", round, created)
		}
	}
}

// Identical calls matched on two replicas at once: the second create sees the index entry
// taken after its lookup, and is ErrRaced (its caller matches again and joins).
func testIntentRaceIsDetected(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 2, 5*time.Second)
	ctx := context.Background()
	for _, j := range js {
		if _, err := j.FindByFingerprint("alice", "run:1", "same"); !errors.Is(err, markers.ErrNotFound) {
			t.Fatalf("lookup: %v", err)
		}
	}
	if _, err := js[0].Create(ctx, newRecord("01JRACE0000000000000000001", "same")); err != nil {
		t.Fatal(err)
	}
	if _, err := js[1].Create(ctx, newRecord("01JRACE0000000000000000002", "same")); !errors.Is(err, markers.ErrRaced) {
		t.Fatalf("second create: %v, want ErrRaced", err)
	}
	got, err := js[1].FindByFingerprint("alice", "run:1", "same")
	if err != nil || got.ID != "01JRACE0000000000000000001" {
		t.Fatalf("after the race: %v %v", got, err)
	}
}

// A create whose matched index entry this replica never looked up (or forgot: the lookups
// it remembers are bounded) is compared as absent: another replica's execution of the intent
// makes it ErrRaced instead of being overwritten by a second execution of one intent. The
// same for an idempotency key.
func testUnseenIndexEntryIsRaced(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 2, 5*time.Second)
	ctx := context.Background()
	keyed := func(id string) *markers.Record {
		r := newRecord(id, "keyed")
		r.IdempotencyKey = "k1"
		return r
	}
	for _, mk := range []func(string) *markers.Record{
		func(id string) *markers.Record { return newRecord(id, "unseen") },
		keyed,
	} {
		first, second := mk("01JSEEN0000000000000000001"), mk("01JSEEN0000000000000000002")
		if first.IdempotencyKey != "" {
			first.ID, second.ID = "01JSEEN0000000000000000003", "01JSEEN0000000000000000004"
		}
		if _, err := js[0].Create(ctx, first); err != nil {
			t.Fatal(err)
		}
		if _, err := js[1].Create(ctx, second); !errors.Is(err, markers.ErrRaced) {
			t.Fatalf("create of the same intent on the other replica, unseen: %v, want ErrRaced", err)
		}
		got := lookup(t, js[1], first)
		if got.ID != first.ID {
			t.Fatalf("index names %s, want %s", got.ID, first.ID)
		}
		if _, err := js[1].Get(second.ID); !errors.Is(err, markers.ErrNotFound) {
			t.Fatalf("the raced create wrote %s: %v", second.ID, err)
		}
	}
}

// A cancel published on one replica reaches the others' watches, not its own.
func testCancelsReachOtherReplicas(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 2, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	got := [2]chan string{make(chan string, 4), make(chan string, 4)}
	for i, j := range js {
		wg.Go(func() {
			j.WatchCancels(ctx, func(k []byte) {
				select {
				case got[i] <- string(k):
				default: // a repeat of the publish below
				}
			})
		})
	}
	// The watches start asynchronously: publish until replica 1 hears one.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := js[0].PublishCancel(ctx, []byte("alice/run:1/7")); err != nil {
			t.Fatal(err)
		}
		select {
		case k := <-got[1]:
			if k != "alice/run:1/7" {
				t.Fatalf("replica 1 heard %q", k)
			}
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("replica 1 never heard the cancel")
			}
			continue
		}
		break
	}
	if len(got[0]) != 0 {
		t.Fatalf("the publishing replica heard its own cancel: %q", <-got[0])
	}
}

// A replica that closes cleanly hands its executions over: it revokes its lease and
// publishes what it owned, so another replica hears of them and claims them at once, not a
// lease TTL later. LiveReplicas names the replicas serving until then.
func testCloseHandsOverAtOnce(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 2, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	id := "01JCLOSE000000000000000001"
	if _, err := js[0].CreateAdvancedFor(ctx, newRecord(id, "closing"), []markers.State{markers.Authorized, markers.Dispatched}, "dispatching", nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := js[1].Claim(ctx, id); err != nil || ok {
		t.Fatalf("claim while its owner serves: %v %v, want false", ok, err)
	}
	if live, err := js[1].LiveReplicas(ctx); err != nil || fmt.Sprint(live) != "[r0 r1]" {
		t.Fatalf("live replicas = %v, %v; want [r0 r1]", live, err)
	}
	heard := make(chan []string, 1)
	watching := make(chan struct{})
	wg.Go(func() {
		close(watching)
		js[1].WatchHandovers(ctx, func(from string, ids []string) {
			if from == "r0" {
				heard <- ids
			}
		})
	})
	<-watching
	time.Sleep(100 * time.Millisecond) // the watch starts asynchronously
	if err := js[0].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case ids := <-heard:
		if fmt.Sprint(ids) != "["+id+"]" {
			t.Fatalf("handed over %v; want [%s]", ids, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("replica 1 never heard the handover")
	}
	if ok, err := js[1].Claim(ctx, id); err != nil || !ok {
		t.Fatalf("claim after its owner closed: %v %v, want true", ok, err)
	}
	if live, err := js[1].LiveReplicas(ctx); err != nil || fmt.Sprint(live) != "[r1]" {
		t.Fatalf("live replicas after r0 closed = %v, %v; want [r1]", live, err)
	}
	if _, err := js[1].Clear(ctx); err == nil {
		t.Fatal("cleared the prefix a replica serves")
	}
}

func lookup(t *testing.T, j *etcdjournal.Journal, r *markers.Record) *markers.Record {
	t.Helper()
	var got *markers.Record
	var err error
	if r.IdempotencyKey != "" {
		got, err = j.FindByIdempotencyKey(markers.KeySpace(r), r.IdempotencyKey)
	} else {
		got, err = j.FindByFingerprint(r.Actor, r.IntentScope, r.Fingerprint)
	}
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Compare-and-set: replicas moving one record from one state at once — one moves it, the
// ones asking for the same edge get it idempotently, one asking another edge conflicts.
func testTransitionsCompareAndSet(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 3, 5*time.Second)
	ctx := context.Background()
	id := "01JCAS00000000000000000001"
	if _, err := js[0].CreateAdvancedFor(ctx, newRecord(id, "fp"), []markers.State{markers.Authorized, markers.Dispatched}, "dispatching", nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	to := []markers.State{markers.Completed, markers.Completed, markers.Failed}
	for i, j := range js {
		wg.Go(func() {
			_, errs[i] = j.Transition(ctx, id, markers.Dispatched, to[i], "done", func(r *markers.Record) error {
				r.Evidence = append(r.Evidence, "by replica "+fmt.Sprint(i))
				return nil
			})
		})
	}
	wg.Wait()
	rec, err := js[1].Get(id)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		switch {
		case to[i] == rec.State && err != nil:
			t.Errorf("replica %d moving to %s (the winner's): %v", i, to[i], err)
		case to[i] != rec.State && !errors.Is(err, markers.ErrConflict):
			t.Errorf("replica %d moving to %s with the record %s: %v, want ErrConflict", i, to[i], rec.State, err)
		}
	}
	evs, err := js[2].Events(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 4 { // create, authorized, dispatched, one outcome
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
}

// The replicas' concurrent writes form one chain, which verifies with checkpoints.
func testOneChainAcrossReplicas(t *testing.T, c *etcdtest.Cluster) {
	js, verifier := replicas(t, c, 3, 5*time.Second)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, j := range js {
		wg.Go(func() {
			for n := range 10 {
				id := fmt.Sprintf("01JCHAIN%d%017d", i, n)
				if _, err := j.CreateFor(ctx, newRecord(id, id), &markers.Call{Transport: "http", Match: "new",
					NewRun: &markers.Run{Actor: "alice", Scope: "run:1", Transport: "http"}}); err != nil {
					t.Error(err)
					return
				}
				if _, err := j.AdvanceWithResult(ctx, id, markers.Accepted, []markers.State{markers.Failed}, "no host", []byte(`{"stdout":""}`), nil); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	var buf bytes.Buffer
	if err := js[1].Export(&buf); err != nil {
		t.Fatal(err)
	}
	rep, err := markers.VerifyJSONL(&buf, verifier, markers.VerifyOptions{RequireSealed: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Events != 60 || rep.Checkpoints < 2 {
		t.Fatalf("verify: %s", rep)
	}
	if runs, err := js[2].Runs(markers.RunQuery{}); err != nil || len(runs) != 1 {
		t.Fatalf("runs: %v %v", runs, err)
	}
	page, next, err := js[0].List(markers.Query{State: markers.Failed, Limit: 25})
	if err != nil || len(page) != 25 || next == "" {
		t.Fatalf("list: %d %q %v", len(page), next, err)
	}
	rest, next, err := js[0].List(markers.Query{State: markers.Failed, Limit: 25, Cursor: next})
	if err != nil || len(rest) != 5 || next != "" {
		t.Fatalf("list page 2: %d %q %v", len(rest), next, err)
	}
}

// An execution dispatched by one replica is owned by it; another follows it, and takes it
// over once the owner's lease expires.
func testOwnershipFollowsTheLease(t *testing.T, c *etcdtest.Cluster) {
	js, _ := replicas(t, c, 2, 2*time.Second)
	ctx := context.Background()
	id := "01JOWNER000000000000000001"
	if _, err := js[0].CreateAdvancedFor(ctx, newRecord(id, "fp"), []markers.State{markers.Authorized, markers.Dispatched}, "dispatching", nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := js[1].Claim(ctx, id); err != nil || ok {
		t.Fatalf("claim of another replica's execution: %v %v", ok, err)
	}
	if ok, err := js[0].Claim(ctx, id); err != nil || !ok {
		t.Fatalf("claim of its own: %v %v", ok, err)
	}
	if _, err := js[1].Advance(ctx, id, markers.Dispatched, []markers.State{markers.Unknown}, "lost", nil); err != nil {
		t.Fatal(err)
	}
	// Re-dispatching another replica's execution is refused.
	if _, err := js[1].Advance(ctx, id, markers.Unknown, []markers.State{markers.Dispatched}, "again", nil); !errors.Is(err, markers.ErrNotOwner) {
		t.Fatalf("dispatch of another replica's execution: %v", err)
	}
	updates := 0
	followed := make(chan bool, 1)
	go func() {
		gone, err := js[1].Follow(ctx, id, func(*markers.Record) { updates++ })
		if err != nil {
			t.Error(err)
		}
		followed <- gone
	}()
	js[0].Close() // the owner dies (its lease is not revoked: it expires)
	select {
	case gone := <-followed:
		if !gone || updates == 0 {
			t.Fatalf("follow ended: gone %v after %d updates", gone, updates)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the owner's lease did not expire")
	}
	if ok, err := js[1].Claim(ctx, id); err != nil || !ok {
		t.Fatalf("take over: %v %v", ok, err)
	}
	if _, err := js[1].Advance(ctx, id, markers.Unknown, []markers.State{markers.Dispatched}, "again", nil); err != nil {
		t.Fatalf("dispatch after the take-over: %v", err)
	}
}

// Without quorum every write fails (closed) with an error, and service returns with quorum.
func TestNoQuorumFailsClosed(t *testing.T) {
	c := etcdtest.Start(t, 3)
	js, _ := replicas(t, c, 1, 5*time.Second)
	ctx := context.Background()
	c.Stop(1)
	if _, err := js[0].Create(ctx, newRecord("01JQUORUM00000000000000001", "a")); err != nil {
		t.Fatalf("with 2 of 3 members: %v", err)
	}
	c.Stop(2)
	if _, err := js[0].Create(ctx, newRecord("01JQUORUM00000000000000002", "b")); err == nil {
		t.Fatal("a create without quorum succeeded")
	}
	c.Restart(1)
	c.Ready()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := js[0].Create(ctx, newRecord("01JQUORUM00000000000000003", "c"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after quorum returned: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := js[0].Get("01JQUORUM00000000000000002"); err != nil && !errors.Is(err, markers.ErrNotFound) {
		t.Fatal(err)
	}
}
