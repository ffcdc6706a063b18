package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// noMachine makes the discovery rule independent of the machine the test runs on: the
// packaged paths are the test's own (absent until the test makes them), no variables, a home
// of its own. It returns the packaged config path, state dir path and the home.
func noMachine(t *testing.T) (config, stateDir, home string) {
	t.Helper()
	savedConfig, savedDir := packagedConfig, packagedStateDir
	root := t.TempDir()
	packagedConfig, packagedStateDir = filepath.Join(root, "etc/postern/postern.toml"), filepath.Join(root, "var/lib/postern")
	t.Cleanup(func() { packagedConfig, packagedStateDir = savedConfig, savedDir })
	home = t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"XDG_STATE_HOME", envConfig, envStateDir} {
		t.Setenv(v, "")
	}
	return packagedConfig, packagedStateDir, home
}

// TestDiscoveryRule: every level of the rule picks the bastion a command acts on, and a
// command that finds no bastion there says which one it looked at and what chose it.
func TestDiscoveryRule(t *testing.T) {
	pkgConfig, pkgDir, home := noMachine(t)
	userDir := filepath.Join(home, ".local/state/postern")
	flagDir, envDir := sockdir.New(t), sockdir.New(t)
	// The second command found nothing to read: its error names the state dir and the rule.
	expect := func(t *testing.T, want ...string) {
		t.Helper()
		res := runCLI(t, "", "executions", "list")
		if res.err == nil {
			t.Fatalf("executions list found a journal; want none")
		}
		for _, w := range want {
			if !strings.Contains(res.err.Error(), w) {
				t.Errorf("error %q lacks %q", res.err, w)
			}
		}
	}

	t.Run("user default", func(t *testing.T) {
		expect(t, "state dir "+userDir+", chosen by the user default", pkgConfig+" (absent)", pkgDir+" (absent)",
			"no bastion ever ran there", "postern up")
	})
	t.Run("packaged state dir", func(t *testing.T) {
		if err := os.MkdirAll(pkgDir, 0o700); err != nil {
			t.Fatal(err)
		}
		expect(t, "state dir "+pkgDir+", chosen by the packaged state dir", pkgConfig+" (absent)")
	})
	t.Run("packaged config", func(t *testing.T) {
		if err := os.MkdirAll(filepath.Dir(pkgConfig), 0o755); err != nil {
			t.Fatal(err)
		}
		other := sockdir.New(t)
		if err := os.WriteFile(pkgConfig, []byte("state_dir = \""+other+"\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		expect(t, "config "+pkgConfig+", chosen by the packaged config", filepath.Join(other, "operator.sock"))
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv(envStateDir, envDir)
		expect(t, "state dir "+envDir+", chosen by POSTERN_STATE_DIR", "--config/--state-dir (not given)")
	})
	t.Run("flags", func(t *testing.T) {
		t.Setenv(envStateDir, envDir)
		res := runCLI(t, "", "executions", "list", "--state-dir", flagDir)
		if res.err == nil || !strings.Contains(res.err.Error(), "state dir "+flagDir+", chosen by --state-dir") {
			t.Fatalf("err = %v; want the flag's state dir", res.err)
		}
	})
	t.Run("a state dir's own config", func(t *testing.T) {
		moved := sockdir.New(t)
		if err := os.WriteFile(filepath.Join(envDir, stateDirConfig), []byte("state_dir = \""+envDir+"\"\noperator_socket = \""+filepath.Join(moved, "op.sock")+"\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv(envStateDir, envDir)
		expect(t, "config "+filepath.Join(envDir, stateDirConfig)+" with state dir "+envDir, "no socket at "+filepath.Join(moved, "op.sock"))
	})
	t.Run("help states the rule", func(t *testing.T) {
		res := runCLI(t, "", "executions", "list", "-h")
		for _, want := range []string{"Which bastion", "1. --config FILE and/or --state-dir DIR", "2. $POSTERN_CONFIG and/or $POSTERN_STATE_DIR", "3. " + pkgConfig, "4. $XDG_STATE_HOME/postern"} {
			if !strings.Contains(res.stderr, want) {
				t.Errorf("-h lacks %q:\n%s", want, res.stderr)
			}
		}
	})
}
