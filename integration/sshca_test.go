package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/sshca"
	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// The bastion as its hosts' SSH certificate authority ([ssh_ca], docs/ssh-ca.md), on real
// processes: hostagents that trust only the CA (no authorized key), Debian's sshd with
// TrustedUserCAKeys, and a rotation across two replicas.

// caHostagent is a hostagent that authorizes no key and trusts the CA lines in its
// trusted_user_ca_keys_file (written by trustCA), checking its connections' keys often.
func caHostagent(t *testing.T) (h *harness.Hostagent, caFile string) {
	t.Helper()
	caFile = filepath.Join(t.TempDir(), "user_ca.pub")
	h = harness.NewHostagent(t, fmt.Sprintf("trusted_user_ca_keys_file = %q\nkey_check_interval = \"200ms\"", caFile))
	testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath()) // no key at all
	h.Start(t)
	return h, caFile
}

// trustCA writes what `postern ca keys` prints into the hosts' trusted CA files.
func trustCA(t *testing.T, b *harness.Bastion, files ...string) string {
	t.Helper()
	keys := postern(t, b, "ca", "keys")
	for _, f := range files {
		testutil.WriteFileAtomic(t, f, keys, 0o600)
	}
	return string(keys)
}

// certLogins are the hostagent's log lines of certificate logins with key id keyID signed
// by the CA whose fingerprint is ca.
func certLogins(h interface{ Logs() string }, keyID, ca string) int {
	n := 0
	for _, line := range strings.Split(h.Logs(), "\n") {
		if strings.Contains(line, "login with a user certificate") && strings.Contains(line, `key_id="`+keyID+`"`) && strings.Contains(line, "ca="+ca) {
			n++
		}
	}
	return n
}

// caFingerprints are the CA generations' fingerprints, by id.
func caFingerprints(t *testing.T, dir string) map[int]string {
	t.Helper()
	st, err := sshca.Open(dir).State()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, g := range st.Generations {
		out[g.ID] = g.Fingerprint
	}
	return out
}

// TestSSHCAHostagent: with [ssh_ca] enabled, ssh_exec reaches a hostagent that trusts the
// CA and authorizes no key, with a certificate naming the bastion; a hostagent that
// authorizes only the bastion's static key is refused — the static key is never offered.
func TestSSHCAHostagent(t *testing.T) {
	h1, caFile := caHostagent(t)
	h2 := harness.StartHostagent(t) // authorizes the bastion's static key, trusts no CA
	b := harness.NewBastion(t, h2.ClientKey, "[ssh_ca]\nenabled = true")
	// h1 as a host migrating from the static key: it still authorizes it, besides an
	// operator's key.
	ops := testutil.NewSSHKey(t)
	testutil.WriteAuthorizedKeys(t, h1.AuthorizedKeysPath(), b.ClientKey.AuthorizedLine(), ops.AuthorizedLine())
	if out := string(postern(t, b, "ca", "init")); !strings.Contains(out, "made the SSH CA") {
		t.Fatalf("ca init printed:\n%s", out)
	}
	trustCA(t, b, caFile)
	b.Enroll(t, "h1", h1)
	b.Enroll(t, "h2", h2)
	b.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s\nh1 log:\n%s\nh2 log:\n%s", b.Logs(), h1.Logs(), h2.Logs())
		}
	})
	ctx := testContext(t)
	cs := b.Connect(t, "agent", nil)

	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo via-certificate"})
	if x.State != "completed" || x.Stdout != "via-certificate\n" {
		t.Fatalf("ssh_exec on the CA-trusting host: %+v", x)
	}
	host, _ := os.Hostname()
	if n := certLogins(h1, "postern-bastion host="+host, caFingerprints(t, b.StateDir()+"/ssh_ca")[1]); n != 1 {
		t.Fatalf("h1 logged %d certificate logins of this bastion by CA generation 1; want 1", n)
	}

	// The documented removal of the static key (docs/ssh-ca.md), run as written.
	removeStaticKey(t, b, h1.AuthorizedKeysPath())
	if got := string(mustReadFile(t, h1.AuthorizedKeysPath())); got != ops.AuthorizedLine()+"\n" {
		t.Fatalf("authorized_keys after removing the static key:\n%s\nwant the operator's key only", got)
	}
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo still"}); x.State != "completed" {
		t.Fatalf("ssh_exec after the static key was removed: %+v", x)
	}

	cmd, file := appendCommand(t, "static")
	if x, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "h2", "command": cmd}); err != nil || x.State != "failed" || !strings.Contains(x.Cause, "host_refuses_key") || x.DispatchedAt != nil {
		t.Fatalf("ssh_exec on a host that authorizes only the static key: %+v, %v; want failed, refused, nothing sent", x, err)
	}
	if n := effects(t, file); n != 0 {
		t.Fatalf("the command ran %d times on the host that only knows the static key", n)
	}
}

// TestSSHCAStockSSHD: a stock OpenSSH sshd with TrustedUserCAKeys, whose account authorizes
// no key of the bastion, is enrolled (postern hosts enroll --agentless says it accepts the
// certificate; --marker-script installs over it) and runs ssh_exec as that account.
func TestSSHCAStockSSHD(t *testing.T) {
	acct := stockAccount(t, "postern-ca-s", false)
	caFile := filepath.Join(t.TempDir(), "trusted_user_ca")
	testutil.WriteAuthorizedKeys(t, caFile) // empty until the CA exists
	s := harness.StartSSHDWith(t, harness.SSHDOptions{Account: acct.Name, Home: acct.Home, UID: acct.UID, GID: acct.GID, TrustedUserCAKeys: caFile})
	b := harness.NewBastion(t, testutil.NewSSHKey(t), "[ssh_ca]\nenabled = true")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s\nsshd log:\n%s", b.Logs(), s.Logs())
		}
	})

	// Before the host trusts the CA, enrollment prints the lines it must trust — not a key.
	out := string(postern(t, b, "hosts", "enroll", "s1", s.Addr, "--agentless", "--account", acct.Name, "--yes"))
	keys := trustCA(t, b) // the CA exists: the enrollment made it (a single node)
	if !strings.Contains(out, "TrustedUserCAKeys") || !strings.Contains(out, strings.TrimSpace(keys)) {
		t.Fatalf("enroll before the host trusts the CA printed:\n%s\nwant the CA lines\n%s", out, keys)
	}
	trustCA(t, b, caFile)
	out = string(postern(t, b, "hosts", "enroll", "s1", s.Addr, "--agentless", "--account", acct.Name, "--yes"))
	if !strings.Contains(out, "accepts the bastion's ssh certificate") {
		t.Fatalf("enroll once the host trusts the CA printed:\n%s", out)
	}
	out = string(postern(t, b, "hosts", "enroll", "s2", s.Addr, "--agentless", "--marker-script", "--account", acct.Name, "--yes"))
	if !strings.Contains(out, "guarantee marker script") {
		t.Fatalf("enroll --marker-script over the certificate printed:\n%s", out)
	}
	b.Start(t)
	ctx := testContext(t)
	cs := b.Connect(t, "agent", nil)
	for _, host := range []string{"s1", "s2"} {
		x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": host, "command": "id -un"})
		if x.State != "completed" || strings.TrimSpace(x.Stdout) != acct.Name {
			t.Fatalf("ssh_exec on %s: %+v; want it run as %s", host, x, acct.Name)
		}
	}
	if _, err := os.Stat(filepath.Join(acct.Home, ".ssh", "authorized_keys")); err == nil {
		data, _ := os.ReadFile(filepath.Join(acct.Home, ".ssh", "authorized_keys"))
		if strings.Contains(string(data), strings.Fields(b.ClientKey.AuthorizedLine())[1]) {
			t.Fatal("the bastion's static key is in the account's authorized_keys")
		}
	}
}

// TestSSHCARotation: two replicas (on etcd) share one CA directory and two hosts trust it.
// Throughout a rotation — the next key made and published, the hosts trusting both, the
// next key signing, the old one retired and dropped by the hosts — ssh_exec works on both
// hosts through both replicas: connections made with the old CA's certificates keep
// working until the hosts drop it, new ones use the new CA's, and after the hosts drop the
// old CA the replicas reconnect with the new one.
func TestSSHCARotation(t *testing.T) {
	h1, ca1 := caHostagent(t)
	h2, ca2 := caHostagent(t)
	etcd := etcdtest.Start(t, 1)
	caDir := filepath.Join(t.TempDir(), "ssh_ca")
	journal := func(i int) string {
		return fmt.Sprintf("[journal]\nbackend = \"etcd\"\nendpoints = [%q]\nprefix = %q\nreplica = \"r%d\"\ntimeout = \"2s\"\nlease_ttl = \"2s\"\n",
			etcd.Endpoints()[0], "/"+t.Name()+"/", i)
	}
	sshCA := fmt.Sprintf("[ssh_ca]\nenabled = true\nkey_dir = %q\ncert_lifetime = \"10m\"\n", caDir)
	var replicas []*harness.Bastion
	for i := range 2 {
		b := harness.NewBastion(t, h1.ClientKey, sshCA, journal(i))
		if i == 0 {
			// Replicas do not make a CA on their own (each would make another): one is made.
			postern(t, b, "ca", "init")
			trustCA(t, b, ca1, ca2)
			b.Enroll(t, "h1", h1)
			b.Enroll(t, "h2", h2)
		} else {
			b.Tokens = replicas[0].Tokens
			shareState(t, replicas[0], b)
		}
		b.Start(t)
		replicas = append(replicas, b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, b := range replicas {
				t.Logf("replica %d log:\n%s", i, b.Logs())
			}
			t.Logf("h1 log:\n%s\nh2 log:\n%s", h1.Logs(), h2.Logs())
		}
	})
	ctx := testContext(t)
	sessions := []*mcp.ClientSession{replicas[0].Connect(t, "agent", nil), replicas[1].Connect(t, "agent", nil)}
	calls := 0
	// exec runs a new command on host through replica i, and must complete.
	exec := func(i int, host string) {
		t.Helper()
		calls++
		tag := fmt.Sprintf("call-%d", calls)
		x := mustCall(t, ctx, sessions[i], "ssh_exec", map[string]any{"host": host, "command": "echo " + tag})
		if x.State != "completed" || x.Stdout != tag+"\n" {
			t.Fatalf("%s through replica %d: %+v", host, i, x)
		}
	}
	keyID := func(i int) string { return fmt.Sprintf("postern-bastion replica=r%d", i) }

	fp := caFingerprints(t, caDir)
	for i := range replicas {
		exec(i, "h1")
		if n := certLogins(h1, keyID(i), fp[1]); n != 1 {
			t.Fatalf("h1 logged %d logins of replica %d by CA generation 1; want 1", n, i)
		}
	}

	// The next key, published: the hosts trust both; generation 1 still signs.
	if out := string(postern(t, replicas[0], "ca", "rotate", "--overlap", "1h")); !strings.Contains(out, "made CA generation 2") {
		t.Fatalf("ca rotate printed:\n%s", out)
	}
	if keys := trustCA(t, replicas[0], ca1, ca2); strings.Count(keys, "\n") != 2 {
		t.Fatalf("ca keys during the overlap:\n%s\nwant both generations", keys)
	}
	for i := range replicas {
		exec(i, "h1")
	}

	// Generation 2 signs: new connections (to h2, not yet dialed) use it; h1's go on.
	postern(t, replicas[0], "ca", "activate")
	fp = caFingerprints(t, caDir)
	for i := range replicas {
		exec(i, "h2")
		if n := certLogins(h2, keyID(i), fp[2]); n != 1 {
			t.Fatalf("h2 logged %d logins of replica %d by CA generation 2; want 1", n, i)
		}
		exec(i, "h1")
	}

	// Generation 1 retired: the hosts drop it, closing its connections; the replicas
	// reconnect with generation 2's certificates.
	if out := string(postern(t, replicas[0], "ca", "retire", "--force")); !strings.Contains(out, "retired CA generation 1") {
		t.Fatalf("ca retire printed:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(caDir, "ca-1")); !os.IsNotExist(err) {
		t.Fatalf("the retired CA key is still on disk: %v", err)
	}
	if keys := trustCA(t, replicas[0], ca1, ca2); strings.Count(keys, "\n") != 1 {
		t.Fatalf("ca keys after retiring:\n%s\nwant generation 2 only", keys)
	}
	testutil.WaitFor(t, "h1 to close the connections of the retired CA", func() bool {
		return strings.Count(h1.Logs(), "no longer") >= 2
	})
	for i := range replicas {
		testutil.WaitFor(t, fmt.Sprintf("replica %d to reconnect to h1 with generation 2", i), func() bool {
			calls++
			tag := fmt.Sprintf("call-%d", calls)
			x, err := callExecution(ctx, sessions[i], "ssh_exec", map[string]any{"host": "h1", "command": "echo " + tag})
			return err == nil && x.State == "completed" && certLogins(h1, keyID(i), fp[2]) == 1
		})
	}
	events, err := sshca.Open(caDir).Events()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Event)
	}
	if got := strings.Join(kinds, " "); got != "created rotated activated retired" {
		t.Fatalf("CA events %q", got)
	}
}

// removeStaticKey runs the lines of docs/ssh-ca.md, "Removing the static key from hosts", on
// file: the page's shell block that removes the key, with its FILE set to file, in a
// directory holding the bastion_ed25519.pub that `postern hosts key` printed.
func removeStaticKey(t *testing.T, b *harness.Bastion, file string) {
	t.Helper()
	page := string(mustReadFile(t, filepath.Join("..", "docs", "ssh-ca.md")))
	var block string
	for _, part := range strings.Split(page, "```sh\n")[1:] {
		body, _, _ := strings.Cut(part, "```")
		if strings.Contains(body, `grep -vF "$KEY"`) {
			block = body
		}
	}
	const docFile = "FILE=/etc/postern-hostagent/authorized_keys"
	if block == "" || !strings.Contains(block, docFile) {
		t.Fatalf("docs/ssh-ca.md shows no block removing the static key from %s", docFile)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bastion_ed25519.pub"), postern(t, b, "hosts", "key"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-e", "-c", strings.Replace(block, docFile, "FILE="+file, 1))
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the documented removal failed: %v\n%s\n%s", err, block, out)
	}
	if info, err := os.Stat(file); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("%s after the removal: %v %v; want mode 0600", file, info, err)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// certSerials are the serials of the certificate logins a hostagent logged.
func certSerials(t *testing.T, logs string) []uint64 {
	t.Helper()
	var out []uint64
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "login with a user certificate") {
			continue
		}
		_, rest, _ := strings.Cut(line, " serial=")
		field, _, _ := strings.Cut(rest, " ")
		n, err := strconv.ParseUint(field, 10, 64)
		if err != nil {
			t.Fatalf("no serial in %q", line)
		}
		out = append(out, n)
	}
	return out
}

// TestSSHCARenewal: with the shortest lifetime (1m), the bastion signs itself a new
// certificate before the first expires (at two thirds of it: its log says so, no timing is
// asserted); a new connection logs in with the new one (a higher serial), while the
// connection made with the first goes on.
func TestSSHCARenewal(t *testing.T) {
	h1, ca1 := caHostagent(t)
	h2, ca2 := caHostagent(t)
	b := harness.NewBastion(t, testutil.NewSSHKey(t), "[ssh_ca]\nenabled = true\ncert_lifetime = \"1m\"")
	postern(t, b, "ca", "init")
	trustCA(t, b, ca1, ca2)
	b.Enroll(t, "h1", h1)
	b.Enroll(t, "h2", h2)
	b.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s\nh1 log:\n%s\nh2 log:\n%s", b.Logs(), h1.Logs(), h2.Logs())
		}
	})
	ctx := testContext(t)
	cs := b.Connect(t, "agent", nil)
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo first"}); x.State != "completed" {
		t.Fatalf("first call: %+v", x)
	}
	first := certSerials(t, h1.Logs())
	if len(first) != 1 {
		t.Fatalf("h1 logged certificate logins with serials %v; want one", first)
	}
	testutil.WaitFor(t, "the bastion to renew its certificate", func() bool {
		return strings.Count(b.Logs(), "signed the bastion's ssh certificate") >= 2
	})
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h2", "command": "echo renewed"}); x.State != "completed" {
		t.Fatalf("call on a new connection: %+v", x)
	}
	if second := certSerials(t, h2.Logs()); len(second) != 1 || second[0] <= first[0] {
		t.Fatalf("h2's login used serial %v; want one above the first certificate's %d", second, first[0])
	}
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo pooled"}); x.State != "completed" {
		t.Fatalf("call on the connection made with the first certificate: %+v", x)
	}
	if again := certSerials(t, h1.Logs()); len(again) != 1 {
		t.Fatalf("h1 logged logins %v; want the first connection kept", again)
	}
}
