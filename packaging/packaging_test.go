// Package packaging holds what scripts/package puts into the .deb packages besides the
// binaries (nfpm configs, units, default configs, maintainer scripts); its tests keep those
// files true to the code: the configs load and validate, the hostagent's unit and config are
// what `postern-hostagent install` writes, and the units' systemd-analyze exposure does not
// regress.
package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/hostagent"
)

func TestBastionConfigLoads(t *testing.T) {
	cfg, err := config.LoadConfig("postern/postern.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("packaged config does not validate: %v", err)
	}
	if cfg.StateDir != "/var/lib/postern" {
		t.Errorf("state_dir = %q; want /var/lib/postern (the unit's ReadWritePaths, the postinst's dir)", cfg.StateDir)
	}
}

// TestHostagentFilesAreWhatInstallWrites: the package ships the unit and config that
// `postern-hostagent install --binary /usr/bin/postern-hostagent --read-write
// /var/lib/postern-exec` writes, except that commands run as postern-exec (the account the
// postinst creates) instead of the installing user.
func TestHostagentFilesAreWhatInstallWrites(t *testing.T) {
	root := t.TempDir()
	opts := hostagent.InstallOptions{Root: root, BinaryPath: "/usr/bin/postern-hostagent", ReadWritePaths: []string{"/var/lib/postern-exec"}}
	if err := hostagent.Install(opts, new(strings.Builder)); err != nil {
		t.Fatal(err)
	}
	unit := read(t, filepath.Join(root, hostagent.DefaultUnitPath))
	if got := read(t, "postern-hostagent/postern-hostagent.service"); got != unit {
		t.Errorf("packaging/postern-hostagent/postern-hostagent.service differs from what install writes; regenerate it:\n%s", unit)
	}
	installed := regexp.MustCompile(`(?m)^allowed_accounts = .*$`).ReplaceAllString(
		read(t, filepath.Join(root, hostagent.DefaultConfigPath)), `allowed_accounts = ["postern-exec"]`)
	if got := read(t, "postern-hostagent/config.toml"); got != installed {
		t.Errorf("packaging/postern-hostagent/config.toml differs from what install writes (with postern-exec); regenerate it:\n%s", installed)
	}
	cfg, err := hostagent.LoadConfig("postern-hostagent/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/var/lib/postern-hostagent" || len(cfg.AllowedAccounts) != 1 || cfg.AllowedAccounts[0] != "postern-exec" {
		t.Errorf("packaged hostagent config: data_dir %q, allowed_accounts %v", cfg.DataDir, cfg.AllowedAccounts)
	}
	for _, want := range []string{"KillMode=process", "ReadWritePaths=/var/lib/postern-hostagent /tmp /var/tmp /var/lib/postern-exec"} {
		if !strings.Contains(unit, want+"\n") {
			t.Errorf("hostagent unit lacks %q", want)
		}
	}
}

// TestUnitExposure runs `systemd-analyze security --offline` on both units (where systemd
// is installed) and holds each near the level the README explains (1.5 and 6.2 on systemd
// 252; a little headroom, since other versions weigh differently): the bastion, an
// unprivileged network daemon, is fully confined; the hostagent runs as root and its
// commands inherit its sandbox, so what is left open is what commands need.
func TestUnitExposure(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed")
	}
	for unit, threshold := range map[string]string{ // tenths of the 0-10 scale
		"postern/postern.service":                     "20",
		"postern-hostagent/postern-hostagent.service": "65",
	} {
		out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--threshold="+threshold, unit).CombinedOutput()
		if err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Errorf("%s: %v: %s", unit, err, lines[len(lines)-1])
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
