package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/locate"
)

// Every command finds the hostagent it acts on by one rule (internal/locate), the same as
// postern's: the flags, the environment, the packaged config, the user's own — the local
// hostagent `postern up` runs.

// packagedConfig is the packaged (and installed) config; tests point it elsewhere, so the
// rule does not depend on the machine the tests run on.
var packagedConfig = hostagent.DefaultConfigPath

// The environment variables of the rule's second level.
const (
	envConfig  = "POSTERN_HOSTAGENT_CONFIG"
	envDataDir = "POSTERN_HOSTAGENT_DATA_DIR"
)

// upAgentDir is where `postern up` keeps its local hostagent, under its state dir.
const upAgentDir = "hostagent"

func discoveryRule() locate.Rule {
	home, _ := os.UserHomeDir()
	r := locate.Rule{
		DirWhat: "data dir", ConfigFlag: "--config", DirFlag: "--data-dir",
		ConfigEnv: envConfig, DirEnv: envDataDir, PackagedConfig: packagedConfig,
		UserDirText: "postern up's local hostagent: " + upAgentDir + "/ in " + locate.UserStateDirText,
	}
	if d := locate.UserStateDir(os.Getenv, home); d != "" {
		r.UserDir = filepath.Join(d, upAgentDir)
	}
	return r
}

// ruleHelp is the rule as the commands' help states it.
func ruleHelp() string {
	return "Which hostagent: the first of these that names one decides —\n" + discoveryRule().Help("  ")
}

// findAgent applies the rule to the flags: the hostagent's config — the file's (with the
// dir overriding its data_dir), else the defaults for the dir — and what chose it. A config
// file with problems comes back with them (hostagent.IsConfigProblem) and what did decode.
func findAgent(configFlag, dataDirFlag string) (hostagent.Config, locate.Found, error) {
	f := discoveryRule().Find(locate.Given{ConfigFlag: configFlag, DirFlag: dataDirFlag, Getenv: os.Getenv, Exists: pathExists})
	if f.Source == locate.None {
		return hostagent.Config{}, f, fmt.Errorf("no hostagent to act on (%s): pass --config FILE or --data-dir DIR, or set %s", f.Why(), envConfig)
	}
	for _, p := range []*string{&f.Config, &f.Dir} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return hostagent.Config{}, f, fmt.Errorf("%s: %w", *p, err)
		}
		*p = abs
	}
	cfg := hostagent.DefaultConfig()
	var loadErr error
	if f.Config != "" {
		cfg, loadErr = hostagent.LoadConfig(f.Config)
		switch {
		case loadErr == nil, hostagent.IsConfigProblem(loadErr):
		case errors.Is(loadErr, fs.ErrPermission):
			return cfg, f, fmt.Errorf("%w (%s): run as the hostagent's user or root, or pass --config FILE", loadErr, f.Why())
		case f.Source != locate.FromFlags:
			return cfg, f, fmt.Errorf("%w (%s)", loadErr, f.Why())
		default:
			return cfg, f, loadErr
		}
	}
	if f.Dir != "" {
		cfg.DataDir = f.Dir
	}
	return cfg, f, loadErr
}

// pathExists reports whether p exists; a path that cannot be checked counts as existing, so
// reading it says why it cannot be read instead of the rule passing over it.
func pathExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}
