package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/internal/testutil"
)

// fleet is a bastion with one enrolled hostagent ("h1").
type fleet struct {
	bastion *testutil.Bastion
	host    *testutil.Hostagent
}

func startFleet(t *testing.T, bastionConfig ...string) *fleet {
	t.Helper()
	h := testutil.StartHostagent(t)
	b := testutil.NewBastion(t, h.ClientKey, bastionConfig...)
	b.Enroll(t, "h1", h)
	b.Start(t)
	return &fleet{bastion: b, host: h}
}

// appendCommand appends a line to a file in dir: its line count is the number of times the
// command ran.
func appendCommand(t *testing.T, tag string) (cmd, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "effects")
	return "echo " + tag + " >> " + file + "; echo done", file
}

func effects(t *testing.T, file string) int {
	t.Helper()
	data, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

func TestIdenticalCallsAreOneExecution(t *testing.T) {
	f := startFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, file := appendCommand(t, "once")
	cs := f.bastion.Connect(t, "agent", map[string][]string{"Postern-Run": {"run-1"}})

	var first, second bastion.Execution
	if _, err := testutil.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd, "wait_s": 0}, &first); err != nil {
		t.Fatal(err)
	}
	if _, err := testutil.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": cmd}, &second); err != nil {
		t.Fatal(err)
	}
	if second.ExecutionID != first.ExecutionID || !second.Replayed {
		t.Fatalf("second call: %+v; want the first execution %s replayed", second, first.ExecutionID)
	}
	if second.State != "completed" || second.Stdout != "done\n" {
		t.Fatalf("second call: %+v; want completed with output", second)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("command ran %d times; want 1\n%s", n, f.bastion.Logs())
	}
}
