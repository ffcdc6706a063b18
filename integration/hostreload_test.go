package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/dirlock"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// localControl opens the hostagent's local control socket as an operator: it reads markers
// whatever keys the agent accepts.
func localControl(t *testing.T, h *harness.Hostagent) *hostproto.ControlClient {
	t.Helper()
	cc, err := hostproto.DialLocalControl(context.Background(), filepath.Join(h.DataDir, "control.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestRevokingTheBastionsKeyClosesItsConnection: the bastion's key is removed from a host's
// authorized_keys while a command it sent runs there. The hostagent closes the bastion's
// pooled connection; the command goes on and ends under its marker, once; the next call is
// refused because the host refuses the bastion's key (not "unreachable"); once the key is back,
// the bastion learns the first command's outcome from the marker.
func TestRevokingTheBastionsKeyClosesItsConnection(t *testing.T) {
	h := harness.StartHostagent(t, `key_check_interval = "200ms"`)
	b := harness.NewBastion(t, h.ClientKey)
	b.EnrollAt(t, "h1", h.Addr, h)
	b.Start(t)
	f := &testbed{bastion: b, host: h}
	f.logOnFailure(t)
	ctx := testContext(t)
	cc := localControl(t, h)
	g := newGatedCommand(t)
	cs := f.session(t, "agent", "run-revoke")

	first := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": g.cmd, "wait_s": 0})
	if marker := waitForRunningMarker(t, ctx, cc); marker.ID != first.ExecutionID {
		t.Fatalf("host runs %s; the bastion answered %s", marker.ID, first.ExecutionID)
	}

	testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath(), testutil.NewSSHKey(t).AuthorizedLine())
	testutil.WaitFor(t, "the hostagent to close the bastion's connection", func() bool {
		return strings.Contains(h.Logs(), "closing connection: its key is no longer authorized")
	})
	testutil.WaitFor(t, "the bastion to see its pooled connection dropped", func() bool {
		return strings.Contains(b.Logs(), "dropped connection")
	})
	// The next call is sent nothing, and says why.
	after, afterFile := appendCommand(t, "after")
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": after})
	if x.State != "failed" || !strings.Contains(x.Cause, "host_refuses_key") || !strings.Contains(x.Cause, "refuses the bastion's SSH key") ||
		strings.Contains(x.Cause, "cannot be reached") || x.DispatchedAt != nil {
		t.Fatalf("a call after the revocation = %+v; want it failed, never dispatched, because the host refuses the bastion's key", x)
	}
	if n := effects(t, afterFile); n != 0 {
		t.Fatalf("the call after the revocation ran %d times", n)
	}

	// The command was not killed: it ends under its marker, once.
	g.open(t)
	testutil.WaitFor(t, "the command to end on the host", func() bool {
		m := harness.Marker(t, ctx, cc, first.ExecutionID)
		return m != nil && m.State == hostproto.MarkerExited
	})
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}

	// With the key back, the bastion reconciles the execution from the host's marker.
	testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath(), h.ClientKey.AuthorizedLine())
	x, out := followOutput(t, ctx, cs, first.ExecutionID)
	if x.State != "completed" || out != "done\n" {
		t.Fatalf("after the key came back: %+v, stdout %q; want completed with its output", x, out)
	}
	if n := effects(t, g.file); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
}

// TestHostagentReload: `postern-hostagent reload` (found by the discovery rule, here
// --config) and SIGHUP apply a good config, and a bad one changes nothing, with the reason
// on stderr and exit status 1.
func TestHostagentReload(t *testing.T) {
	h := harness.StartHostagent(t)
	bin := harness.Binary(t, "postern-hostagent")
	reload := func() (string, error) {
		out, err := exec.Command(bin, "reload", "--config", h.ConfigPath).CombinedOutput()
		return string(out), err
	}
	base, err := os.ReadFile(h.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	write := func(extra string) {
		if err := os.WriteFile(h.ConfigPath, append(append([]byte{}, base...), extra+"\n"...), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	if out, err := reload(); err != nil || !strings.Contains(out, "nothing changed") {
		t.Fatalf("reload of the same config: %v\n%s", err, out)
	}
	write(`accept_env = ["APP_*"]`)
	if out, err := reload(); err != nil || !strings.Contains(out, "changed accept_env") {
		t.Fatalf("reload with accept_env: %v\n%s", err, out)
	}
	write(`accept_env = ["APP_*"]` + "\nmax_sessions = -1")
	out, err := reload()
	if code := exitCode(err); code != 1 || !strings.Contains(out, "max_sessions") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("reload of a bad config: exit %d\n%s\nwant 1, naming max_sessions", code, out)
	}
	write(`accept_env = ["APP_*"]` + "\nmax_sesions = 2")
	out, err = reload()
	if code := exitCode(err); code != 1 || !strings.Contains(out, "max_sesions: unknown key") || !strings.Contains(out, "nothing changed") {
		t.Fatalf("reload of a config with a misspelt key: exit %d\n%s\nwant 1, naming it", code, out)
	}
	moved := strings.Replace(string(base), h.Addr, "127.0.0.1:1", 1)
	if err := os.WriteFile(h.ConfigPath, []byte(moved), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = reload()
	if code := exitCode(err); code != 1 || !strings.Contains(out, "listen cannot change while the agent runs") {
		t.Fatalf("reload of a new listen address: exit %d\n%s\nwant 1, saying listen needs a restart", code, out)
	}

	// SIGHUP to the agent that holds the data dir.
	write(`accept_env = ["APP_*"]` + "\nmax_sessions = 7")
	pid, held, err := dirlock.LastHolder(h.DataDir)
	if err != nil || !held || pid <= 0 {
		t.Fatalf("the agent's pid: %d, held %v, %v", pid, held, err)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the agent to reload on SIGHUP", func() bool {
		return strings.Contains(h.Logs(), `msg="config reloaded"`) && strings.Contains(h.Logs(), "changed=[max_sessions]")
	})
	if out, err := reload(); err != nil || !strings.Contains(out, "nothing changed") {
		t.Fatalf("reload after SIGHUP applied the file: %v\n%s", err, out)
	}
	// Both changes are in the reload log, with who asked.
	logged, err := os.ReadFile(filepath.Join(h.DataDir, "reloads.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(logged)), "\n"); len(lines) != 2 ||
		!strings.Contains(lines[0], `"by":"control socket: uid `) || !strings.Contains(lines[1], `"by":"signal:SIGHUP"`) {
		t.Fatalf("reload log:\n%s\nwant the command's change, then SIGHUP's", logged)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
