package integration

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// TestExecEnvTheHostWouldDrop: the bastion refuses, before anything is journaled or run, an
// env name its host would drop — forbidden everywhere (LD_PRELOAD), or not in the host's
// accept_env as the inventory records it — and says what is allowed; an accepted one reaches
// the command.
func TestExecEnvTheHostWouldDrop(t *testing.T) {
	h := harness.StartHostagent(t, `accept_env = ["APP_*"]`)
	b := harness.NewBastion(t, h.ClientKey)
	inventory := config.DefaultConfig(b.StateDir()).InventoryPath()
	for name, accept := range map[string][]string{"h1": {"APP_*"}, "h2": nil} {
		if err := fleet.Enroll(inventory, fleet.Host{Name: name, Addr: h.Addr, Account: h.Account, HostKey: h.HostKey, AcceptEnv: accept}); err != nil {
			t.Fatal(err)
		}
	}
	b.Start(t)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	ctx := testContext(t)
	cs := f.session(t, "agent", "run-env")
	cmd, file := appendCommand(t, "env")

	for _, tc := range []struct {
		name, host string
		env        map[string]any
		want       []string // in the refusal
	}{
		{name: "forbidden everywhere", host: "h1", env: map[string]any{"LD_PRELOAD": "/tmp/x.so"}, want: []string{"LD_PRELOAD", "no host accepts it"}},
		{name: "shell startup file", host: "h1", env: map[string]any{"BASH_ENV": "/tmp/x"}, want: []string{"BASH_ENV", "no host accepts it"}},
		{name: "not in accept_env", host: "h1", env: map[string]any{"FOO": "1", "BAR": "2", "APP_OK": "3"}, want: []string{"env BAR, FOO: host h1 would drop it", "LANG, LC_* and its accept_env APP_*"}},
		{name: "host without accept_env", host: "h2", env: map[string]any{"APP_MODE": "prod"}, want: []string{"APP_MODE", "its accept_env is empty", "inventory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": tc.host, "command": cmd, "env": tc.env})
			if !isToolError(err) {
				t.Fatalf("ssh_exec = %+v, %v; want a refusal", x, err)
			}
			for _, w := range append(tc.want, "invalid_argument") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q; want it to say %q", err, w)
				}
			}
		})
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the command ran %d times; want none", n)
	}
	if n := metric(t, b, "postern_executions_accepted_total"); n != 0 {
		t.Fatalf("%v executions accepted; want none journaled", n)
	}

	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": `echo "mode=$APP_MODE lang=$LANG"`, "env": map[string]any{"APP_MODE": "prod", "LANG": "C"}, "wait_s": 60})
	if x.State != "completed" || strings.TrimSpace(x.Stdout) != "mode=prod lang=C" {
		t.Fatalf("ssh_exec = %+v; want the accepted variables in the command's environment", x)
	}
}
