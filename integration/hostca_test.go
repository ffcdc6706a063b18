package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// certHostagent is a hostagent whose host key ca certified with ssh-keygen -s (as
// docs/inventory.md shows) for principals, and which presents that certificate; it admits
// bastionKey.
func certHostagent(t *testing.T, caFile string, bastionKey testutil.SSHKey, serial int, principals string) *harness.Hostagent {
	t.Helper()
	dir := t.TempDir()
	hostKey := testutil.NewSSHKey(t)
	keyFile := hostKey.WritePrivateKey(t, filepath.Join(dir, "host_ed25519_key"))
	if err := os.WriteFile(keyFile+".pub", []byte(hostKey.AuthorizedLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sign := exec.Command("ssh-keygen", "-q", "-s", caFile, "-h", "-I", "test-host", "-n", principals, "-z", fmt.Sprint(serial), "-V", "-5m:+1h", keyFile+".pub")
	if out, err := sign.CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -s: %v\n%s", err, out)
	}
	h := harness.NewHostagent(t, fmt.Sprintf("host_certificate_file = %q", keyFile+"-cert.pub"))
	if err := os.MkdirAll(h.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	hostKey.WritePrivateKey(t, filepath.Join(h.DataDir, "host_ed25519_key"))
	testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath(), bastionKey.AuthorizedLine())
	h.Start(t)
	return h
}

// TestHostCertificates: hosts enrolled by `postern hosts import` with @cert-authority run
// commands when they present a certificate of the trusted CA for their name; a certificate
// for another name, or one revoked (by serial, in the revocation list, while its connection
// is pooled) is refused with an error saying what to fix, and nothing runs there. A host
// with a pinned key is still checked against it.
func TestHostCertificates(t *testing.T) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("needs ssh-keygen")
	}
	dir := t.TempDir()
	ca := testutil.NewSSHKey(t)
	caFile := ca.WritePrivateKey(t, filepath.Join(dir, "host_ca"))
	bastionKey := testutil.NewSSHKey(t)
	good := certHostagent(t, caFile, bastionKey, 1, "db-1")
	wrong := certHostagent(t, caFile, bastionKey, 2, "db-9,elsewhere")
	pinned := certHostagent(t, caFile, bastionKey, 3, "web-1")

	revoked := filepath.Join(dir, "revoked_host_keys")
	if err := os.WriteFile(revoked, []byte("# revoked host keys and certificates\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := harness.NewBastion(t, bastionKey, fmt.Sprintf("revoked_host_keys_file = %q", revoked),
		fmt.Sprintf("[[host_cas]]\nname = \"test-ca\"\npublic_key = %q\nhosts = [\"db-*\"]", ca.AuthorizedLine()))
	pinnedKey := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pinned.HostKey)))
	importFile := filepath.Join(dir, "fleet.csv")
	csv := "name,addr,account,labels,host_key\n" +
		fmt.Sprintf("db-1,%s,%s,role=db,@cert-authority\n", good.Addr, good.Account) +
		fmt.Sprintf("db-2,%s,%s,role=db,@cert-authority\n", wrong.Addr, wrong.Account) +
		fmt.Sprintf("web-1,%s,%s,role=web,%s\n", pinned.Addr, pinned.Account, pinnedKey)
	if err := os.WriteFile(importFile, []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := postern(t, b, "hosts", "import", importFile); !strings.Contains(string(out), "imported 3 hosts") {
		t.Fatalf("hosts import printed %s", out)
	}
	b.Start(t)
	ctx := testContext(t)
	cs := b.Connect(t, "agent", nil)

	cmd, file := appendCommand(t, "ran")
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "db-1", "command": cmd, "wait_s": 30}); x.State != "completed" {
		t.Fatalf("db-1 (a certificate for db-1) = %+v; want completed", x)
	}
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "web-1", "command": "true", "wait_s": 30}); x.State != "completed" {
		t.Fatalf("web-1 (pinned key) = %+v; want completed", x)
	}
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "db-2", "command": cmd, "wait_s": 30}); x.State != "failed" || !strings.HasPrefix(x.Cause, "host_cert_refused: ") || x.DispatchedAt != nil {
		t.Fatalf("db-2 (a certificate for db-9) = %+v; want failed, host_cert_refused, never dispatched", x)
	}
	if list := string(postern(t, b, "hosts", "list")); !strings.Contains(list, "@cert-authority") {
		t.Errorf("hosts list does not show the CA-trusted hosts:\n%s", list)
	}
	// Enrolling scans the plain key, the one to pin, from a host that also has a certificate.
	if out := string(postern(t, b, "hosts", "enroll", "web-1", pinned.Addr, "--account", pinned.Account, "--expect-host-key", gossh.FingerprintSHA256(pinned.HostKey))); !strings.Contains(out, "the key is the one already enrolled for web-1") {
		t.Errorf("hosts enroll of a host with a certificate printed:\n%s", out)
	}
	if !strings.Contains(b.Logs(), `is for \"db-9,elsewhere\", not for db-2 or 127.0.0.1: re-sign it with ssh-keygen -s CA -h -n db-2`) {
		t.Errorf("the bastion's log does not say what to fix:\n%s", b.Logs())
	}

	// Revoke db-1's certificate while its connection is pooled: the next call is refused.
	if err := os.WriteFile(revoked, []byte("serial 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "db-1", "command": cmd + " # again", "wait_s": 30}); x.State != "failed" || !strings.HasPrefix(x.Cause, "host_cert_refused: ") {
		t.Fatalf("db-1 after its serial was revoked = %+v; want failed, host_cert_refused", x)
	}
	if n := effects(t, file); n != 1 {
		t.Fatalf("the command ran %d times; want once (on db-1, before the revocation)", n)
	}
}
