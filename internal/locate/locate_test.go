package locate

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/datadriven"
)

// TestRules runs testdata/rules: each case is one invocation of postern (or, with hostagent,
// postern-hostagent) —
//
//	find [config=FILE] [dir=DIR] [env-config=FILE] [env-dir=DIR] [exists=P,P…]
//	     [home=DIR] [xdg=DIR] [hostagent] [up]
//
// config and dir are the flags, env-* the variables, exists the paths that exist (the rest do
// not), home the user's home ("none" for no home; default /home/ann), xdg $XDG_STATE_HOME; up
// is `postern up`'s rule (no packaged level). The output is the level that decided and Why.
func TestRules(t *testing.T) {
	datadriven.RunFile(t, filepath.Join("testdata", "rules"), func(t *testing.T, c datadriven.Case) string {
		if c.Name != "find" {
			c.Fatalf(t, "unknown command %q", c.Name)
		}
		home := "/home/ann"
		if h, ok := c.Args["home"]; ok {
			home = h
			if h == "none" {
				home = ""
			}
		}
		env := map[string]string{"XDG_STATE_HOME": c.Args["xdg"]}
		exists := map[string]bool{}
		for _, p := range strings.Split(c.Args["exists"], ",") {
			exists[p] = p != ""
		}
		userDir := UserStateDir(func(k string) string { return env[k] }, home)
		r := Rule{
			DirWhat: "state dir", ConfigFlag: "--config", DirFlag: "--state-dir",
			ConfigEnv: "POSTERN_CONFIG", DirEnv: "POSTERN_STATE_DIR",
			PackagedConfig: "/etc/postern/postern.toml", PackagedDir: "/var/lib/postern",
			SkipPackaged: c.Flags["up"], DirConfig: "postern.toml",
			UserDir: userDir, UserDirText: UserStateDirText,
		}
		if c.Flags["hostagent"] {
			r = Rule{
				DirWhat: "data dir", ConfigFlag: "--config", DirFlag: "--data-dir",
				ConfigEnv: "POSTERN_HOSTAGENT_CONFIG", DirEnv: "POSTERN_HOSTAGENT_DATA_DIR",
				PackagedConfig: "/etc/postern-hostagent/config.toml",
				UserDirText:    "postern up's hostagent",
			}
			if userDir != "" {
				r.UserDir = filepath.Join(userDir, "hostagent")
			}
		}
		env[r.ConfigEnv], env[r.DirEnv] = c.Args["env-config"], c.Args["env-dir"]
		f := r.Find(Given{
			ConfigFlag: c.Args["config"], DirFlag: c.Args["dir"],
			Getenv: func(k string) string { return env[k] },
			Exists: func(p string) bool { return exists[p] },
		})
		src := string(f.Source)
		if src == "" {
			src = "none"
		}
		return src + ": " + f.Why()
	})
}

// TestHelp: --help states the levels in the rule's order.
func TestHelp(t *testing.T) {
	r := Rule{
		DirWhat: "state dir", ConfigFlag: "--config", DirFlag: "--state-dir",
		ConfigEnv: "POSTERN_CONFIG", DirEnv: "POSTERN_STATE_DIR",
		PackagedConfig: "/etc/postern/postern.toml", PackagedDir: "/var/lib/postern",
		DirConfig: "postern.toml", UserDirText: UserStateDirText,
	}
	want := `  1. --config FILE and/or --state-dir DIR
  2. $POSTERN_CONFIG and/or $POSTERN_STATE_DIR
  3. /etc/postern/postern.toml if it exists, else /var/lib/postern if it exists (the packages)
  4. $XDG_STATE_HOME/postern, else ~/.local/state/postern
  A state dir chosen without a config file uses <dir>/postern.toml if it holds one.
`
	if got := r.Help("  "); got != want {
		t.Errorf("Help:\n%s\nwant:\n%s", got, want)
	}
	r.SkipPackaged = true
	if got := r.Help(""); strings.Contains(got, "/etc/postern") || !strings.Contains(got, "3. $XDG_STATE_HOME") {
		t.Errorf("Help without the packaged level:\n%s", got)
	}
}
