package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/locate"
)

// Every command finds the bastion it acts on by one rule (internal/locate): the flags, the
// environment, the packaged installation, the user's own state dir.

// The packaged installation's paths (packaging/postern); tests point them elsewhere, so the
// rule does not depend on the machine the tests run on.
var (
	packagedConfig   = "/etc/postern/postern.toml"
	packagedStateDir = "/var/lib/postern"
)

// stateDirConfig is the config a state dir may hold: `postern up` keeps its own there.
const stateDirConfig = "postern.toml"

// The environment variables of the rule's second level.
const (
	envConfig   = "POSTERN_CONFIG"
	envStateDir = "POSTERN_STATE_DIR"
)

// discoveryRule is the rule of this binary; forUp leaves out the packaged installation
// (`postern up` is the per-user quick start: it never takes the postern service's files).
func discoveryRule(forUp bool) locate.Rule {
	home, _ := os.UserHomeDir()
	return locate.Rule{
		DirWhat: "state dir", ConfigFlag: "--config", DirFlag: "--state-dir",
		ConfigEnv: envConfig, DirEnv: envStateDir,
		PackagedConfig: packagedConfig, PackagedDir: packagedStateDir, SkipPackaged: forUp,
		DirConfig: stateDirConfig,
		UserDir:   locate.UserStateDir(os.Getenv, home), UserDirText: locate.UserStateDirText + " (postern up's)",
	}
}

// ruleHelp is the rule as the commands' help states it.
func ruleHelp() string {
	return "Which bastion: the first of these that names one decides —\n" + discoveryRule(false).Help("  ")
}

// pathExists reports whether p exists; a path that cannot be checked counts as existing, so
// reading it says why it cannot be read instead of the rule passing over it.
func pathExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// locator finds the bastion a command acts on, by the discovery rule: its config file and
// state dir.
type locator struct {
	// stateDir and configPath are the flags (level 1 of the rule).
	stateDir   string
	configPath string
	// forUp is `postern up`'s rule (no packaged level).
	forUp bool
	found *locate.Found
}

func (l *locator) register(fs *flag.FlagSet) {
	fs.StringVar(&l.stateDir, "state-dir", l.stateDir, "the bastion's state dir (else $"+envStateDir+", the packaged one, the user's: see below)")
	fs.StringVar(&l.configPath, "config", l.configPath, "the bastion's config file (TOML; else $"+envConfig+", …); with --state-dir, the dir wins over its state_dir")
}

// find applies the rule (once per invocation) and makes its paths absolute.
func (l *locator) find() (locate.Found, error) {
	if l.found != nil {
		return *l.found, nil
	}
	f := discoveryRule(l.forUp).Find(locate.Given{ConfigFlag: l.configPath, DirFlag: l.stateDir, Getenv: os.Getenv, Exists: pathExists})
	if f.Source == locate.None {
		return f, fmt.Errorf("no bastion to act on (%s): pass --state-dir DIR or --config FILE, or set %s", f.Why(), envStateDir)
	}
	for _, p := range []*string{&f.Config, &f.Dir} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return f, fmt.Errorf("%s: %w", *p, err)
		}
		*p = abs
	}
	l.found = &f
	return f, nil
}

// where says what the rule chose and why ("" before find).
func (l *locator) where() string {
	if l.found == nil {
		return ""
	}
	return l.found.Why()
}

// config returns the bastion's configuration: the config file the rule found (with the
// dir it found overriding its state_dir), else the defaults for the dir.
func (l *locator) config() (config.Config, error) {
	cfg, _, err := l.configWithDigest()
	return cfg, err
}

// configWithDigest is config with the file's digest (config.Digest; "" for the defaults).
// Each call reads the file again: a reload's loader.
func (l *locator) configWithDigest() (config.Config, string, error) {
	f, err := l.find()
	if err != nil {
		return config.Config{}, "", err
	}
	var cfg config.Config
	var digest string
	if f.Config != "" {
		cfg, digest, err = config.ReadConfig(f.Config)
		if err != nil {
			if f.Source != locate.FromFlags {
				err = fmt.Errorf("%w\n(%s)", err, f.Why())
			}
			return config.Config{}, "", err
		}
	} else {
		cfg = config.DefaultConfig(f.Dir)
	}
	if f.Dir != "" {
		cfg.StateDir = f.Dir
	}
	return cfg, digest, nil
}
