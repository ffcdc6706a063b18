// Package locate is the one rule by which every command of postern and postern-hostagent
// finds the installation it acts on — its config file and its state dir (the hostagent's:
// its data dir) — and the words in which --help, the docs and an error that found nothing
// say where it looked and what chose the place. The rule is a pure function of what a
// command was given (flags, environment) and which paths exist, so it is tested from a
// table (testdata/rules).
//
// In order, the first level that names an installation decides it, whole — a flag is never
// mixed with a variable or a packaged file:
//
//  1. the flags: --config FILE and/or --state-dir DIR;
//  2. the environment: POSTERN_CONFIG and/or POSTERN_STATE_DIR;
//  3. the packaged installation: its config file if it exists, else its state dir if it
//     exists;
//  4. the user's own: $XDG_STATE_HOME/postern, else ~/.local/state/postern, where `postern
//     up` keeps its state.
//
// A state dir chosen without a config file (levels 1, 2, 3 and 4 alike) uses the config it
// holds, when the rule knows one (Rule.DirConfig: postern.toml, which `postern up` writes),
// else the defaults for that dir. A config and a dir chosen together: the dir overrides the
// config's.
package locate

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Rule is one program's discovery rule: the names it answers to and the places it knows.
type Rule struct {
	// DirWhat names the dir in messages: "state dir", "data dir".
	DirWhat string
	// ConfigFlag and DirFlag are the flags of level 1 ("--config", "--state-dir").
	ConfigFlag, DirFlag string
	// ConfigEnv and DirEnv are the variables of level 2.
	ConfigEnv, DirEnv string
	// PackagedConfig and PackagedDir are the packaged installation's paths (level 3); either
	// may be "" (none).
	PackagedConfig, PackagedDir string
	// SkipPackaged leaves level 3 out: `postern up`, the per-user quick start, never takes
	// the packaged installation's files.
	SkipPackaged bool
	// DirConfig is the file name of the config a dir may hold ("" when dirs hold none).
	DirConfig string
	// UserDir is the user's own dir (level 4); "" when it cannot be known (no home).
	UserDir string
	// UserDirText says how UserDir is made, as the docs say it.
	UserDirText string
}

// Given is what one invocation brings.
type Given struct {
	// ConfigFlag and DirFlag are the flags' values, "" when not given.
	ConfigFlag, DirFlag string
	// Getenv reads the environment ("" is unset).
	Getenv func(string) string
	// Exists reports whether a path exists (a path that cannot be checked counts as
	// existing: reading it then says why it cannot be read).
	Exists func(path string) bool
}

// Source is the level of the rule that decided.
type Source string

// The levels, in order; None when nothing named an installation (no flag, no variable, no
// packaged files, and no home to find the user's dir in).
const (
	FromFlags    Source = "flags"
	FromEnv      Source = "environment"
	FromPackaged Source = "packaged"
	FromUser     Source = "user"
	None         Source = ""
)

// Found is where the rule points.
type Found struct {
	// Config is the config file to read; "" means the defaults for Dir.
	Config string
	// Dir is the state (data) dir; "" means the config's.
	Dir string
	// Source is the level that decided; By names what there chose it ("--state-dir",
	// "POSTERN_CONFIG", "the packaged config", …).
	Source Source
	By     string
	// Passed is what the rule looked at before, in order, and found nothing in.
	Passed []string

	dirWhat string
}

// Find applies the rule to what one invocation was given.
func (r Rule) Find(g Given) Found {
	f := Found{dirWhat: r.DirWhat}
	level := func(src Source, config, dir, configName, dirName string) bool {
		if config == "" && dir == "" {
			return false
		}
		f.Source, f.Config, f.Dir = src, config, dir
		switch {
		case config != "" && dir != "":
			f.By = configName + " and " + dirName
		case config != "":
			f.By = configName
		default:
			f.By = dirName
			f.Config = r.dirConfig(dir, g.Exists)
		}
		return true
	}
	if level(FromFlags, g.ConfigFlag, g.DirFlag, r.ConfigFlag, r.DirFlag) {
		return f
	}
	f.Passed = append(f.Passed, r.ConfigFlag+"/"+r.DirFlag+" (not given)")
	if level(FromEnv, g.Getenv(r.ConfigEnv), g.Getenv(r.DirEnv), r.ConfigEnv, r.DirEnv) {
		return f
	}
	f.Passed = append(f.Passed, r.ConfigEnv+"/"+r.DirEnv+" (not set)")
	if !r.SkipPackaged {
		if r.PackagedConfig != "" {
			if g.Exists(r.PackagedConfig) {
				f.Source, f.Config, f.By = FromPackaged, r.PackagedConfig, "the packaged config"
				return f
			}
			f.Passed = append(f.Passed, r.PackagedConfig+" (absent)")
		}
		if r.PackagedDir != "" {
			if g.Exists(r.PackagedDir) {
				f.Source, f.Dir, f.By = FromPackaged, r.PackagedDir, "the packaged "+r.DirWhat
				f.Config = r.dirConfig(r.PackagedDir, g.Exists)
				return f
			}
			f.Passed = append(f.Passed, r.PackagedDir+" (absent)")
		}
	}
	if r.UserDir != "" {
		f.Source, f.Dir, f.By = FromUser, r.UserDir, "the user default"
		f.Config = r.dirConfig(r.UserDir, g.Exists)
		return f
	}
	f.Passed = append(f.Passed, r.UserDirText+" (no home directory)")
	return f
}

// dirConfig is the config dir holds, "" when it holds none.
func (r Rule) dirConfig(dir string, exists func(string) bool) string {
	if r.DirConfig == "" {
		return ""
	}
	if p := filepath.Join(dir, r.DirConfig); exists(p) {
		return p
	}
	return ""
}

// What is the place found, in a few words: "config /c", "state dir /d", "config /c with
// state dir /d", or "nothing" when nothing was found.
func (f Found) What() string {
	switch {
	case f.Config != "" && f.Dir != "":
		return fmt.Sprintf("config %s with %s %s", f.Config, f.dirWhat, f.Dir)
	case f.Config != "":
		return "config " + f.Config
	case f.Dir != "":
		return f.dirWhat + " " + f.Dir
	}
	return "nothing"
}

// Why says what the rule chose and why, for messages: "state dir /d, chosen by
// POSTERN_STATE_DIR; looked first at --config/--state-dir (not given)".
func (f Found) Why() string {
	var b strings.Builder
	if f.Source == None {
		b.WriteString("no installation found")
	} else {
		fmt.Fprintf(&b, "%s, chosen by %s", f.What(), f.By)
	}
	if len(f.Passed) > 0 {
		b.WriteString("; looked first at ")
		b.WriteString(strings.Join(f.Passed, ", "))
	}
	return b.String()
}

// Help is the rule as --help and the docs state it, one level a line, each indented by
// indent.
func (r Rule) Help(indent string) string {
	var b strings.Builder
	n := 1
	line := func(format string, args ...any) {
		fmt.Fprintf(&b, "%s%d. "+format+"\n", append([]any{indent, n}, args...)...)
		n++
	}
	line("%s FILE and/or %s DIR", r.ConfigFlag, r.DirFlag)
	line("$%s and/or $%s", r.ConfigEnv, r.DirEnv)
	if !r.SkipPackaged {
		switch {
		case r.PackagedConfig != "" && r.PackagedDir != "":
			line("%s if it exists, else %s if it exists (the packages)", r.PackagedConfig, r.PackagedDir)
		case r.PackagedConfig != "":
			line("%s if it exists (the package)", r.PackagedConfig)
		}
	}
	line("%s", r.UserDirText)
	if r.DirConfig != "" {
		fmt.Fprintf(&b, "%sA %s chosen without a config file uses <dir>/%s if it holds one.\n", indent, r.DirWhat, r.DirConfig)
	}
	return b.String()
}

// UserStateDir is the per-user state dir of postern: $XDG_STATE_HOME/postern when that is an
// absolute path, else <home>/.local/state/postern, "" without a home.
func UserStateDir(getenv func(string) string, home string) string {
	if d := getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "postern")
	}
	if home == "" {
		return ""
	}
	return filepath.Join(home, ".local", "state", "postern")
}

// UserStateDirText says how UserStateDir is made.
const UserStateDirText = "$XDG_STATE_HOME/postern, else ~/.local/state/postern"
