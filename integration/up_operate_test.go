package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TestUpSecondHostAndPolicyCheck: a second host enrolled into `postern up`'s state dir (its
// hostagent authorizing the key in bastion_ed25519.pub) is listed by the banner of the next
// up, and `postern policy check` authorizes up's own actor — asking the running daemon, and
// from the state dir when it is down.
func TestUpSecondHostAndPolicyCheck(t *testing.T) {
	bin := harness.Binary(t, "postern")
	dir := filepath.Join(sockdir.New(t), "state")
	listen, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)
	up := func() (*exec.Cmd, string) {
		cmd := exec.Command(bin, "up", "--state-dir", dir, "--listen", listen, "--hostagent-listen", agentListen)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
		return cmd, readUntil(t, stdout, "Operator:")
	}
	stop := func(cmd *exec.Cmd) {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("up exited with %v", err)
		}
	}
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("postern %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	decide := func() policy.Decision {
		t.Helper()
		var dec policy.Decision
		out := run("policy", "check", "--state-dir", dir, "--actor", "local-agent", "--host", "local", "--json", "--", "uname", "-a")
		if err := json.Unmarshal(out[strings.IndexByte(string(out), '{'):], &dec); err != nil {
			t.Fatalf("policy check printed %s: %v", out, err)
		}
		return dec
	}

	cmd, _ := up()
	if dec := decide(); dec.Outcome != policy.Authorized {
		t.Errorf("policy check of up's actor against the running up = %+v; want authorized", dec)
	}

	h := harness.NewHostagent(t)
	pub, err := os.ReadFile(filepath.Join(dir, "bastion_ed25519.pub"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath(), string(pub))
	h.Start(t)
	run("hosts", "enroll", "second", h.Addr, "--state-dir", dir, "--account", h.Account, "--yes")
	stop(cmd)

	if dec := decide(); dec.Outcome != policy.Authorized {
		t.Errorf("policy check of up's actor with up down = %+v; want authorized", dec)
	}
	cmd, banner := up()
	if !strings.Contains(banner, `Hosts: "local" (this machine, as `) || !strings.Contains(banner, `"second" (`+h.Account+"@"+h.Addr+")") {
		t.Errorf("restart banner:\n%s\nwant both enrolled hosts", banner)
	}
	stop(cmd)
}
