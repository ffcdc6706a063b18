package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
	"github.com/postern-dev/postern/markers"
)

// TestRunAsAcrossRestart: an execution run as a granted account is journaled with it, and
// after a restart the engine asks the host about it as that account (the hostagent keeps
// markers per account), so it adopts the running command instead of sending it again. The
// enrolled account named explicitly is the same intent as no account; an actor without a
// grant is rejected.
func TestRunAsAcrossRestart(t *testing.T) {
	u := unixuser.NewLogin(t, "runaseng")
	host := harness.NewHostagentFor(t, []string{"root", u.Name})
	host.Start(t)
	f := newFleetOn(t, host, func(c *config.Config) {
		c.Rules = []policy.Rule{{Name: "alice-as-app", Decision: policy.DecisionAllow, Actors: []string{"alice"}, Accounts: []string{u.Name}, Hosts: []string{"h1"}}}
	})
	shared := unixuser.SharedDir(t, "runas-gate-")
	gate := filepath.Join(shared, "open")
	wait := 0
	args := api.ExecArgs{Host: "h1", Account: u.Name, Command: "id -un; while [ ! -e " + gate + " ]; do sleep 0.02; done",
		CallOptions: api.CallOptions{WaitS: &wait}}
	x := f.exec(t, alice, args)
	f.waitState(t, alice, x.ExecutionID, markers.Running)
	if rec := f.record(t, x.ExecutionID); rec.Account != u.Name {
		t.Fatalf("journaled account %q; want %s", rec.Account, u.Name)
	}

	f.reopen(t)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f.waitState(t, alice, x.ExecutionID, markers.Completed)
	again := f.exec(t, alice, args)
	if again.ExecutionID != x.ExecutionID || strings.TrimSpace(again.Stdout) != u.Name {
		t.Errorf("after the restart: %s, stdout %q; want %s adopted, run once as %s", again.ExecutionID, again.Stdout, x.ExecutionID, u.Name)
	}
	if n := f.journaled(t); n != 1 {
		t.Errorf("journal holds %d executions; want 1", n)
	}

	root := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "id -un", CallOptions: api.CallOptions{WaitS: &wait}})
	named := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "id -un", Account: "root", CallOptions: api.CallOptions{WaitS: &wait}})
	if named.ExecutionID != root.ExecutionID {
		t.Errorf("naming the enrolled account made another execution (%s, %s); want the same intent", named.ExecutionID, root.ExecutionID)
	}

	refused := f.exec(t, bob, args)
	if refused.State != string(markers.Rejected) || !strings.Contains(refused.Cause, "may not run commands as "+u.Name) {
		t.Errorf("bob without a grant: %s (%s); want rejected", refused.State, refused.Cause)
	}
}
