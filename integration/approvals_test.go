package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestApprovalsAnAgentCannotGiveItself: with no [approvals] operators named, the bastion's
// own user — which an agent of that uid, and its shell, shares — cannot approve; it is told
// what to do instead. The approval request reaches the operator's webhook with why the agent
// wants it, who asked, what and where, the rule and its expiry; a denial is taken.
func TestApprovalsAnAgentCannotGiveItself(t *testing.T) {
	var mu sync.Mutex
	var announced []api.ApprovalRequest
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req api.ApprovalRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("webhook body %s: %v", body, err)
		}
		mu.Lock()
		announced = append(announced, req)
		mu.Unlock()
	}))
	defer hook.Close()
	f := newFleet(t, fleetOptions{tables: []string{
		"[approvals]\nwebhook = \"" + hook.URL + "/postern\"",
		"[[rules]]\nname = \"migrations\"\ndecision = \"approve\"\ncommands = [\"migrate **\"]",
	}})
	ctx := testContext(t)
	effectsFile := f.bastion.Dir + "/effects"
	x := mustCall(t, ctx, f.session(t, "agent", "run-1"), "ssh_exec", map[string]any{
		"host": "h1", "command": "migrate up; echo x >> " + effectsFile, "reason": "ship release 42"})
	if x.State != string(markers.AwaitingApproval) {
		t.Fatalf("call = %+v; want awaiting_approval", x)
	}

	var got api.ApprovalRequest
	testutil.WaitFor(t, "the webhook to hear of it", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(announced) > 0 {
			got = announced[0]
		}
		return len(announced) > 0
	})
	if got.ExecutionID != x.ExecutionID || got.Reason != "ship release 42" || got.Actor != "token:agent" || got.Run == "" ||
		!strings.Contains(got.What, "migrate up") || got.Host != "h1" || !strings.Contains(got.Rule, "migrations") || got.Expires.IsZero() || got.Decide == "" {
		t.Errorf("announced %+v; want the request with why, who, what, where, the rule and its expiry", got)
	}
	if out := mustCLI(t, ctx, f.bastion, "approvals", "list"); !strings.Contains(out, "because    ship release 42") || !strings.Contains(out, x.ExecutionID) {
		t.Errorf("approvals list:\n%s\nwant the request with its reason", out)
	}

	res := operatorCLI(t, ctx, f.bastion, "approve", x.ExecutionID)
	if res.code == 0 || !strings.Contains(res.stderr, "may not approve "+x.ExecutionID) || !strings.Contains(res.stderr, "the bastion's own user") ||
		!strings.Contains(res.stderr, "sudo postern approve "+x.ExecutionID) {
		t.Fatalf("approve as the bastion's user: exit %d, stderr %q; want it refused, saying why and what to do", res.code, res.stderr)
	}
	mustCLI(t, ctx, f.bastion, "deny", x.ExecutionID, "--reason", "not today")
	if rec := journaled(t, f.bastion, x.ExecutionID); rec.State != markers.Rejected {
		t.Fatalf("after the denial: %s; want rejected", rec.State)
	}
	if n := effects(t, effectsFile); n != 0 {
		t.Fatalf("the command ran %d times; want 0", n)
	}
}
