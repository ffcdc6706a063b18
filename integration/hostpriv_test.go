package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// writeHostagentConfig replaces h's config: its address and data dir, kill_grace 1s, and
// lines.
func writeHostagentConfig(t *testing.T, h *harness.Hostagent, lines ...string) {
	t.Helper()
	cfg := fmt.Sprintf("listen = %q\ndata_dir = %q\nkill_grace = \"1s\"\n%s\n", h.Addr, h.DataDir, strings.Join(lines, "\n"))
	if err := os.WriteFile(h.ConfigPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

func modeOf(t *testing.T, path string) fs.FileMode {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode().Perm()
}

// TestHostagentMakesPremadeDataDirPrivate is finding 3: a data dir made beforehand with
// mkdir (umask 022) kept 0755 and the markers in it were readable by every local user.
func TestHostagentMakesPremadeDataDirPrivate(t *testing.T) {
	h := harness.NewHostagent(t)
	if err := os.Mkdir(h.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(h.DataDir, 0o755)
	notes := filepath.Join(h.DataDir, "notes")
	if err := os.WriteFile(notes, []byte("left by an operator"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(notes, 0o644)
	h.Start(t)
	if got := modeOf(t, h.DataDir); got != 0o700 {
		t.Errorf("data dir mode %v; want 0700", got)
	}
	if got := modeOf(t, notes); got != 0o600 {
		t.Errorf("file in the data dir has mode %v; want 0600", got)
	}
	logs := h.Logs()
	if n := strings.Count(logs, "tightened permissions"); n != 2 {
		t.Errorf("%d fixes logged; want 2 (the dir and the file):\n%s", n, logs)
	}

	// At the next start, what Pebble created meanwhile (0644 files) is tightened too.
	h.Kill(t)
	h.Start(t)
	filepath.WalkDir(filepath.Join(h.DataDir, "markers"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && modeOf(t, p)&0o077 != 0 {
			t.Errorf("%s: mode %v after a restart; want no group/other bits", p, modeOf(t, p))
		}
		return nil
	})
}

// TestHostagentRefusesForeignDataDir: a data dir that belongs to another user is refused
// with what to do, and nothing is written into it.
func TestHostagentRefusesForeignDataDir(t *testing.T) {
	const other = "hostprivowner"
	unixuser.NewLogin(t, other)
	u, err := user.Lookup(other)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	h := harness.NewHostagent(t)
	if err := os.Mkdir(h.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(h.DataDir, uid, uid); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(harness.Binary(t, "postern-hostagent"), "serve", "--config", h.ConfigPath).CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || !strings.Contains(string(out), "owned by another user") ||
		!strings.Contains(string(out), other) || !strings.Contains(string(out), "chown -R") {
		t.Fatalf("serve on a data dir owned by %s: %v\n%s\nwant a refusal naming the owner and the fix", other, err, out)
	}
	if entries, _ := os.ReadDir(h.DataDir); len(entries) != 0 {
		t.Errorf("the refused data dir got %d entries", len(entries))
	}
}

// TestCommandsDoNotInheritDescriptors is finding 5: a descriptor the hostagent inherited (a
// root-only file a shell left open) reached every command, unprivileged ones included.
func TestCommandsDoNotInheritDescriptors(t *testing.T) {
	const account = "hostprivfd"
	unixuser.NewLogin(t, account)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := harness.NewHostagent(t)
	writeHostagentConfig(t, h, fmt.Sprintf("authorized_keys_file = %q\nallowed_accounts = [%q]", filepath.Join(h.Dir, "authorized_keys"), account))
	h.Account = account
	// Open without close-on-exec, as a shell's redirection would: the agent inherits it.
	leaked, err := syscall.Open(secret, syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.Start(t)
	syscall.Close(leaked)
	if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", h.PID(), leaked)); err != nil || target != secret {
		t.Fatalf("the hostagent does not hold the leaked fd %d (%q, %v): the test proves nothing", leaked, target, err)
	}

	got := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: newID(t),
		Command: "id -un; ls /proc/self/fd; cat <&" + strconv.Itoa(leaked)})
	if got.err != nil {
		t.Fatal(got.err)
	}
	fields := strings.Fields(got.stdout)
	if len(fields) == 0 || fields[0] != account {
		t.Fatalf("stdout %q, stderr %q; want the command to run as %s", got.stdout, got.stderr, account)
	}
	// ls sees stdin, stdout, stderr and the descriptor it opened to list them.
	if fds := strings.Join(fields[1:], " "); fds != "0 1 2 3" {
		t.Errorf("the command has descriptors %q; want 0 1 2 3 (fd %d must not be inherited)", fds, leaked)
	}
	if strings.Contains(got.stdout, "root only") || got.res.ExitStatus == 0 {
		t.Errorf("the command read the root-only file through fd %d (exit %d)", leaked, got.res.ExitStatus)
	}
}

// TestAuthorizedKeysPerAccount drives the hostagent with the stock ssh(1) client: a key in
// authorized_keys_dir/<account> logs in as that account only; a key in the global file logs
// in as every allowed account.
func TestAuthorizedKeysPerAccount(t *testing.T) {
	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		t.Skip("ssh client not installed")
	}
	const alice, bob = "hostpriva", "hostprivb"
	unixuser.NewLogin(t, alice)
	unixuser.NewLogin(t, bob)
	h := harness.NewHostagent(t)
	keysDir := filepath.Join(h.Dir, "keys")
	if err := os.Mkdir(keysDir, 0o755); err != nil {
		t.Fatal(err)
	}
	aliceKey, bobKey := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	testutil.WriteAuthorizedKeys(t, filepath.Join(keysDir, alice), aliceKey.AuthorizedLine())
	testutil.WriteAuthorizedKeys(t, filepath.Join(keysDir, bob), bobKey.AuthorizedLine())
	writeHostagentConfig(t, h,
		fmt.Sprintf("authorized_keys_file = %q", filepath.Join(h.Dir, "authorized_keys")),
		fmt.Sprintf("authorized_keys_dir = %q", keysDir),
		fmt.Sprintf("allowed_accounts = [%q, %q]", alice, bob))
	h.Start(t)

	dir := t.TempDir()
	knownHosts := testutil.WriteKnownHosts(t, filepath.Join(dir, "known_hosts"), h.Addr, h.HostKey)
	identities := map[string]string{
		"alice's": aliceKey.WritePrivateKey(t, filepath.Join(dir, "alice")),
		"bob's":   bobKey.WritePrivateKey(t, filepath.Join(dir, "bob")),
		"global":  h.ClientKey.WritePrivateKey(t, filepath.Join(dir, "global")),
	}
	_, port, _ := net.SplitHostPort(h.Addr)
	tests := []struct {
		key, account string
		wantIn       bool
	}{
		{"alice's", alice, true},
		{"alice's", bob, false},
		{"bob's", bob, true},
		{"bob's", alice, false},
		{"global", alice, true},
		{"global", bob, true},
	}
	for _, tt := range tests {
		t.Run(tt.key+" key as "+tt.account, func(t *testing.T) {
			args := append(testutil.OpenSSHArgs(knownHosts, identities[tt.key], port),
				"-o", "SetEnv=POSTERN_EXECUTION_ID="+newID(t), tt.account+"@127.0.0.1", "id -un")
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(sshBin, args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			switch {
			case tt.wantIn && (err != nil || strings.TrimSpace(stdout.String()) != tt.account):
				t.Errorf("ssh: %v, stdout %q, stderr %q; want to run as %s", err, stdout.String(), stderr.String(), tt.account)
			case !tt.wantIn && (err == nil || !strings.Contains(stderr.String(), "Permission denied")):
				t.Errorf("ssh: %v, stdout %q, stderr %q; want Permission denied", err, stdout.String(), stderr.String())
			}
		})
	}

	// A per-account file others can write lets nobody in through it.
	os.Chmod(filepath.Join(keysDir, alice), 0o666)
	args := append(testutil.OpenSSHArgs(knownHosts, identities["alice's"], port),
		"-o", "SetEnv=POSTERN_EXECUTION_ID="+newID(t), alice+"@127.0.0.1", "id -un")
	if out, err := exec.Command(sshBin, args...).CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("login through a world-writable key file: %v %q; want Permission denied", err, out)
	}
}
