package markers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

func TestCreateRace(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	ctx := context.Background()
	const n = 100
	var wg sync.WaitGroup
	errs := make([]error, n)
	recs := make([]*markers.Record, n)
	for i := range n {
		wg.Go(func() {
			recs[i], errs[i] = s.Create(ctx, &markers.Record{ID: "ex_race", Account: fmt.Sprint(i)})
		})
	}
	wg.Wait()
	winners := 0
	var winner string
	for i := range n {
		switch {
		case errs[i] == nil:
			winners++
			winner = recs[i].Account
		case errors.Is(errs[i], markers.ErrExists):
			if recs[i] == nil || recs[i].ID != "ex_race" {
				t.Errorf("loser %d got record %+v; want the existing record", i, recs[i])
			}
		default:
			t.Errorf("create %d: %v", i, errs[i])
		}
	}
	if winners != 1 {
		t.Fatalf("winners = %d; want 1", winners)
	}
	for i := range n {
		if errs[i] != nil && recs[i].Account != winner {
			t.Errorf("loser %d sees account %q; want the winner's %q", i, recs[i].Account, winner)
		}
	}
	if st := s.Stats(); st.Events != 1 {
		t.Errorf("events = %d; want 1", st.Events)
	}
}

func TestTransitionCompareAndSet(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1"}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Transition(ctx, "ex_1", markers.Started, markers.Running, "spawned", func(r *markers.Record) error {
		r.PID = 42
		return nil
	})
	if err != nil || rec.State != markers.Running || rec.PID != 42 {
		t.Fatalf("transition = %+v, %v; want running with pid 42", rec, err)
	}

	tests := []struct {
		name     string
		from, to markers.State
		wantErr  error
		want     markers.State
	}{
		{"re-apply is idempotent", markers.Started, markers.Running, nil, markers.Running},
		{"stale from conflicts", markers.Started, markers.Cancelled, markers.ErrConflict, markers.Running},
		{"illegal edge", markers.Running, markers.Started, markers.ErrIllegalTransition, markers.Running},
		{"legal move", markers.Running, markers.Exited, nil, markers.Exited},
		{"nothing leaves a terminal state", markers.Exited, markers.Running, markers.ErrIllegalTransition, markers.Exited},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Transition(ctx, "ex_1", tt.from, tt.to, "", nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
			got, err := s.Get("ex_1")
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tt.want {
				t.Errorf("state = %s; want %s", got.State, tt.want)
			}
		})
	}
	if _, err := s.Transition(ctx, "ex_missing", markers.Started, markers.Running, "", nil); !errors.Is(err, markers.ErrNotFound) {
		t.Errorf("missing record: err = %v; want ErrNotFound", err)
	}
}

func TestUpdateKeepsIdentity(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1", Actor: "alice", Fingerprint: "fp"}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mutate  func(*markers.Record) error
		wantErr error
	}{
		{"outcome fields", func(r *markers.Record) error { r.Evidence = append(r.Evidence, "seen"); return nil }, nil},
		{"actor", func(r *markers.Record) error { r.Actor = "mallory"; return nil }, markers.ErrImmutable},
		{"fingerprint", func(r *markers.Record) error { r.Fingerprint = "other"; return nil }, markers.ErrImmutable},
		{"state", func(r *markers.Record) error { r.State = markers.Completed; return nil }, markers.ErrImmutable},
		{"mutate error", func(r *markers.Record) error { return errSentinel }, errSentinel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Update(ctx, "ex_1", tt.name, tt.mutate)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
		})
	}
	got, _ := s.Get("ex_1")
	if got.Actor != "alice" || got.State != markers.Accepted || len(got.Evidence) != 1 {
		t.Errorf("record = %+v; want alice, accepted, one evidence note", got)
	}
}

var errSentinel = errors.New("caller refused")

func TestCreateRejectsBadIdentity(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	tests := []struct {
		name string
		rec  markers.Record
	}{
		{"empty id", markers.Record{}},
		{"NUL in actor", markers.Record{ID: "ex_1", Actor: "a\x00b"}},
		{"wrong graph", markers.Record{ID: "ex_1", Graph: markers.HostGraph}},
		{"not the initial state", markers.Record{ID: "ex_1", State: markers.Completed}},
		{"oversized key field", markers.Record{ID: "ex_1", IdempotencyKey: string(make([]byte, 4096))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Create(context.Background(), &tt.rec); err == nil {
				t.Fatal("create succeeded; want an error")
			}
		})
	}
	if st := s.Stats(); st.Events != 0 {
		t.Errorf("events = %d; want 0", st.Events)
	}
}

func TestLookups(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	mk := func(id, actor, scope, fp, key string) {
		t.Helper()
		if _, err := s.Create(ctx, &markers.Record{ID: id, Actor: actor, IntentScope: scope, Fingerprint: fp, IdempotencyKey: key, OperationKey: "op:" + key}); err != nil {
			t.Fatal(err)
		}
	}
	mk("ex_00", "alice", "run:1", "fpA", "")
	mk("ex_01", "alice", "run:1", "fpA", "k1")
	mk("ex_02", "alice", "run:1", "fpA", "k2")
	mk("ex_03", "bob", "run:1", "fpA", "k1")
	mk("ex_04", "alice", "run:2", "fpA", "")
	mk("ex_05", "bob", "run:1", "fpA", "")
	mk("ex_06", "alice", "run:1", "fpA", "")
	mk("ex_07", "carol", "run:1", "fpA", "k3")
	// Records that name a principal: their keys are in the shared space, whoever holds them.
	for _, r := range []markers.Record{
		{ID: "ex_08", Actor: "token:dave", Principal: "principal:dave", IntentScope: "run:1", Fingerprint: "fpA", IdempotencyKey: "k1"},
		{ID: "ex_09", Actor: "local:dave", Principal: "principal:dave", IntentScope: "run:2", Fingerprint: "fpB", IdempotencyKey: "k4"},
	} {
		if _, err := s.Create(ctx, &r); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name   string
		find   func() (*markers.Record, error)
		wantID string
	}{
		{"fingerprint newest in scope", func() (*markers.Record, error) { return s.FindByFingerprint("alice", "run:1", "fpA") }, "ex_06"},
		{"fingerprint other scope", func() (*markers.Record, error) { return s.FindByFingerprint("alice", "run:2", "fpA") }, "ex_04"},
		{"fingerprint other actor", func() (*markers.Record, error) { return s.FindByFingerprint("bob", "run:1", "fpA") }, "ex_05"},
		{"keyed executions are found by key only", func() (*markers.Record, error) { return s.FindByFingerprint("carol", "run:1", "fpA") }, ""},
		{"fingerprint no prefix match", func() (*markers.Record, error) { return s.FindByFingerprint("alice", "run:1", "fp") }, ""},
		{"idempotency key per actor", func() (*markers.Record, error) { return s.FindByIdempotencyKey("alice", "k1") }, "ex_01"},
		{"idempotency key bob", func() (*markers.Record, error) { return s.FindByIdempotencyKey("bob", "k1") }, "ex_03"},
		{"a principal's key is shared", func() (*markers.Record, error) { return s.FindByIdempotencyKey(markers.SharedKeySpace, "k1") }, "ex_08"},
		{"whichever actor made it", func() (*markers.Record, error) { return s.FindByIdempotencyKey(markers.SharedKeySpace, "k4") }, "ex_09"},
		{"not in its actor's space", func() (*markers.Record, error) { return s.FindByIdempotencyKey("local:dave", "k4") }, ""},
		{"older keys stay in theirs", func() (*markers.Record, error) { return s.FindByIdempotencyKey(markers.SharedKeySpace, "k3") }, ""},
		{"operation key newest", func() (*markers.Record, error) { return s.FindByOperationKey("op:k1") }, "ex_03"},
		{"operation key absent", func() (*markers.Record, error) { return s.FindByOperationKey("op:zz") }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := tt.find()
			if tt.wantID == "" {
				if !errors.Is(err, markers.ErrNotFound) {
					t.Fatalf("err = %v; want ErrNotFound", err)
				}
				return
			}
			if err != nil || rec.ID != tt.wantID {
				t.Fatalf("got %v, %v; want %s", rec, err, tt.wantID)
			}
		})
	}
}

func TestListPaginates(t *testing.T) {
	clock := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = func() time.Time { clock = clock.Add(time.Second); return clock }
	})
	ctx := context.Background()
	for i := range 25 {
		id := fmt.Sprintf("ex_%02d", i)
		actor := "alice"
		if i%5 == 0 {
			actor = "bob"
		}
		if _, err := s.Create(ctx, &markers.Record{ID: id, Actor: actor}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := s.Transition(ctx, id, markers.Accepted, markers.Authorized, "", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	collect := func(q markers.Query) []string {
		t.Helper()
		var ids []string
		for page := 0; page < 100; page++ {
			recs, next, err := s.List(q)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
			if next == "" {
				return ids
			}
			q.Cursor = next
		}
		t.Fatal("pagination did not end")
		return nil
	}
	createdAt := func(id string) time.Time {
		t.Helper()
		r, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		return r.CreatedAt
	}
	tests := []struct {
		name  string
		q     markers.Query
		count int
		first string
	}{
		{"all by time", markers.Query{Limit: 7}, 25, "ex_00"},
		{"newest first", markers.Query{Limit: 4, Newest: true}, 25, "ex_24"},
		{"by state", markers.Query{State: markers.Authorized, Limit: 3}, 13, "ex_00"},
		{"by state newest", markers.Query{State: markers.Accepted, Limit: 5, Newest: true}, 12, "ex_23"},
		{"by actor", markers.Query{Actor: "bob", Limit: 2}, 5, "ex_00"},
		{"time range", markers.Query{Since: createdAt("ex_02"), Until: createdAt("ex_06"), Limit: 2}, 4, "ex_02"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := collect(tt.q)
			if len(ids) != tt.count || ids[0] != tt.first {
				t.Errorf("got %d ids starting %v; want %d starting %s", len(ids), ids, tt.count, tt.first)
			}
			seen := map[string]bool{}
			for _, id := range ids {
				if seen[id] {
					t.Errorf("%s listed twice", id)
				}
				seen[id] = true
			}
		})
	}
	_, timeCursor, err := s.List(markers.Query{Limit: 1})
	if err != nil || timeCursor == "" {
		t.Fatalf("a first page of one: cursor %q, %v", timeCursor, err)
	}
	for _, bad := range []markers.Query{
		{Cursor: "zz"},   // not hex
		{Cursor: "ff00"}, // hex, not a time index key
		{State: markers.Accepted, Cursor: timeCursor}, // a time cursor for a state listing
		{State: markers.Authorized, Cursor: "0a"},     // another index's family byte alone
	} {
		if _, _, err := s.List(bad); !errors.Is(err, markers.ErrInvalidCursor) {
			t.Errorf("List(%+v): %v, want ErrInvalidCursor", bad, err)
		}
	}
}

func TestEventsTellTheStory(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	s.Create(ctx, &markers.Record{ID: "ex_1"})
	s.Transition(ctx, "ex_1", markers.Accepted, markers.Authorized, "policy: allow", nil)
	s.Update(ctx, "ex_1", "evidence", func(r *markers.Record) error { r.Evidence = []string{"x"}; return nil })
	s.Create(ctx, &markers.Record{ID: "ex_2"})
	evs, err := s.Events("ex_1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%d %s %s→%s %s", ev.Seq, ev.Kind, ev.From, ev.To, ev.Note))
	}
	want := []string{"1 create →accepted ", "2 transition accepted→authorized policy: allow", "3 update authorized→authorized evidence"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events = %q; want %q", got, want)
	}
}

func TestReopenKeepsChain(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	ctx := context.Background()
	for i := range 10 {
		s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%d", i)})
	}
	s.Reopen(t)
	for i := 10; i < 20; i++ {
		if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_3"}); !errors.Is(err, markers.ErrExists) {
		t.Errorf("create after reopen: err = %v; want ErrExists", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := markers.VerifyDir(s.Dir, s.VerifierKey, markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.Events != 20 || rep.Records != 20 {
		t.Fatalf("verify = %v, %v; want PASS with 20 events and records", rep, err)
	}
	if _, err := s.Get("ex_1"); !errors.Is(err, markers.ErrClosed) {
		t.Errorf("get after close: %v; want ErrClosed", err)
	}
}

func TestReadOnly(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ro, err := markers.Open(s.Dir, markers.Options{Graph: markers.HostGraph, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.Get("ex_1"); err != nil {
		t.Errorf("get: %v", err)
	}
	if _, err := ro.Create(ctx, &markers.Record{ID: "ex_2"}); !errors.Is(err, markers.ErrReadOnly) {
		t.Errorf("create: %v; want ErrReadOnly", err)
	}
	var export bytes.Buffer
	if err := ro.Export(&export); err != nil || !bytes.Contains(export.Bytes(), []byte(`"ex_1"`)) {
		t.Errorf("read-only export = %q, %v; want the log (unsealed if need be)", export.String(), err)
	}
	if _, err := markers.Open(t.TempDir(), markers.Options{Graph: markers.HostGraph, ReadOnly: true}); err == nil {
		t.Error("read-only open of an empty dir succeeded")
	}
}

// TestPresenceNeverHidesAKey: the in-memory filter that short-cuts lookups of absent keys
// must find every key, while it grows and after a reopen.
func TestPresenceNeverHidesAKey(t *testing.T) {
	defer markers.SetPresenceMinCap(256)()
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	const n = 1_000 // two keys each: the filter grows three times
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := w; i < n; i += 32 {
				if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%05d", i), Actor: "a", Fingerprint: fmt.Sprintf("fp%d", i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	check := func(when string) {
		t.Helper()
		for i := 0; i < n; i++ {
			if _, err := s.FindByFingerprint("a", "", fmt.Sprintf("fp%d", i)); err != nil {
				t.Fatalf("%s: fingerprint %d: %v", when, i, err)
			}
			if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_%05d", i)}); !errors.Is(err, markers.ErrExists) {
				t.Fatalf("%s: create of existing %d: %v", when, i, err)
			}
		}
		if _, err := s.FindByFingerprint("a", "", "fp-absent"); !errors.Is(err, markers.ErrNotFound) {
			t.Fatalf("%s: absent fingerprint: %v", when, err)
		}
	}
	check("after writes")
	s.Reopen(t)
	check("after reopen")
}

func TestAdvanceWritesEveryStepInOneCommit(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Advance(ctx, "ex_1", markers.Started, []markers.State{markers.Exited}, "", nil); !errors.Is(err, markers.ErrIllegalTransition) {
		t.Fatalf("started → exited: %v; want ErrIllegalTransition", err)
	}
	before := s.Stats()
	rec, err := s.Advance(ctx, "ex_1", markers.Started, []markers.State{markers.Running, markers.Exited}, "ran and exited", func(r *markers.Record) error {
		code := 0
		r.ExitCode, r.PID = &code, 7
		return nil
	})
	if err != nil || rec.State != markers.Exited || rec.StateTimes[markers.Running].IsZero() {
		t.Fatalf("advance = %+v, %v; want exited with the running time recorded", rec, err)
	}
	after := s.Stats()
	if after.Commits-before.Commits != 1 || after.Events-before.Events != 2 {
		t.Errorf("commits +%d, events +%d; want one commit with two events", after.Commits-before.Commits, after.Events-before.Events)
	}
	evs, _ := s.Events("ex_1")
	var got []string
	for _, ev := range evs {
		got = append(got, string(ev.From)+"→"+string(ev.To))
	}
	if want := "[→started started→running running→exited]"; fmt.Sprint(got) != want {
		t.Errorf("events = %v; want %s", got, want)
	}
	if again, err := s.Advance(ctx, "ex_1", markers.Started, []markers.State{markers.Running, markers.Exited}, "", nil); err != nil || again.State != markers.Exited {
		t.Errorf("re-applied advance = %v, %v; want the record, no error", again, err)
	}
	closeAndVerify(t, s)
}

func TestFailedCommitFailsClosed(t *testing.T) {
	s := testutil.OpenStore(t, markers.HostGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1"}); err != nil {
		t.Fatal(err)
	}
	diskFull := errors.New("no space left on device")
	markers.FailCommits(s.Store, diskFull)
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_2"}); !errors.Is(err, markers.ErrBroken) {
		t.Fatalf("create during a failing disk: %v; want ErrBroken", err)
	}
	markers.FailCommits(s.Store, nil) // the disk recovers: the store still refuses
	for name, write := range map[string]func() error{
		"create": func() error { _, err := s.Create(ctx, &markers.Record{ID: "ex_3"}); return err },
		"transition": func() error {
			_, err := s.Transition(ctx, "ex_1", markers.Started, markers.Running, "", nil)
			return err
		},
	} {
		if err := write(); !errors.Is(err, markers.ErrBroken) {
			t.Errorf("%s after a failed commit: %v; want ErrBroken", name, err)
		}
	}
	if _, err := s.Get("ex_2"); !errors.Is(err, markers.ErrNotFound) {
		t.Errorf("the failed create is visible: %v", err)
	}
	if rec, err := s.Get("ex_1"); err != nil || rec.State != markers.Started {
		t.Errorf("ex_1 = %v, %v; want unchanged", rec, err)
	}
}

func TestResultIsStoredWithTheOutcome(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_r"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Result("ex_r"); !errors.Is(err, markers.ErrNotFound) {
		t.Fatalf("result before the outcome: %v; want ErrNotFound", err)
	}
	path := []markers.State{markers.Authorized, markers.Dispatched, markers.Completed}
	if _, err := s.AdvanceWithResult(ctx, "ex_r", markers.Accepted, path, "exit 0", []byte("out"), nil); err != nil {
		t.Fatal(err)
	}
	s.Reopen(t)
	got, err := s.Result("ex_r")
	if err != nil || string(got) != "out" {
		t.Fatalf("result after reopen = %q, %v; want \"out\"", got, err)
	}
	big := make([]byte, markers.MaxResultBytes+1)
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_big"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AdvanceWithResult(ctx, "ex_big", markers.Accepted, path, "", big, nil); err == nil {
		t.Fatal("an oversized result was accepted")
	}
	if rec, _ := s.Get("ex_big"); rec.State != markers.Accepted {
		t.Fatalf("state after a refused result = %s; want accepted", rec.State)
	}
}

// TestNewAttemptTakesOverTheIdempotencyKey: a new attempt of a keyed execution (linked by
// PreviousAttempt) is what the key names from then on, also after retention removed the
// failed attempt; the link is fixed at creation.
func TestNewAttemptTakesOverTheIdempotencyKey(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = func() time.Time { return clock }
		o.DefaultRetention = time.Hour
	})
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_01", Actor: "alice", IdempotencyKey: "deploy-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, "ex_01", markers.Accepted, markers.Failed, "host unreachable", nil); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(30 * time.Minute)
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_02", Actor: "alice", IdempotencyKey: "deploy-1", PreviousAttempt: "ex_01"}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.FindByIdempotencyKey("alice", "deploy-1"); err != nil || rec.ID != "ex_02" || rec.PreviousAttempt != "ex_01" {
		t.Fatalf("key names %+v, %v; want ex_02 with previous_attempt ex_01", rec, err)
	}
	if _, err := s.Update(ctx, "ex_02", "relink", func(r *markers.Record) error {
		r.PreviousAttempt = "ex_99"
		return nil
	}); !errors.Is(err, markers.ErrImmutable) {
		t.Errorf("changing previous_attempt: err = %v; want ErrImmutable", err)
	}
	clock = clock.Add(time.Hour)
	if res, err := s.GC(ctx, markers.GCOptions{}); err != nil || res.Records != 1 {
		t.Fatalf("gc = %+v, %v; want the failed attempt removed", res, err)
	}
	if rec, err := s.FindByIdempotencyKey("alice", "deploy-1"); err != nil || rec.ID != "ex_02" {
		t.Fatalf("after gc the key names %v, %v; want ex_02", rec, err)
	}
}

func TestRevokeDeliveryIsAJournaledEvent(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	s.Create(ctx, &markers.Record{ID: "ex_1"})
	if _, revoked, err := s.RevokeDelivery(ctx, "ex_1", "never delivered"); err != nil || revoked {
		t.Fatalf("revoking a result never delivered = %v, %v; want nothing written", revoked, err)
	}
	s.Update(ctx, "ex_1", "result delivered", func(r *markers.Record) error {
		now := time.Now()
		r.ResultDeliveredAt = &now
		return nil
	})
	rec, revoked, err := s.RevokeDelivery(ctx, "ex_1", "notifications/cancelled")
	if err != nil || !revoked || rec.ResultDeliveredAt != nil {
		t.Fatalf("RevokeDelivery = %+v, %v, %v; want the delivery time cleared", rec, revoked, err)
	}
	if got, _ := s.Get("ex_1"); got.ResultDeliveredAt != nil {
		t.Errorf("stored record still delivered at %v", got.ResultDeliveredAt)
	}
	evs, err := s.Events("ex_1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%s %s %s", ev.Kind, ev.To, ev.Note))
	}
	want := []string{"create accepted ", "update accepted result delivered", "delivery_revoked accepted notifications/cancelled"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events = %q; want %q", got, want)
	}
}

// TestReviewRequiredOnlyWhileUnknown: review required marks an unknown outcome; any way out
// of unknown clears it, and it cannot be set on a record that is not unknown.
func TestReviewRequiredOnlyWhileUnknown(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	review := func(r *markers.Record) error { r.ReviewRequired = true; return nil }
	if _, err := s.Update(ctx, "ex_1", "review", review); err == nil {
		t.Fatal("review required set on an accepted record; want an error")
	}
	rec, err := s.Advance(ctx, "ex_1", markers.Accepted, []markers.State{markers.Authorized, markers.Dispatched, markers.Unknown}, "lost", review)
	if err != nil || !rec.ReviewRequired {
		t.Fatalf("unknown with review: %+v, %v; want review required", rec, err)
	}
	if rec, err = s.Update(ctx, "ex_1", "more evidence", review); err != nil || !rec.ReviewRequired {
		t.Fatalf("update of an unknown record: %+v, %v; want review required kept", rec, err)
	}
	rec, err = s.Transition(ctx, "ex_1", markers.Unknown, markers.Failed, "reviewed", nil)
	if err != nil || rec.ReviewRequired {
		t.Fatalf("after review: %+v, %v; want review required cleared", rec, err)
	}
	if got, _ := s.Get("ex_1"); got.ReviewRequired {
		t.Errorf("stored record still requires review: %+v", got)
	}
}

// A record created along a path to unknown with review required (postern recover) carries the
// flag on its last step only; one created to end elsewhere cannot carry it. Where it was
// recovered from is part of its identity.
func TestCreateUnknownForReview(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	r := &markers.Record{ID: "ex_1", RecoveredFrom: "h1", Fingerprint: "fp", ReviewRequired: true}
	if _, err := s.CreateAdvanced(ctx, r, []markers.State{markers.Authorized, markers.Dispatched}, "recovered"); err == nil {
		t.Fatal("created dispatched with review required; want an error")
	}
	rec, err := s.CreateAdvanced(ctx, r, []markers.State{markers.Authorized, markers.Dispatched, markers.Unknown}, "recovered")
	if err != nil || rec.State != markers.Unknown || !rec.ReviewRequired || rec.RecoveredFrom != "h1" {
		t.Fatalf("create = %+v, %v; want unknown, review required, recovered from h1", rec, err)
	}
	evs, _ := s.Events("ex_1")
	var flags []bool
	for _, ev := range evs {
		r, err := ev.DecodedRecord()
		if err != nil {
			t.Fatal(err)
		}
		flags = append(flags, r.ReviewRequired)
	}
	if fmt.Sprint(flags) != "[false false false true]" {
		t.Errorf("review required by step = %v; want it on the last (unknown) only", flags)
	}
	if _, err := s.Update(ctx, "ex_1", "x", func(r *markers.Record) error { r.RecoveredFrom = ""; return nil }); !errors.Is(err, markers.ErrImmutable) {
		t.Errorf("clearing recovered_from = %v; want ErrImmutable", err)
	}
	if found, err := s.FindByFingerprint("", "", "fp"); err != nil || found.ID != "ex_1" {
		t.Errorf("find the recovered execution by its fingerprint alone = %v, %v", found, err)
	}
	closeAndVerify(t, s)
}

func TestCreateAdvancedWritesEveryStepInOneCommit(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	if _, err := s.CreateAdvanced(ctx, &markers.Record{ID: "ex_bad", Actor: "a"}, []markers.State{markers.Dispatched}, ""); !errors.Is(err, markers.ErrIllegalTransition) {
		t.Fatalf("accepted → dispatched: %v; want ErrIllegalTransition", err)
	}
	before := s.Stats()
	path := []markers.State{markers.Authorized, markers.Dispatched}
	rec, err := s.CreateAdvanced(ctx, &markers.Record{ID: "ex_1", Actor: "a", Fingerprint: "fp", IntentScope: "run:1"}, path, "dispatching to h1")
	if err != nil || rec.State != markers.Dispatched || rec.StateTimes[markers.Accepted].IsZero() || rec.StateTimes[markers.Authorized].IsZero() {
		t.Fatalf("create advanced = %+v, %v; want dispatched with every state's time", rec, err)
	}
	after := s.Stats()
	if after.Commits-before.Commits != 1 || after.Events-before.Events != 3 {
		t.Errorf("commits +%d, events +%d; want one commit with three events", after.Commits-before.Commits, after.Events-before.Events)
	}
	evs, _ := s.Events("ex_1")
	var got []string
	for _, ev := range evs {
		var r markers.Record
		if err := json.Unmarshal(ev.Record, &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%s→%s(%s)[%s]", ev.Kind, ev.From, ev.To, ev.Note, r.State))
	}
	want := "[create:→accepted()[accepted] transition:accepted→authorized(dispatching to h1)[authorized] transition:authorized→dispatched(dispatching to h1)[dispatched]]"
	if fmt.Sprint(got) != want {
		t.Errorf("events = %v; want %s", got, want)
	}
	if found, err := s.FindByFingerprint("a", "run:1", "fp"); err != nil || found.ID != "ex_1" {
		t.Errorf("find by fingerprint = %v, %v", found, err)
	}
	if page, _, err := s.List(markers.Query{State: markers.Dispatched}); err != nil || len(page) != 1 {
		t.Errorf("list dispatched = %v, %v; want ex_1", page, err)
	}
	if _, err := s.CreateAdvanced(ctx, &markers.Record{ID: "ex_1", Actor: "a"}, path, ""); !errors.Is(err, markers.ErrExists) {
		t.Errorf("second create = %v; want ErrExists", err)
	}
	closeAndVerify(t, s)
}

// TestNoSyncWrite: an update asked for NoSync commits without an fsync, is seen at once, is
// chained like any other, and survives a clean reopen (Close's checkpoint syncs it).
func TestNoSyncWrite(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	if _, err := s.Create(ctx, &markers.Record{ID: "ex_1", Actor: "a"}); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	if _, err := s.UpdateWith(ctx, "ex_1", "delivered", markers.NoSync, func(r *markers.Record) error {
		r.Evidence = append(r.Evidence, "unsynced")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	if after.Commits != before.Commits || after.Unsynced != before.Unsynced+1 || after.Events != before.Events+1 {
		t.Errorf("stats %+v → %+v; want one unsynced commit of one event, no fsync", before, after)
	}
	if rec, err := s.Get("ex_1"); err != nil || fmt.Sprint(rec.Evidence) != "[unsynced]" {
		t.Errorf("get = %v, %v; want the unsynced update", rec, err)
	}
	if _, err := s.Update(ctx, "ex_1", "synced", nil); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Commits != after.Commits+1 {
		t.Errorf("synced update: commits +%d; want 1", st.Commits-after.Commits)
	}
	s.Reopen(t)
	if rec, err := s.Get("ex_1"); err != nil || fmt.Sprint(rec.Evidence) != "[unsynced]" {
		t.Errorf("after reopen: %v, %v", rec, err)
	}
	if rep := closeAndVerify(t, s); rep.Events != 3 {
		t.Errorf("verify = %v; want PASS over 3 events", rep)
	}
}

// closeAndVerify closes s and checks its data dir with the offline verifier.
func closeAndVerify(t *testing.T, s *testutil.Store) markers.Report {
	t.Helper()
	s.Close()
	rep, err := markers.VerifyDir(s.Dir, s.VerifierKey, markers.VerifyOptions{})
	if err != nil || !rep.OK {
		t.Errorf("verify = %v, %v", rep, err)
	}
	return rep
}

// TestRecordsAreCopies: whatever a caller does to a record it was handed, the store's (and
// its cache's) stays as written.
func TestRecordsAreCopies(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	created, err := s.Create(ctx, &markers.Record{ID: "ex_1", Actor: "a", Command: []string{"true"}, Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	scribble := func(r *markers.Record) {
		r.Command[0], r.Env["A"], r.Evidence = "rm -rf /", "2", append(r.Evidence, "scribbled")
		r.StateTimes[markers.Accepted] = time.Time{}
	}
	scribble(created)
	got, _ := s.Get("ex_1")
	scribble(got)
	moved, err := s.Transition(ctx, "ex_1", markers.Accepted, markers.Authorized, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	scribble(moved)
	again, _ := s.Transition(ctx, "ex_1", markers.Accepted, markers.Authorized, "", nil) // idempotent: the current record
	scribble(again)
	conflict, _ := s.Transition(ctx, "ex_1", markers.Accepted, markers.Rejected, "", nil)
	scribble(conflict)
	existing, _ := s.Create(ctx, &markers.Record{ID: "ex_1", Actor: "a"})
	scribble(existing)
	for _, when := range []string{"cached", "reopened"} {
		rec, err := s.Get("ex_1")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Command[0] != "true" || rec.Env["A"] != "1" || len(rec.Evidence) != 0 || rec.StateTimes[markers.Accepted].IsZero() || rec.State != markers.Authorized {
			t.Errorf("%s: record = %+v; want it as written", when, rec)
		}
		s.Reopen(t)
	}
}

// TestRecordCacheBounded: with a cache of two records, reads and writes of many still see
// each record as last written.
func TestRecordCacheBounded(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) { o.RecordCacheEntries = 2 })
	ctx := context.Background()
	for i := range 10 {
		if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprint("ex_", i), Actor: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		for i := range 10 {
			if _, err := s.Update(ctx, fmt.Sprint("ex_", i), "", func(r *markers.Record) error {
				r.Evidence = append(r.Evidence, fmt.Sprint(round))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 10 {
		if rec, err := s.Get(fmt.Sprint("ex_", i)); err != nil || fmt.Sprint(rec.Evidence) != "[0 1 2]" {
			t.Errorf("ex_%d = %v, %v; want evidence [0 1 2]", i, rec, err)
		}
	}
}

// TestConcurrentWritersAndReaders: writers and readers of the same records at once (run with
// -race): every update lands once, and each record's events tell the same story as the record.
func TestConcurrentWritersAndReaders(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) { o.RecordCacheEntries = 3 })
	ctx := context.Background()
	const ids, writers, updates = 4, 4, 25
	for i := range ids {
		if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprint("ex_", i), Actor: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for u := range updates {
				id := fmt.Sprint("ex_", (w+u)%ids)
				if _, err := s.UpdateWith(ctx, id, "", markers.Durability(u%2), func(r *markers.Record) error {
					r.TimeoutSeconds++
					return nil
				}); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Go(func() {
			for u := range updates {
				if rec, err := s.Get(fmt.Sprint("ex_", u%ids)); err != nil {
					t.Error(err)
				} else {
					rec.TimeoutSeconds = -1000 // a reader's scribbles never reach the store
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for i := range ids {
		id := fmt.Sprint("ex_", i)
		rec, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		evs, _ := s.Events(id)
		var last markers.Record
		if err := json.Unmarshal(evs[len(evs)-1].Record, &last); err != nil {
			t.Fatal(err)
		}
		if rec.TimeoutSeconds != len(evs)-1 || last.TimeoutSeconds != rec.TimeoutSeconds {
			t.Errorf("%s: counter %d, last event's %d, %d updates; want all equal", id, rec.TimeoutSeconds, last.TimeoutSeconds, len(evs)-1)
		}
		total += rec.TimeoutSeconds
	}
	if total != writers*updates {
		t.Errorf("%d updates landed; want %d", total, writers*updates)
	}
}
