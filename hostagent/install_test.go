package hostagent_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/testutil"
)

func TestLoadOrCreateHostKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "host_ed25519_key")
	first, err := hostagent.LoadOrCreateHostKey(path)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v; want 0600", err, info.Mode())
	}
	pemBytes, _ := os.ReadFile(path)
	if !bytes.HasPrefix(pemBytes, []byte("-----BEGIN OPENSSH PRIVATE KEY-----")) {
		t.Errorf("key file is not in OpenSSH format:\n%s", pemBytes)
	}
	second, err := hostagent.LoadOrCreateHostKey(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if a, b := hostagent.HostKeyFingerprint(first), hostagent.HostKeyFingerprint(second); a != b || !strings.HasPrefix(a, "SHA256:") {
		t.Errorf("fingerprints %q, %q; want equal SHA256:…", a, b)
	}
	if first.PublicKey().Type() != "ssh-ed25519" {
		t.Errorf("key type %s; want ssh-ed25519", first.PublicKey().Type())
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := hostagent.LoadOrCreateHostKey(path); err == nil {
		t.Error("world-readable host key accepted")
	}
}

func TestInstall(t *testing.T) {
	root := t.TempDir()
	var out bytes.Buffer
	opts := hostagent.InstallOptions{Root: root, Listen: "0.0.0.0:2222", ReadWritePaths: []string{"/srv/app"}}
	if err := hostagent.Install(opts, &out); err != nil {
		t.Fatalf("Install: %v", err)
	}
	under := func(p string) string { return filepath.Join(root, p) }

	cfg, err := hostagent.LoadConfig(under(hostagent.DefaultConfigPath))
	if err != nil {
		t.Fatalf("installed config: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("installed config does not validate: %v", err)
	}
	if cfg.Listen != "0.0.0.0:2222" || cfg.AuthorizedKeysFile != hostagent.DefaultAuthorizedKeysPath || cfg.ControlSocketPath() != hostagent.DefaultControlSocketPath {
		t.Errorf("installed config %+v", cfg)
	}
	if info, err := os.Stat(under(cfg.DataDir)); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v %v; want mode 0700", err, info)
	}
	key, err := hostagent.LoadOrCreateHostKey(under(cfg.HostKeyPath()))
	if err != nil {
		t.Fatal(err)
	}
	if fp := hostagent.HostKeyFingerprint(key); !strings.Contains(out.String(), "host key fingerprint: "+fp) {
		t.Errorf("output lacks the fingerprint %s:\n%s", fp, out.String())
	}
	if !strings.Contains(out.String(), "postern hosts enroll") {
		t.Errorf("output lacks the enroll hint:\n%s", out.String())
	}
	unit, err := os.ReadFile(under(hostagent.DefaultUnitPath))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ExecStart=" + hostagent.DefaultBinaryPath + " serve --config " + hostagent.DefaultConfigPath,
		"NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=" + cfg.DataDir + " /tmp /var/tmp /srv/app",
		"Restart=always", "KillMode=process",
		"RuntimeDirectory=postern-hostagent", "RuntimeDirectoryMode=0755",
	} {
		if !strings.Contains(string(unit), want+"\n") {
			t.Errorf("unit lacks %q:\n%s", want, unit)
		}
	}
	// A private /tmp would be torn down under the commands that outlive an agent restart.
	if strings.Contains(string(unit), "PrivateTmp=yes") {
		t.Errorf("unit sets PrivateTmp:\n%s", unit)
	}

	// A second install keeps the config (and its edits) and the host key.
	edited := strings.Replace(mustRead(t, under(hostagent.DefaultConfigPath)), `missing_execution_id = "refuse"`, `missing_execution_id = "assign"`, 1)
	if err := os.WriteFile(under(hostagent.DefaultConfigPath), []byte(edited), 0o640); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := hostagent.Install(opts, &out); err != nil {
		t.Fatalf("second Install: %v", err)
	}
	if !strings.Contains(mustRead(t, under(hostagent.DefaultConfigPath)), `"assign"`) || !strings.Contains(out.String(), "kept existing config") {
		t.Errorf("second install replaced the config:\n%s", out.String())
	}
	again, err := hostagent.LoadOrCreateHostKey(under(cfg.HostKeyPath()))
	if err != nil || hostagent.HostKeyFingerprint(again) != hostagent.HostKeyFingerprint(key) {
		t.Errorf("host key changed across installs (%v)", err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEnrollCommand(t *testing.T) {
	hostname, _ := os.Hostname()
	tests := []struct {
		name, listen string
		accounts     []string
		want         string // %[1]s is the machine's name
	}{
		{"every address: the machine's name", "0.0.0.0:7422", []string{"deploy"}, "postern hosts enroll %[1]s %[1]s:7422 --account deploy --expect-host-key SHA256:x"},
		{"no host part", ":7422", nil, "postern hosts enroll %[1]s %[1]s:7422 --expect-host-key SHA256:x"},
		{"one address", "10.0.0.5:2222", []string{"ops", "deploy"}, "postern hosts enroll %[1]s 10.0.0.5:2222 --account ops --expect-host-key SHA256:x"},
		{"IPv6", "[fd00::5]:7422", []string{"ops"}, "postern hosts enroll %[1]s [fd00::5]:7422 --account ops --expect-host-key SHA256:x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := hostagent.EnrollCommand(hostagent.Config{Listen: tt.listen, AllowedAccounts: tt.accounts}, "SHA256:x")
			name := strings.Fields(got)[3]
			if name != hostname && name != "HOSTNAME" {
				t.Fatalf("EnrollCommand names the host %q; want %q (or HOSTNAME for a name enroll refuses)", name, hostname)
			}
			if want := fmt.Sprintf(tt.want, name); got != want {
				t.Errorf("EnrollCommand = %q; want %q", got, want)
			}
		})
	}
}

// TestInstallTrustingACA: with the bastion CA's lines (postern ca keys), a new config trusts
// them and authorizes no key at all, so no static bastion key can be left on the host;
// lines the hostagent would skip are refused before anything is written.
func TestInstallTrustingACA(t *testing.T) {
	root := t.TempDir()
	ca := testutil.NewSSHKey(t)
	var out bytes.Buffer
	opts := hostagent.InstallOptions{Root: root, TrustedUserCAKeys: []byte(ca.AuthorizedLine() + "\n")}
	if err := hostagent.Install(opts, &out); err != nil {
		t.Fatalf("Install: %v\n%s", err, out.String())
	}
	under := func(p string) string { return filepath.Join(root, p) }
	cfg, err := hostagent.LoadConfig(under(hostagent.DefaultConfigPath))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("installed config does not validate: %v", err)
	}
	if cfg.AuthorizedKeysFile != "" || cfg.AuthorizedKeysDir != "" || cfg.TrustedUserCAKeysFile != hostagent.DefaultTrustedUserCAKeysPath {
		t.Fatalf("installed config authorizes keys or trusts no CA: %+v", cfg)
	}
	if _, err := os.Stat(under(hostagent.DefaultAuthorizedKeysPath)); !os.IsNotExist(err) {
		t.Fatalf("an authorized_keys file was written: %v", err)
	}
	if got := mustRead(t, under(hostagent.DefaultTrustedUserCAKeysPath)); got != ca.AuthorizedLine()+"\n" {
		t.Fatalf("trusted CA file = %q", got)
	}
	if !strings.Contains(out.String(), "nothing to authorize") {
		t.Errorf("output does not say nothing needs authorizing:\n%s", out.String())
	}

	for _, bad := range []string{"", "not a key\n", "cert-authority " + ca.AuthorizedLine() + "\n"} {
		if err := hostagent.Install(hostagent.InstallOptions{Root: t.TempDir(), TrustedUserCAKeys: []byte(bad)}, &out); err == nil {
			t.Errorf("Install took CA lines %q", bad)
		}
	}
	// An existing config without a trusted CA file is not edited behind the operator's back.
	plain := t.TempDir()
	if err := hostagent.Install(hostagent.InstallOptions{Root: plain}, &out); err != nil {
		t.Fatal(err)
	}
	if err := hostagent.Install(hostagent.InstallOptions{Root: plain, TrustedUserCAKeys: []byte(ca.AuthorizedLine())}, &out); err == nil || !strings.Contains(err.Error(), "trusted_user_ca_keys_file") {
		t.Fatalf("Install over a config without trusted_user_ca_keys_file: %v", err)
	}
}
