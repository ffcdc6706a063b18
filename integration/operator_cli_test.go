package integration

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestExecutionsFollow: `postern executions follow ID` streams a running command's output
// and returns once it ended, saying how.
func TestExecutionsFollow(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	g := newGatedCommand(t)
	x := mustCall(t, ctx, f.session(t, "agent", "follow"), "ssh_exec", map[string]any{
		"host": "h1", "command": "echo started; " + g.cmd + "; echo oops >&2", "wait_s": 0})
	waitForJournalState(t, f.bastion, x.ExecutionID, markers.Running)

	cmd := exec.CommandContext(ctx, testutil.Binary(t, "postern"), "executions", "follow", x.ExecutionID, "--config", f.bastion.ConfigPath)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.open(t)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("follow: %v\nstderr:\n%s", err, stderr.String())
	}
	if got := stdout.String(); got != "started\ndone\n" {
		t.Errorf("follow stdout = %q; want the command's whole stdout", got)
	}
	if got := stderr.String(); !strings.Contains(got, "oops\n") || !strings.Contains(got, x.ExecutionID+" completed, exit 0") {
		t.Errorf("follow stderr = %q; want the command's stderr and how it ended", got)
	}
}
