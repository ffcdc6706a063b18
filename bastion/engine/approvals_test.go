package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/markers"
)

// newGatedFleet is a fleet whose hostagent is enrolled as h1 and, under a rule that requires
// approval for every command, as gated; and as vault, whose rule makes it irreversible.
func newGatedFleet(t testing.TB, adjust ...func(*config.Config)) *testFleet {
	t.Helper()
	rules := func(c *config.Config) {
		c.Rules = []policy.Rule{
			approvalRule("gated"),
			{Name: "vault-irreversible", Class: config.ClassIrreversible, Decision: policy.DecisionApprove, Hosts: []string{"vault"}},
		}
	}
	f := newFleet(t, append([]func(*config.Config){rules}, adjust...)...)
	f.alias(t, "gated")
	f.alias(t, "vault")
	return f
}

// clientApprovals lets the agent's user decide remote_command approvals in the client
// (operator_approval_only = false; by default every class's approvals stay with operators).
func clientApprovals(c *config.Config) {
	c.Classes = append(c.Classes, config.Class{Name: config.ClassRemoteCommand, OperatorApprovalOnly: new(false)})
}

// TestApprove: a rule requiring approval holds the execution, a retry returns it pending
// (no second approval), and the operator's approval dispatches it once.
func TestApprove(t *testing.T) {
	f := newGatedFleet(t)
	ctx := context.Background()
	args := api.ExecArgs{Host: "gated", Command: f.effect("ran")}
	x := f.exec(t, alice, args)
	if x.State != string(markers.AwaitingApproval) || x.Class != config.ClassRemoteCommand {
		t.Fatalf("exec = %s, class %s; want awaiting_approval, remote_command", x.State, x.Class)
	}
	pending, err := f.engine().PendingApprovals(10)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending.Approvals) != 1 || pending.Approvals[0].ExecutionID != x.ExecutionID {
		t.Errorf("pending approvals = %+v; want %s", pending.Approvals, x.ExecutionID)
	} else if a := pending.Approvals[0]; a.Actor == "" || a.Run == "" || a.What == "" || a.Rule == "" || a.Requested.IsZero() || a.Expires.IsZero() {
		t.Errorf("approval request = %+v; want who asked, what, the rule, when and until when", a)
	}
	again := f.exec(t, alice, args)
	if again.ExecutionID != x.ExecutionID || again.State != string(markers.AwaitingApproval) || !again.Replayed {
		t.Errorf("retry = %s %s (replayed %v); want %s still pending, replayed", again.ExecutionID, again.State, again.Replayed, x.ExecutionID)
	}

	if got := f.investigated(t, x.ExecutionID, answerLater); !strings.Contains(got, "returned it awaiting approval, no second approval") {
		t.Errorf("later calls = %q; want the retry returned pending", got)
	}
	_, err = f.engine().Approve(ctx, testOperator, x.ExecutionID, strings.Repeat("n", 2000))
	wantCode(t, err, api.CodeInvalidArgument)
	_, err = f.engine().Approve(ctx, testOperator, "ex_00000000000000000000000000", "")
	wantCode(t, err, api.CodeNotFound)
	if got := f.count(t, "ran"); got != 0 {
		t.Fatalf("ran %d times before the approval; want 0", got)
	}

	rec, err := f.engine().Approve(ctx, testOperator, x.ExecutionID, "looks fine")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != markers.Authorized || !slices.Contains(rec.Evidence, "approved by op: looks fine") {
		t.Errorf("approved record = %s, evidence %q; want authorized by op", rec.State, rec.Evidence)
	}
	end, err := f.engine().AwaitEnd(ctx, alice, x.ExecutionID, nil)
	if err != nil {
		t.Fatal(err)
	}
	finished(t, end)
	if _, err := f.engine().Approve(ctx, testOperator, x.ExecutionID, ""); !errors.Is(err, api.ErrNotAwaitingApproval) {
		t.Errorf("approve again = %v; want ErrNotAwaitingApproval", err)
	}
	if got := f.count(t, "ran"); got != 1 {
		t.Errorf("ran %d times; want 1", got)
	}
}

// TestDeny: a denial rejects the execution, a retry returns the rejection, and it cannot be
// approved any more.
func TestDeny(t *testing.T) {
	f := newGatedFleet(t)
	ctx := context.Background()
	args := api.ExecArgs{Host: "gated", Command: f.effect("ran")}
	x := f.exec(t, alice, args)
	_, err := f.engine().Deny(ctx, testOperator, x.ExecutionID, " ")
	wantCode(t, err, api.CodeInvalidArgument)
	rec, err := f.engine().Deny(ctx, testOperator, x.ExecutionID, "not today")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != markers.Rejected {
		t.Errorf("denied = %s; want rejected", rec.State)
	}
	again := f.exec(t, alice, args)
	if again.ExecutionID != x.ExecutionID || again.State != string(markers.Rejected) || !again.Replayed || !strings.Contains(again.Next, "same rejection") {
		t.Errorf("retry = %s %s (replayed %v, next %q); want the rejection of %s", again.ExecutionID, again.State, again.Replayed, again.Next, x.ExecutionID)
	}
	if got := f.investigated(t, x.ExecutionID, answerLater); !strings.Contains(got, "returned the same rejection") {
		t.Errorf("later calls = %q; want the retry given the rejection", got)
	}
	if got := f.investigated(t, x.ExecutionID, answerAuthorization); !strings.Contains(got, "denied by op: not today") || !strings.Contains(got, "Never dispatched") {
		t.Errorf("authorization = %q; want the denial, never dispatched", got)
	}
	// Denying again is idempotent: the rejection stands as it was journaled.
	if again, err := f.engine().Deny(ctx, api.Operator{Name: "op2", UID: 4243}, x.ExecutionID, "again"); err != nil || again.State != markers.Rejected || slices.ContainsFunc(again.Evidence, func(e string) bool { return strings.Contains(e, "op2") }) {
		t.Errorf("deny again = %+v, %v; want the first rejection unchanged", again, err)
	}
	// Approving it is refused.
	if _, err := f.engine().Approve(ctx, testOperator, x.ExecutionID, ""); !errors.Is(err, api.ErrNotAwaitingApproval) {
		t.Errorf("approve after the denial = %v; want ErrNotAwaitingApproval", err)
	}
	if got := f.count(t, "ran"); got != 0 {
		t.Errorf("a denied command ran %d times; want 0", got)
	}
}

// TestApprovalTimeout: the reconcile loop rejects an execution that waited longer than the
// approval timeout.
func TestApprovalTimeout(t *testing.T) {
	f := newGatedFleet(t, func(c *config.Config) { c.ReconcileInterval = 10 * time.Millisecond })
	x := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("ran")})
	if x.State != string(markers.AwaitingApproval) {
		t.Fatalf("exec = %s; want awaiting_approval", x.State)
	}
	f.clock.advance(f.cfg.ApprovalTimeout + time.Minute)
	f.waitState(t, alice, x.ExecutionID, markers.Rejected)
	if ev := f.record(t, x.ExecutionID).Evidence; !strings.Contains(verdict.LastEvidence(ev), "approval timeout") {
		t.Errorf("evidence %q; want the approval timeout", ev)
	}
	if got := f.count(t, "ran"); got != 0 {
		t.Errorf("an expired command ran %d times; want 0", got)
	}
}

// TestApprovalInClient: the agent's user is asked once, decides for its own executions, never
// for an operator-only class; through a bridge only the execution's own agent run may relay
// the decision, with the offer's token redeemed.
func TestApprovalInClient(t *testing.T) {
	f := newGatedFleet(t, clientApprovals)
	ctx := context.Background()

	x := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("approved")})
	if ask, _ := f.engine().AskInClient(ctx, bob, x.ExecutionID); ask != nil {
		t.Errorf("another actor was offered the approval: %+v", ask)
	}
	_, err := f.engine().DecideInClient(ctx, alice, x.ExecutionID, "approve", "", nil)
	wantCode(t, err, api.CodeNotOffered)
	ask, err := f.engine().AskInClient(ctx, alice, x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if ask == nil || ask.ExecutionID != x.ExecutionID || ask.Host != "gated" || ask.What != f.effect("approved") || ask.Expires.IsZero() {
		t.Fatalf("approval request = %+v; want one for %s on gated, with its expiry", ask, x.ExecutionID)
	}
	if again, err := f.engine().AskInClient(ctx, alice, x.ExecutionID); again != nil || err != nil {
		t.Errorf("asked again = %+v, %v; want it asked once", again, err)
	}
	_, err = f.engine().DecideInClient(ctx, alice, x.ExecutionID, "maybe", "", nil)
	wantCode(t, err, api.CodeInvalidArgument)
	got, err := f.engine().DecideInClient(ctx, alice, x.ExecutionID, "approve", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != string(markers.Authorized) {
		t.Errorf("approved in the client = %s; want authorized", got.State)
	}
	f.waitState(t, alice, x.ExecutionID, markers.Completed)

	denied := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("denied")})
	if ask, err := f.engine().AskInClient(ctx, alice, denied.ExecutionID); ask == nil || err != nil {
		t.Fatalf("ask = %+v, %v; want an offer", ask, err)
	}
	if got, err = f.engine().DecideInClient(ctx, alice, denied.ExecutionID, "deny", "", nil); err != nil {
		t.Fatal(err)
	}
	if got.State != string(markers.Rejected) || !strings.Contains(verdict.LastEvidence(got.Evidence), "denied in the client") {
		t.Errorf("denied in the client = %s (%q); want rejected", got.State, got.Evidence)
	}

	irreversible := f.exec(t, alice, api.ExecArgs{Host: "vault", Command: f.effect("vault")})
	if irreversible.State != string(markers.AwaitingApproval) || irreversible.Class != config.ClassIrreversible {
		t.Fatalf("exec on vault = %s, class %s; want awaiting_approval, irreversible", irreversible.State, irreversible.Class)
	}
	if ask, err := f.engine().AskInClient(ctx, alice, irreversible.ExecutionID); ask != nil || err != nil {
		t.Errorf("an irreversible approval was offered: %+v, %v", ask, err)
	}
	_, err = f.engine().DecideInClient(ctx, alice, irreversible.ExecutionID, "approve", "", nil)
	wantCode(t, err, api.CodeOperatorApprovalOnly)

	if n, m, v := f.count(t, "approved"), f.count(t, "denied"), f.count(t, "vault"); n != 1 || m != 0 || v != 0 {
		t.Errorf("side effects: approved %d, denied %d, vault %d; want 1, 0, 0", n, m, v)
	}
}

// TestApprovalThroughBridge: a decision relayed by a stdio bridge counts only from the
// bridge of the execution's own agent run, and only once its offer's token is redeemed.
func TestApprovalThroughBridge(t *testing.T) {
	f := newGatedFleet(t, clientApprovals)
	ctx := context.Background()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bridged := func(scope string) transport.Caller {
		return transport.Caller{Actor: "local:tester", Scope: scope, Local: true, Bridged: true, BridgeBinary: true, PID: os.Getpid(), UID: os.Geteuid(), Exe: self}
	}
	own := bridged("run:100-1")
	x := f.exec(t, own, api.ExecArgs{Host: "gated", Command: f.effect("ran")})
	if x.State != string(markers.AwaitingApproval) {
		t.Fatalf("exec through the bridge = %s; want awaiting_approval", x.State)
	}
	if ask, err := f.engine().AskInClient(ctx, own, x.ExecutionID); ask == nil || err != nil {
		t.Fatalf("ask = %+v, %v; want an offer", ask, err)
	}
	redeemed := 0
	redeem := func(ok bool) func() bool { return func() bool { redeemed++; return ok } }
	direct := own
	direct.Bridged = false
	tests := []struct {
		name   string
		caller transport.Caller
		ok     bool
	}{
		{name: "another agent run's bridge", caller: bridged("run:200-1"), ok: true},
		{name: "not through a bridge", caller: direct, ok: true},
		{name: "token not redeemed", caller: own, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.engine().DecideInClient(ctx, tt.caller, x.ExecutionID, "approve", "", redeem(tt.ok))
			wantCode(t, err, api.CodeNotOffered)
		})
	}
	if redeemed != 1 {
		t.Errorf("redeem called %d times by the refused decisions; want only once, for the bridge of the run", redeemed)
	}
	got, err := f.engine().DecideInClient(ctx, own, x.ExecutionID, "approve", "", redeem(true))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != string(markers.Authorized) {
		t.Errorf("approved through the bridge = %s; want authorized", got.State)
	}
	f.waitState(t, own, x.ExecutionID, markers.Completed)
	if got := f.investigated(t, x.ExecutionID, answerWho); !strings.Contains(got, "pid "+strconv.Itoa(os.Getpid())+", "+self) || !strings.Contains(got, "via stdio-bridge") {
		t.Errorf("who = %q; want the agent process through the bridge", got)
	}
	if n := f.count(t, "ran"); n != 1 {
		t.Errorf("ran %d times; want 1", n)
	}
}

// TestApproveAsTheBastionsUser: the bastion's own uid — which any agent of that uid, its
// shell included, shares — may not approve or review by default, and is told what to do;
// named in [approvals] operators it may. A denial is taken from it.
func TestApproveAsTheBastionsUser(t *testing.T) {
	self := api.Operator{Name: "operator:self", UID: os.Getuid()}
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("named=%v", named), func(t *testing.T) {
			f := newGatedFleet(t, func(c *config.Config) {
				if named {
					c.Approvals.Operators = []string{strconv.Itoa(os.Getuid())}
				}
			})
			ctx := context.Background()
			x := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("ran")})
			_, err := f.engine().Approve(ctx, self, x.ExecutionID, "")
			var te *api.ToolError
			switch {
			case named && err != nil:
				t.Fatalf("approve as a named operator: %v", err)
			case !named && (!errors.As(err, &te) || te.Code != api.CodeNotAnOperator || !strings.Contains(te.Message, "the bastion's own user") || !strings.Contains(te.Message, "sudo postern approve "+x.ExecutionID)):
				t.Fatalf("approve as the bastion's user: %v; want not_an_operator saying why and what to do", err)
			case !named:
				if _, err := f.engine().Deny(ctx, self, x.ExecutionID, "no"); err != nil {
					t.Fatalf("deny as the bastion's user: %v; want it taken", err)
				}
				return
			}
			f.waitState(t, alice, x.ExecutionID, markers.Completed)
		})
	}
}
