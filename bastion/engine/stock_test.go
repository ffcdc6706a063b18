package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/markers"
)

// A host at guarantee level none is reached as a stock sshd: its commands go as one line
// over a session, and nothing on it records executions. The fleet's hostagent serves such
// sessions too, so it stands in for that sshd here, enrolled as "plain".

// newPlainFleet is a fleet with its hostagent enrolled as h1 and, at level none, as plain.
func newPlainFleet(t testing.TB) *testFleet {
	t.Helper()
	f := newFleet(t)
	plain := f.hostAs("plain")
	plain.Guarantee = fleet.GuaranteeNone
	f.enroll(t, plain)
	return f
}

// TestLevelNone: a command on a host at level none runs once and its output is kept; what
// the host cannot do (operation keys, markers, cancel) is refused, and the doctor and an
// investigation say what it is.
func TestLevelNone(t *testing.T) {
	f := newPlainFleet(t)
	ctx := context.Background()
	args := api.ExecArgs{Host: "plain", Command: f.effect("ran") + "; echo hi", Env: map[string]string{"LANG": "C"}}
	x := f.exec(t, alice, args)
	finished(t, x)
	if x.Stdout != "hi\n" {
		t.Errorf("stdout %q; want hi", x.Stdout)
	}
	if again := f.exec(t, alice, args); again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Errorf("retry = %s (replayed %v); want %s replayed", again.ExecutionID, again.Replayed, x.ExecutionID)
	}
	if n := f.count(t, "ran"); n != 1 {
		t.Errorf("ran %d times; want 1", n)
	}

	_, err := f.engine().Exec(ctx, alice, api.ExecArgs{Host: "plain", Command: "true", OperationKey: "migration:1"}, nil)
	wantCode(t, err, api.CodeInvalidArgument)
	if _, err := f.engine().HostMarkers(ctx, "plain", api.MarkerQuery{}); !errors.Is(err, api.ErrNoMarkers) {
		t.Errorf("markers of a host at level none = %v; want ErrNoMarkers", err)
	}
	if _, err := f.engine().HostMarker(ctx, "plain", x.ExecutionID); !errors.Is(err, api.ErrNoMarkers) {
		t.Errorf("marker on a host at level none = %v; want ErrNoMarkers", err)
	}
	rep, err := f.engine().Doctor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range rep.Hosts {
		if h.Name == "plain" && (!h.OK || h.Guarantee != string(fleet.GuaranteeNone)) {
			t.Errorf("doctor on plain = %+v; want ok at level none", h)
		}
	}

	running := f.exec(t, alice, api.ExecArgs{Host: "plain", Command: f.gate("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	f.waitState(t, alice, running.ExecutionID, markers.Running)
	c, err := f.engine().Cancel(ctx, alice, running.ExecutionID)
	if err != nil || !strings.Contains(c.Next, "could not be delivered") {
		t.Errorf("cancel on a host at level none = %+v, %v; want it not delivered", c, err)
	}
	f.release(t, "g")
	f.waitState(t, alice, running.ExecutionID, markers.Completed)
}

// TestLevelNoneLost: the connection to a host at level none is lost mid-command. Nothing on
// the host can tell the outcome, so it is unknown with review required, a retry joins it and
// sends nothing, and the operator's review settles it.
func TestLevelNoneLost(t *testing.T) {
	f := newPlainFleet(t)
	ctx := context.Background()
	args := api.ExecArgs{Host: "plain", Command: f.gated("g"), CallOptions: api.CallOptions{WaitS: waitS(0)}}
	x := f.exec(t, alice, args)
	f.waitStarted(t, "g")
	f.waitState(t, alice, x.ExecutionID, markers.Running)
	f.host.Kill(t)
	st := f.waitState(t, alice, x.ExecutionID, markers.Unknown)
	if !st.ReviewRequired {
		t.Errorf("unknown on a host at level none: review required = false; want true")
	}
	f.host.Start(t)
	retry := args
	retry.WaitS = waitS(5)
	again := f.exec(t, alice, retry)
	if again.ExecutionID != x.ExecutionID || !again.Replayed || again.State != string(markers.Unknown) || !strings.Contains(again.Next, "an operator must review it") {
		t.Errorf("retry = %s %s (replayed %v, next %q); want %s unknown, for review", again.ExecutionID, again.State, again.Replayed, again.Next, x.ExecutionID)
	}
	if n := f.count(t, "g.started"); n != 1 {
		t.Errorf("started %d times; want 1 (never sent again)", n)
	}

	page, err := f.engine().Executions(api.ExecutionQuery{ReviewRequired: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Executions) != 1 || page.Executions[0].ID != x.ExecutionID {
		t.Errorf("executions for review = %d; want %s", len(page.Executions), x.ExecutionID)
	}
	inv, err := f.engine().Investigate(ctx, x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(inv.Outcome.MarkerNote, "guarantee level none") || !strings.Contains(inv.Answers[answerLater], "nothing can be asked of plain") {
		t.Errorf("investigation: marker note %q, later calls %q; want level none named", inv.Outcome.MarkerNote, inv.Answers[answerLater])
	}
	rec, err := f.engine().Review(ctx, testOperator, x.ExecutionID, "completed", "it ran")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != markers.Completed || rec.ReviewRequired {
		t.Errorf("reviewed = %s (review required %v); want completed", rec.State, rec.ReviewRequired)
	}
}
