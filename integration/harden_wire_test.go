package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// TestHostileCallsLeaveTheSharedConnection: while a long command runs on h1, calls with a
// hostile cwd (NUL, 64 KiB, relative, ..), env (NUL, a newline in a name) or a command too
// large for one SSH request are refused invalid_argument and journal nothing, and a call
// with the largest env the bastion accepts (which took more than one SSH packet as one
// request) runs. The pooled connection to h1 is never dropped, and the long command ends
// completed, once.
func TestHostileCallsLeaveTheSharedConnection(t *testing.T) {
	f := newFleet(t, fleetOptions{settings: []string{"max_command_bytes = 1048576"}})
	ctx := testContext(t)
	cs := f.session(t, "agent", "run-hostile")
	g := newGatedCommand(t)
	long := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0})
	waitForState(t, ctx, cs, long.ExecutionID, "running")

	hostile := []struct {
		name string
		args map[string]any
	}{
		{name: "NUL in cwd", args: map[string]any{"cwd": "/tmp/a\x00b"}},
		{name: "newline in cwd", args: map[string]any{"cwd": "/tmp/a\nb"}},
		{name: "64 KiB cwd", args: map[string]any{"cwd": "/" + strings.Repeat("a", 64<<10)}},
		{name: "relative cwd", args: map[string]any{"cwd": "tmp"}},
		{name: "cwd with ..", args: map[string]any{"cwd": "/tmp/../etc"}},
		{name: "NUL in an env value", args: map[string]any{"env": map[string]any{"LANG": "C\x00.UTF-8"}}},
		{name: "newline in an env name", args: map[string]any{"env": map[string]any{"LC_A\nB": "x"}}},
		{name: "NUL in an env name", args: map[string]any{"env": map[string]any{"LC_A\x00": "x"}}},
		{name: "command larger than one request", args: map[string]any{"command": "true # " + strings.Repeat("x", 300<<10)}},
	}
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			args := map[string]any{"host": "h1", "command": "echo hostile"}
			for k, v := range tc.args {
				args[k] = v
			}
			if msg := mustRefuse(t, ctx, f.session(t, "agent", "run-hostile-"+strconv.Itoa(len(tc.name))), "ssh_exec", args); !strings.Contains(msg, "invalid_argument") {
				t.Fatalf("refusal %q; want invalid_argument", msg)
			}
		})
	}

	t.Run("largest env", func(t *testing.T) {
		env := map[string]any{}
		for i := range 32 {
			env[fmt.Sprintf("LC_X%d", i)] = strings.Repeat("<", 4096) // 6 bytes each in JSON
		}
		x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo ${#LC_X0} ${#LC_X31}", "env": env})
		if x.State != "completed" || x.Stdout != "4096 4096\n" {
			t.Fatalf("call = %+v; want completed with both variables whole", x)
		}
	})

	g.open(t)
	x := waitForState(t, ctx, cs, long.ExecutionID, "completed", "unknown", "failed")
	if x.State != "completed" || x.ExitCode == nil || *x.ExitCode != 0 || x.Stdout != "done\n" || x.ReviewRequired {
		t.Fatalf("the long command = %+v; want completed, exit 0, its output whole", x)
	}
	if n := effects(t, g.file); n != 1 {
		t.Errorf("the long command ran %d times", n)
	}
	if logs := f.bastion.Logs(); strings.Contains(logs, "dropped connection") || strings.Contains(logs, "reconciled with host") {
		t.Errorf("the pooled connection broke:\n%s", logs)
	}
	if list := operatorExecutions(t, f); len(list) != 2 {
		t.Errorf("the journal holds %d executions; want 2 (the long one and the largest env)", len(list))
	}
}
