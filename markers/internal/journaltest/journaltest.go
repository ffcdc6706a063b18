// Package journaltest is the behaviour every journal backend (the Pebble store,
// markers/etcdjournal) must show, as tests each backend's package runs on its own journals:
// retention (what a pass removes and keeps, tombstones, agent runs, the chain's pruned
// prefix, the archive) and the actor and run indexes.
package journaltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

// Opener opens a fresh, empty journal with the options adjust sets (clock, retention), and
// returns it with its audit verifier key. The backend closes it at the test's cleanup.
type Opener func(t *testing.T, adjust func(*markers.Options)) (markers.JournalStore, string)

// Clock is a test clock a journal reads through Options.Now.
type Clock struct{ ns atomic.Int64 }

// NewClock starts at a fixed time.
func NewClock() *Clock {
	c := &Clock{}
	c.ns.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *Clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

var ctx = context.Background()

// Finished journals rec the way the bastion journals an execution that completed: accepted,
// authorized and dispatched in one write whose create event carries a call of its agent
// run (first seen at, if the run is new); completed with its result; delivered.
func Finished(t testing.TB, j markers.JournalStore, rec *markers.Record, at time.Time) {
	t.Helper()
	Dispatched(t, j, rec, at)
	if _, err := j.AdvanceWithResult(ctx, rec.ID, markers.Dispatched, []markers.State{markers.Completed}, "exit 0", []byte("output of "+rec.ID), func(r *markers.Record) error {
		zero := 0
		r.ExitCode = &zero
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.UpdateFor(ctx, rec.ID, "result delivered", &markers.Call{Transport: "http", Run: rec.IntentScope, Match: "delivered"}, markers.Sync, func(r *markers.Record) error {
		at := r.UpdatedAt
		r.ResultDeliveredAt = &at
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Dispatched journals rec up to dispatched, its create event carrying a call that names
// its run (first seen at, if it is new).
func Dispatched(t testing.TB, j markers.JournalStore, rec *markers.Record, at time.Time) {
	t.Helper()
	call := &markers.Call{Transport: "http", Run: rec.IntentScope, Match: "new",
		NewRun: &markers.Run{Actor: rec.Actor, Scope: rec.IntentScope, FirstSeen: at, Transport: "http"}}
	if _, err := j.CreateAdvancedFor(ctx, rec, []markers.State{markers.Authorized, markers.Dispatched}, "dispatching", call); err != nil {
		t.Fatal(err)
	}
}

// Retention runs the retention behaviour on journals open opens.
func Retention(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Opener)
	}{
		{"RemovesFinishedExecutionsWithEverything", removesFinishedWithEverything},
		{"NeverRemovesInFlightOrReview", neverRemovesInFlight},
		{"NewerExecutionKeepsItsPointer", newerExecutionKeepsItsPointer},
		{"DryRunChangesNothing", dryRunChangesNothing},
		{"RunIdentityRecordsAMissingRun", runIdentityRecordsAMissingRun},
		{"HeldExecutionsAreCarriedForward", heldExecutionsAreCarriedForward},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open) })
	}
}

// retentionOptions: read_only records go after an hour, others after ten; tombstones stay
// an hour, runs with no execution left go two hours after first seen.
func retentionOptions(clock *Clock) func(*markers.Options) {
	return func(o *markers.Options) {
		o.Now = clock.Now
		o.CheckpointEvery = 4
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
		o.DefaultRetention = 10 * time.Hour
		o.TombstoneRetention = func(string) time.Duration { return time.Hour }
		o.RunRetention = 2 * time.Hour
	}
}

func record(n int, actor, scope, class string) *markers.Record {
	return &markers.Record{
		ID: fmt.Sprintf("ex_01KRETAIN%016d", n), Actor: actor, IntentScope: scope, Class: class,
		Fingerprint: fmt.Sprintf("hmac-sha256:%04d", n), Host: "web1", Channel: "ssh", Tool: "ssh_exec",
		Command: []string{"sh", "-c", "true"},
	}
}

// raw is every key of the journal, as text.
func raw(t testing.TB, j markers.JournalStore) []string {
	t.Helper()
	var keys []string
	for kv, err := range j.(markers.RawJournal).Raw() {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, string(kv.Key))
	}
	return keys
}

func export(t testing.TB, j markers.JournalStore) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := j.Export(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gc(t testing.TB, j markers.JournalStore, dryRun bool) markers.GCResult {
	t.Helper()
	res, err := j.GC(ctx, markers.GCOptions{DryRun: dryRun})
	if err != nil {
		t.Fatalf("gc: %v", err)
	}
	return res
}

func ids(recs []*markers.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func removesFinishedWithEverything(t *testing.T, open Opener) {
	clock := NewClock()
	j, verifier := open(t, retentionOptions(clock))
	a := record(1, "alice", "run:1", "read_only")
	b := record(2, "alice", "run:1", "remote_command")
	b.IdempotencyKey, b.Fingerprint = "deploy-1", "hmac-sha256:keyed"
	c := record(3, "bob", "run:2", "read_only")
	Finished(t, j, a, clock.Now())
	Finished(t, j, b, clock.Now())
	Finished(t, j, c, clock.Now())
	clock.Advance(30 * time.Minute)
	d := record(4, "bob", "run:2", "read_only") // younger: kept by the first pass
	Finished(t, j, d, clock.Now())
	archive := export(t, j)

	clock.Advance(45 * time.Minute)
	res := gc(t, j, false)
	if res.Records != 2 || res.Tombstones != 2 {
		t.Fatalf("first pass = %+v; want a and c removed, each leaving a tombstone", res)
	}
	for _, id := range []string{a.ID, c.ID} {
		if _, err := j.Get(id); !errors.Is(err, markers.ErrNotFound) {
			t.Errorf("Get(%s) after its removal: %v", id, err)
		}
		if _, err := j.Result(id); !errors.Is(err, markers.ErrNotFound) {
			t.Errorf("Result(%s) after its removal: %v", id, err)
		}
		if evs, err := j.Events(id); err != nil || len(evs) != 0 {
			t.Errorf("Events(%s) after its removal = %d, %v", id, len(evs), err)
		}
		for _, k := range raw(t, j) {
			if strings.Contains(k, id) {
				t.Errorf("key %q of removed %s is left", k, id)
			}
		}
	}
	_, err := j.FindByFingerprint("alice", "run:1", a.Fingerprint)
	var removed *markers.RemovedError
	if !errors.As(err, &removed) || !errors.Is(err, markers.ErrNotFound) || removed.Tombstone.ID != a.ID ||
		removed.Tombstone.State != markers.Completed || removed.Tombstone.DeliveredAt == nil || removed.Tombstone.Class != "read_only" {
		t.Fatalf("lookup of a removed execution's intent = %v; want its tombstone", err)
	}
	if got, err := j.FindByIdempotencyKey("alice", "deploy-1"); err != nil || got.ID != b.ID {
		t.Fatalf("key of the kept execution = %v, %v", got, err)
	}
	recs, _, err := j.List(markers.Query{Actor: "bob", Newest: true})
	if err != nil || fmt.Sprint(ids(recs)) != fmt.Sprint([]string{d.ID}) {
		t.Fatalf("bob's executions after the pass = %v, %v; want only %s", ids(recs), err, d.ID)
	}
	if _, err := j.Run("alice", "run:1"); err != nil {
		t.Errorf("a run whose execution is left was removed: %v", err)
	}

	clock.Advance(10 * time.Hour)
	res = gc(t, j, false)
	if res.Records != 2 || res.TombstonesExpired != 2 || res.Tombstones != 2 || res.Runs != 2 {
		t.Fatalf("second pass = %+v; want b and d removed, the first tombstones dropped, both runs removed", res)
	}
	if _, err := j.FindByFingerprint("alice", "run:1", a.Fingerprint); err == nil || errors.As(err, &removed) {
		t.Errorf("lookup after the tombstone expired = %v; want plain not found", err)
	}
	if _, err := j.FindByIdempotencyKey("alice", "deploy-1"); !errors.As(err, &removed) || removed.Tombstone.ID != b.ID || removed.Tombstone.IdempotencyKey != "deploy-1" {
		t.Errorf("key of a removed execution = %v; want its tombstone", err)
	}
	for _, run := range [][2]string{{"alice", "run:1"}, {"bob", "run:2"}} {
		if _, err := j.Run(run[0], run[1]); !errors.Is(err, markers.ErrNotFound) {
			t.Errorf("run %v with no execution left: %v", run, err)
		}
	}
	if res.Events == 0 || res.BaseSeq == 0 {
		t.Fatalf("pass = %+v; want the chain's prefix pruned", res)
	}
	current := export(t, j)
	rep, err := markers.VerifyJSONL(bytes.NewReader(current), verifier, markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.PrunedThrough != res.BaseSeq || rep.FirstSeq != 0 && rep.FirstSeq != res.BaseSeq+1 {
		t.Fatalf("verify after the passes = %+v, %v; want PASS, pruned through %d", rep, err, res.BaseSeq)
	}
	if !strings.Contains(rep.String(), fmt.Sprintf("events 1..%d pruned by retention", res.BaseSeq)) {
		t.Errorf("report does not say what was pruned: %s", rep)
	}
	// The export made before the passes is the archive: it verifies on its own, and joins
	// the pruned chain where it starts.
	arep, err := markers.VerifyJSONL(bytes.NewReader(archive), verifier, markers.VerifyOptions{RequireSealed: true,
		Joins: &markers.ChainPos{Seq: rep.PrunedThrough, Hash: rep.PrunedHash}})
	if err != nil || !arep.OK || !arep.Joins {
		t.Fatalf("verify of the archive against the pruned chain = %+v, %v", arep, err)
	}
	arep, err = markers.VerifyJSONL(bytes.NewReader(archive), verifier, markers.VerifyOptions{
		Joins: &markers.ChainPos{Seq: rep.PrunedThrough, Hash: strings.Repeat("0", 64)}})
	if err != nil || arep.OK {
		t.Errorf("an archive of another chain joins: %+v, %v", arep, err)
	}
}

func neverRemovesInFlight(t *testing.T, open Opener) {
	clock := NewClock()
	j, _ := open(t, retentionOptions(clock))
	running := record(1, "alice", "run:1", "read_only")
	Dispatched(t, j, running, clock.Now())
	if _, err := j.Transition(ctx, running.ID, markers.Dispatched, markers.Running, "", nil); err != nil {
		t.Fatal(err)
	}
	review := record(2, "alice", "run:1", "read_only")
	Dispatched(t, j, review, clock.Now())
	if _, err := j.Transition(ctx, review.ID, markers.Dispatched, markers.Unknown, "lost", func(r *markers.Record) error {
		r.ReviewRequired = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pending := record(3, "alice", "run:1", "read_only")
	if _, err := j.CreateAdvancedFor(ctx, pending, []markers.State{markers.AwaitingApproval}, "approval required", nil); err != nil {
		t.Fatal(err)
	}
	clock.Advance(1000 * time.Hour)
	res := gc(t, j, false)
	if res.Records != 0 || res.Runs != 0 {
		t.Fatalf("pass = %+v; want nothing removed", res)
	}
	for _, id := range []string{running.ID, review.ID, pending.ID} {
		if _, err := j.Get(id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	// A Removable that keeps a class: counted as kept.
	j2, _ := open(t, func(o *markers.Options) {
		retentionOptions(clock)(o)
		o.Removable = func(r *markers.Record, now time.Time) bool { return r.Class != "keep" }
	})
	kept := record(4, "alice", "run:1", "keep")
	Finished(t, j2, kept, clock.Now())
	clock.Advance(1000 * time.Hour)
	if res := gc(t, j2, false); res.Records != 0 || res.Kept != 1 {
		t.Fatalf("pass with a Removable that keeps the class = %+v; want it kept", res)
	}
}

func newerExecutionKeepsItsPointer(t *testing.T, open Opener) {
	clock := NewClock()
	j, _ := open(t, retentionOptions(clock))
	first := record(1, "alice", "run:1", "read_only")
	Finished(t, j, first, clock.Now())
	clock.Advance(50 * time.Minute)
	again := record(2, "alice", "run:1", "read_only")
	// The same intent again, after its result was delivered, matched first as the bastion does.
	again.Fingerprint = first.Fingerprint
	if _, err := j.FindByFingerprint("alice", "run:1", first.Fingerprint); err != nil {
		t.Fatal(err)
	}
	Finished(t, j, again, clock.Now())
	clock.Advance(40 * time.Minute)
	if res := gc(t, j, false); res.Records != 1 || res.Tombstones != 0 {
		t.Fatalf("pass = %+v; want the first removed, no tombstone (the entry names the second)", res)
	}
	if got, err := j.FindByFingerprint("alice", "run:1", first.Fingerprint); err != nil || got.ID != again.ID {
		t.Fatalf("the intent's entry = %v, %v; want %s", got, err, again.ID)
	}
	sib, err := j.SiblingIDs("alice", "run:1", first.Fingerprint, 10)
	if err != nil || fmt.Sprint(sib) != fmt.Sprint([]string{again.ID}) {
		t.Fatalf("siblings = %v, %v", sib, err)
	}
}

func dryRunChangesNothing(t *testing.T, open Opener) {
	clock := NewClock()
	j, _ := open(t, retentionOptions(clock))
	for i := range 5 {
		Finished(t, j, record(i, "alice", "run:1", "read_only"), clock.Now())
	}
	clock.Advance(3 * time.Hour)
	before := raw(t, j)
	res := gc(t, j, true)
	if !res.DryRun || res.Records != 5 || res.Runs != 0 {
		t.Fatalf("dry run = %+v; want 5 records counted", res)
	}
	if after := raw(t, j); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a dry run changed the journal")
	}
	if res := gc(t, j, false); res.Records != 5 {
		t.Fatalf("pass after the dry run = %+v", res)
	}
}

// A call whose writer believes its run is recorded (RunIdentity, not NewRun) records it
// again when retention removed it: a run is never left without its record.
func runIdentityRecordsAMissingRun(t *testing.T, open Opener) {
	clock := NewClock()
	j, _ := open(t, retentionOptions(clock))
	rec := record(1, "alice", "run:1", "read_only")
	call := &markers.Call{Transport: "http", Run: "run:1", Match: "new",
		RunIdentity: &markers.Run{Actor: "alice", Scope: "run:1", FirstSeen: clock.Now(), Transport: "http", RunID: "1"}}
	if _, err := j.CreateFor(ctx, rec, call); err != nil {
		t.Fatal(err)
	}
	run, err := j.Run("alice", "run:1")
	if err != nil || run.RunID != "1" {
		t.Fatalf("run = %+v, %v", run, err)
	}
	evs, err := j.Events(rec.ID)
	if err != nil || len(evs) != 1 || evs[0].Call == nil || evs[0].Call.NewRun != nil {
		t.Fatalf("the create event = %+v, %v; want its call without new_run", evs, err)
	}
}

// Indexes runs the actor and run index behaviour (List by actor, by run) on journals open
// opens.
func Indexes(t *testing.T, open Opener) {
	clock := NewClock()
	j, _ := open(t, func(o *markers.Options) { o.Now = clock.Now })
	want := map[[2]string][]string{}
	n := 0
	for round := range 4 {
		for _, actor := range []string{"alice", "bob", "carol"} {
			for _, scope := range []string{"run:1", "run:2"} {
				rec := record(n, actor, scope, "read_only")
				n++
				if _, err := j.Create(ctx, rec); err != nil {
					t.Fatal(err)
				}
				want[[2]string{actor, ""}] = append(want[[2]string{actor, ""}], rec.ID)
				want[[2]string{actor, scope}] = append(want[[2]string{actor, scope}], rec.ID)
				clock.Advance(time.Second)
			}
		}
		_ = round
	}
	for k, ids := range want {
		// Oldest first, two to a page.
		var got []string
		cursor := ""
		for {
			recs, next, err := j.List(markers.Query{Actor: k[0], Scope: k[1], Limit: 2, Cursor: cursor})
			if err != nil {
				t.Fatalf("list %v: %v", k, err)
			}
			for _, r := range recs {
				got = append(got, r.ID)
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if fmt.Sprint(got) != fmt.Sprint(ids) {
			t.Errorf("list %v = %v; want %v", k, got, ids)
		}
	}
	// Newest first, bounded by time.
	all := want[[2]string{"bob", ""}]
	recs, _, err := j.List(markers.Query{Actor: "bob", Newest: true, Limit: 3})
	if err != nil || fmt.Sprint(ids(recs)) != fmt.Sprint([]string{all[7], all[6], all[5]}) {
		t.Errorf("bob's newest three = %v, %v", ids(recs), err)
	}
	first, err := j.Get(all[2])
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err = j.List(markers.Query{Actor: "bob", Since: first.CreatedAt, Until: first.CreatedAt.Add(time.Second)})
	if err != nil || fmt.Sprint(ids(recs)) != fmt.Sprint([]string{all[2]}) {
		t.Errorf("bob's executions of one second = %v, %v", ids(recs), err)
	}
	_, next, err := j.List(markers.Query{Actor: "alice", Limit: 1})
	if err != nil || next == "" {
		t.Fatal(next, err)
	}
	if _, _, err := j.List(markers.Query{Actor: "bob", Cursor: next}); !errors.Is(err, markers.ErrInvalidCursor) {
		t.Errorf("another actor's cursor: %v; want ErrInvalidCursor", err)
	}
}

// A record held past the event horizon does not pin the chain: its events in the pruned
// prefix are carried forward (one carried event at the head), so Events still tells its
// whole story, the chain verifies, and a later pass carries them again without nesting.
// Without a horizon the held record's first event bounds the prune.
func heldExecutionsAreCarriedForward(t *testing.T, open Opener) {
	clock := NewClock()
	pinned, _ := open(t, retentionOptions(clock))
	held := record(1, "alice", "run:1", "read_only")
	Dispatched(t, pinned, held, clock.Now())
	for i := range 4 {
		Finished(t, pinned, record(10+i, "bob", "run:2", "read_only"), clock.Now())
	}
	clock.Advance(2 * time.Hour)
	if res := gc(t, pinned, false); res.Records != 4 || res.Events != 0 {
		t.Fatalf("pass without an event horizon = %+v; want the records removed, the chain kept from the held one's first event", res)
	}

	j, verifier := open(t, func(o *markers.Options) {
		retentionOptions(clock)(o)
		o.EventRetention = time.Hour
	})
	Dispatched(t, j, held, clock.Now())
	if err := j.Joined(ctx, held.ID, &markers.Call{Transport: "http", Run: "run:1", Match: "attach"}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		Finished(t, j, record(10+i, "bob", "run:2", "read_only"), clock.Now())
	}
	story, err := j.Events(held.ID)
	if err != nil || len(story) != 4 {
		t.Fatalf("events of the held record = %d, %v", len(story), err)
	}
	clock.Advance(2 * time.Hour)
	res := gc(t, j, false)
	if res.Records != 4 || res.Carried != 1 || res.Events == 0 {
		t.Fatalf("pass past the event horizon = %+v; want the held record carried forward and the prefix pruned", res)
	}
	again, err := j.Events(held.ID)
	if err != nil || fmt.Sprint(seqs(again)) != fmt.Sprint(seqs(story)) {
		t.Fatalf("events of the held record after the pass = %v, %v; want %v", seqs(again), err, seqs(story))
	}
	if _, err := j.Transition(ctx, held.ID, markers.Dispatched, markers.Running, "", nil); err != nil {
		t.Fatal(err)
	}
	if rep := verify(t, j, verifier); !rep.OK || rep.PrunedThrough != res.BaseSeq {
		t.Fatalf("verify after carrying = %v", rep)
	}
	clock.Advance(2 * time.Hour)
	if res := gc(t, j, false); res.Carried != 1 || res.Events == 0 {
		t.Fatalf("second pass = %+v; want the held record carried again", res)
	}
	final, err := j.Events(held.ID)
	if err != nil || len(final) != len(story)+1 || final[len(final)-1].To != markers.Running {
		t.Fatalf("events after carrying twice = %v, %v; want the story and the transition once each", seqs(final), err)
	}
	for _, ev := range final {
		if ev.Kind == markers.KindCarried {
			t.Fatalf("Events shows a carried event: %+v", ev)
		}
	}
	if rep := verify(t, j, verifier); !rep.OK {
		t.Fatalf("verify after carrying twice = %v", rep)
	}
}

func seqs(evs []markers.Event) []uint64 {
	var out []uint64
	for _, ev := range evs {
		out = append(out, ev.Seq)
	}
	return out
}

func verify(t *testing.T, j markers.JournalStore, verifier string) markers.Report {
	t.Helper()
	rep, err := markers.VerifyJSONL(bytes.NewReader(export(t, j)), verifier, markers.VerifyOptions{RequireSealed: true})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
