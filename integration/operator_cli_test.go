package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil/harness"
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

	cmd := exec.CommandContext(ctx, harness.Binary(t, "postern"), "executions", "follow", x.ExecutionID, "--config", f.bastion.ConfigPath)
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

// TestInstallThenEnroll: the enroll command `postern-hostagent install` prints works as
// printed against the bastion, after the key `postern hosts key` prints is authorized; a
// host that presents another key than the expected one is not enrolled.
func TestInstallThenEnroll(t *testing.T) {
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey)
	b.Start(t)
	ctx := testContext(t)

	// Step 1: the bastion's public key, printed and kept in the state dir.
	key := string(postern(t, b, "hosts", "key"))
	if want := string(h.ClientKey.AuthorizedLine()); strings.TrimSpace(key) != strings.TrimSpace(want) {
		t.Fatalf("hosts key = %q; want the bastion's client key %q", key, want)
	}
	if pub, err := os.ReadFile(filepath.Join(b.StateDir(), "bastion_ed25519.pub")); err != nil || string(pub) != key {
		t.Fatalf("state dir's bastion_ed25519.pub = %q, %v; want %q", pub, err, key)
	}

	// Step 3: install (against the running hostagent's config) prints the enroll command.
	install := exec.Command(harness.Binary(t, "postern-hostagent"), "install", "--config", h.ConfigPath,
		"--unit", filepath.Join(t.TempDir(), "postern-hostagent.service"), "--binary", "/usr/local/bin/postern-hostagent")
	out, err := install.CombinedOutput()
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	var enroll []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "postern" && f[1] == "hosts" && f[2] == "enroll" {
			enroll = f
		}
	}
	if enroll == nil {
		t.Fatalf("install printed no enroll command:\n%s", out)
	}
	name := enroll[3]

	wrong := append(append([]string(nil), enroll[1:]...), "--expect-host-key", "SHA256:"+strings.Repeat("A", 43))
	cmd := exec.Command(harness.Binary(t, "postern"), append(wrong, "--config", b.ConfigPath)...)
	if msg, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(msg), "not the expected") {
		t.Errorf("enroll with another expected key: %v\n%s\nwant a refusal", err, msg)
	}

	if got := string(postern(t, b, enroll[1:]...)); !strings.Contains(got, "the key matches the expected") {
		t.Errorf("enroll as printed:\n%s", got)
	}
	x := mustCall(t, ctx, b.Connect(t, "agent", nil), "ssh_exec", map[string]any{"host": name, "command": "echo enrolled"})
	if x.State != "completed" || x.Stdout != "enrolled\n" {
		t.Errorf("ssh_exec on the enrolled host = %+v", x)
	}
}

// TestDoctor: with everything up, doctor finds no problem and has asked the host; with the
// hostagent down, it names the host and the fix, and exits 1.
func TestDoctor(t *testing.T) {
	f := startFleet(t)
	out := string(postern(t, f.bastion, "doctor"))
	for _, want := range []string{"ok      daemon", "ok      port", "h1 (" + f.host.Addr + "): reachable, pinned host key verified, hostagent "} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor:\n%s\nwant %q", out, want)
		}
	}

	f.host.Kill(t)
	cmd := exec.Command(harness.Binary(t, "postern"), "doctor", "--config", f.bastion.ConfigPath)
	got, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("doctor with the host down: %v\n%s\nwant exit status 1", err, got)
	}
	if !strings.Contains(string(got), "problem host") || !strings.Contains(string(got), "fix: is postern-hostagent running on h1") {
		t.Errorf("doctor with the host down:\n%s\nwant the host's problem and its fix", got)
	}
}
