package integration

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/internal/testutil/harness"
)

// TestLocalAgentThroughStdioBridge: an agent that launches `postern mcp` as its stdio server
// reaches the bastion over its unix socket; the kernel, not the request, names it: actor
// local:<user>, intent scope this agent process.
func TestLocalAgentThroughStdioBridge(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	bridge := exec.Command(harness.Binary(t, "postern"), "mcp", "--socket", f.bastion.Socket)
	bridge.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "postern-test-local", Version: "0"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: bridge}, nil)
	if err != nil {
		t.Fatalf("connect through the stdio bridge: %v", err)
	}
	defer cs.Close()

	g := newGatedCommand(t)
	args := map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0}
	x := mustCall(t, ctx, cs, "ssh_exec", args)
	// The retry's scope is the same agent process, read from the kernel: it joins.
	if again := mustCall(t, ctx, cs, "ssh_exec", args); again.ExecutionID != x.ExecutionID || !again.Replayed {
		t.Fatalf("retry through the bridge = %+v; want %s replayed", again, x.ExecutionID)
	}
	g.open(t)
	if end, out := followOutput(t, ctx, cs, x.ExecutionID); end.State != "completed" || out != "done\n" {
		t.Fatalf("ssh_exec through the bridge ended %+v, stdout %q; want completed with output", end, out)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}

	rec := operatorDetail(t, f.bastion, x.ExecutionID).Record
	if want := "local:" + u.Username; rec.Actor != want {
		t.Errorf("actor = %q; want %q", rec.Actor, want)
	}
	if want := fmt.Sprintf("run:%d-", os.Getpid()); !strings.HasPrefix(rec.IntentScope, want) {
		t.Errorf("intent scope = %q; want the agent process's run %s…", rec.IntentScope, want)
	}
	var listed bool
	for _, e := range listOf(t, ctx, cs) {
		listed = listed || e.ExecutionID == x.ExecutionID
	}
	if !listed {
		t.Errorf("executions_list through the bridge does not show %s", x.ExecutionID)
	}
	if msg := mustRefuse(t, ctx, f.session(t, "agent", ""), "execution_status", map[string]any{"execution_id": x.ExecutionID}); !strings.Contains(msg, "not_found") {
		t.Errorf("remote actor reading the local execution: %q; want not_found", msg)
	}
}
