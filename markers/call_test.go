package markers_test

import (
	"context"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// A call that creates an execution and the calls that join it are events of the chain; a
// run is recorded once, at its first contact; siblings are every execution of one intent.
func TestCallsAndRunsAreJournaled(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	uid := 1000
	first := &markers.Run{Actor: "local:ann", Scope: "run:1-2", FirstSeen: time.Now(), Transport: "unix",
		PID: 1, Exe: "/usr/bin/agent", Cmdline: []string{"agent", "--go"}, UID: &uid}
	rec := markers.Record{ID: "ex_01", Actor: "local:ann", IntentScope: "run:1-2", Fingerprint: "hmac-sha256:aa"}
	if _, err := s.CreateFor(ctx, &rec, &markers.Call{Transport: "unix", RequestID: "1", Run: "run:1-2", Match: "new", NewRun: first}); err != nil {
		t.Fatal(err)
	}
	if err := s.Joined(ctx, "ex_01", &markers.Call{Transport: "unix", RequestID: "2", Run: "run:1-2", Match: "attach", Replayed: true,
		NewRun: &markers.Run{Actor: "local:ann", Scope: "run:1-2", FirstSeen: time.Now(), Exe: "/other"}}); err != nil {
		t.Fatal(err)
	}
	rec2 := markers.Record{ID: "ex_02", Actor: "local:ann", IntentScope: "run:1-2", Fingerprint: "hmac-sha256:aa"}
	if _, err := s.CreateFor(ctx, &rec2, &markers.Call{Transport: "unix", RequestID: "3", Run: "run:1-2", Match: "new"}); err != nil {
		t.Fatal(err)
	}

	evs, err := s.Events("ex_01")
	if err != nil || len(evs) != 2 {
		t.Fatalf("events = %+v, %v; want create and joined", evs, err)
	}
	if j := evs[1]; j.Kind != markers.KindJoined || j.Call == nil || j.Call.RequestID != "2" || !j.Call.Replayed || j.Call.Match != "attach" {
		t.Errorf("joined event = %+v (call %+v); want the joining call", j, j.Call)
	}
	run, err := s.Run("local:ann", "run:1-2")
	if err != nil || run.Exe != "/usr/bin/agent" || run.PID != 1 || *run.UID != 1000 {
		t.Errorf("run = %+v, %v; want the first contact's identity", run, err)
	}
	runs, err := s.Runs(markers.RunQuery{})
	if err != nil || len(runs) != 1 {
		t.Errorf("runs = %+v, %v; want one", runs, err)
	}
	ids, err := s.SiblingIDs("local:ann", "run:1-2", "hmac-sha256:aa", 10)
	if err != nil || len(ids) != 2 || ids[0] != "ex_01" || ids[1] != "ex_02" {
		t.Errorf("siblings = %v, %v; want ex_01, ex_02", ids, err)
	}

	s.Store.Close()
	rep, err := markers.VerifyDir(s.Dir, s.VerifierKey, markers.VerifyOptions{})
	if err != nil || !rep.OK || rep.Events != 3 {
		t.Errorf("verify = %v, %v; want PASS over 3 events", rep, err)
	}
	s.Reopen(t)
}
