package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// TestRunAsByPolicy runs a command as another account than the host's enrolled one (root):
// a grant lets the agent use runaspg on h1 and the hostagent allows it, so the command runs
// as runaspg and the journal and the marker say so; another actor without a grant is
// rejected with nothing run; an account the policy grants but the hostagent does not allow
// fails, saying so, with nothing run.
func TestRunAsByPolicy(t *testing.T) {
	const pg, stranger = "runaspg", "runasx"
	unixuser.NewLogin(t, pg)
	unixuser.NewLogin(t, stranger) // a local account, not in allowed_accounts
	h := harness.NewHostagentFor(t, []string{"root", pg})
	h.Start(t)
	b := harness.NewBastion(t, h.ClientKey, fmt.Sprintf(`[[rules]]
name = "agent-runs-as-db"
decision = "allow"
actors = ["agent"]
accounts = [%q, %q]
hosts = ["h1"]
`, pg, stranger))
	b.Enroll(t, "h1", h)
	b.Start(t)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	ctx := testContext(t)
	agent := f.session(t, "agent", "runas")

	x := mustCall(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "id -un", "account": pg})
	if x.State != "completed" || strings.TrimSpace(x.Stdout) != pg {
		t.Fatalf("ssh_exec as %s = %s, stdout %q, stderr %q; want it run as %s", pg, x.State, x.Stdout, x.Stderr, pg)
	}
	if rec := journaled(t, b, x.ExecutionID); rec.Account != pg {
		t.Errorf("journal records account %q; want %s", rec.Account, pg)
	}
	if out := postern(t, b, "executions", "show", x.ExecutionID); !strings.Contains(string(out), pg) {
		t.Errorf("executions show names no %s:\n%s", pg, out)
	}
	marker, err := exec.Command(harness.Binary(t, "postern-hostagent"), "markers", "show", x.ExecutionID, "--json", "--config", h.ConfigPath).CombinedOutput()
	if err != nil || !strings.Contains(string(marker), fmt.Sprintf("%q", pg)) {
		t.Errorf("markers show: %v\n%s\nwant the account %s", err, marker, pg)
	}
	// The enrolled account is unchanged, and its connection is the host's own.
	if x := mustCall(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "id -un"}); strings.TrimSpace(x.Stdout) != "root" {
		t.Errorf("ssh_exec without account ran as %q; want root", x.Stdout)
	}

	// No grant: rejected by policy, naming the repair; the host is sent nothing.
	before := len(allMarkers(t, ctx, h))
	other := f.session(t, "other", "runas")
	res, err := callExecution(ctx, other, "ssh_exec", map[string]any{"host": "h1", "command": "id -un", "account": pg})
	text := fmt.Sprintf("%+v %v", res, err)
	if res.State != "rejected" || !strings.Contains(text, "may not run commands as "+pg+" on host h1") || !strings.Contains(text, "accounts") {
		t.Errorf("ssh_exec as %s by an actor without a grant = %s; want a rejection naming the grant to ask for", pg, text)
	}

	// Granted, but the hostagent does not allow it: a failure that says so; nothing runs.
	res, err = callExecution(ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "id -un", "account": stranger})
	text = fmt.Sprintf("%+v %v", res, err)
	if res.State != "failed" || !strings.Contains(text, "allowed_accounts") || !strings.Contains(text, stranger) {
		t.Errorf("ssh_exec as %s, which the hostagent does not allow = %s; want a failure naming allowed_accounts", stranger, text)
	}
	// A bad account name never reaches the journal.
	if msg := mustRefuse(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "true", "account": "-oProxyCommand=x"}); !strings.Contains(msg, "account must be a user name") {
		t.Errorf("bad account name: %s", msg)
	}
	if after := len(allMarkers(t, ctx, h)); after != before {
		t.Errorf("the host has %d markers after the refused calls; want %d (nothing run)", after, before)
	}
}
