package engine

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/testutil"
)

// TestSSHCAPrincipals: the bastion's certificate covers every enrolled host's account and
// every account a policy grant names, read at each signing, and names the replica; with
// [ssh_ca] off there is no issuer.
func TestSSHCAPrincipals(t *testing.T) {
	cfg := config.DefaultConfig(t.TempDir())
	if certs, err := openSSHCA(cfg, nil, nil, "", false, slog.New(slog.DiscardHandler), time.Now); certs != nil || err != nil {
		t.Fatalf("[ssh_ca] off: %v, %v; want no issuer", certs, err)
	}
	cfg.SSHCA.Enabled = true
	if err := fleet.Enroll(cfg.InventoryPath(), fleet.Host{Name: "web1", Addr: "127.0.0.1:2222", Account: "deploy", HostKey: testutil.NewSSHKey(t).Public()}); err != nil {
		t.Fatal(err)
	}
	inv, err := fleet.OpenInventory(cfg.InventoryPath())
	if err != nil {
		t.Fatal(err)
	}
	live := cfg
	live.Rules = []policy.Rule{{Decision: policy.DecisionAllow, Accounts: []string{"backup", "app"}}}
	certs, err := openSSHCA(cfg, inv, func() config.Config { return live }, "r1", false, slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := certs.Signer("deploy")
	if err != nil {
		t.Fatal(err)
	}
	cert := signer.PublicKey().(*gossh.Certificate)
	if want := []string{"app", "backup", "deploy"}; !slices.Equal(cert.ValidPrincipals, want) {
		t.Fatalf("principals %v; want %v", cert.ValidPrincipals, want)
	}
	if cert.KeyId != "postern-bastion replica=r1" {
		t.Fatalf("key id %q", cert.KeyId)
	}
}

// TestSSHCAThatCannotSignFailsAtStart: a CA key others can read (or none) stops the start,
// rather than every dial after it.
func TestSSHCAThatCannotSignFailsAtStart(t *testing.T) {
	cfg := config.DefaultConfig(t.TempDir())
	cfg.SSHCA.Enabled = true
	quiet := slog.New(slog.DiscardHandler)
	none := func() config.Config { return cfg }
	if _, err := openSSHCA(cfg, nil, none, "", false, quiet, time.Now); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(cfg.SSHCADir(), "ca-1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openSSHCA(cfg, nil, none, "", false, quiet, time.Now); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("open with a CA key others can read: %v", err)
	}
	// Replicas never make the CA themselves.
	etcdCfg := config.DefaultConfig(t.TempDir())
	etcdCfg.SSHCA.Enabled, etcdCfg.Journal.Backend = true, "etcd"
	if _, err := openSSHCA(etcdCfg, nil, none, "r1", false, quiet, time.Now); err == nil || !strings.Contains(err.Error(), "postern ca init") {
		t.Fatalf("a replica without a CA: %v; want told to init one", err)
	}
}
