// Package envpolicy is the one definition of which environment variables a command may be
// given from outside. The hostagent applies it to a session's env requests (and drops what it
// does not allow); the bastion applies the same rule to an ssh_exec's env before anything is
// journaled, so a variable the host would drop is refused where the agent can see why.
//
// A host accepts the Builtin patterns plus its accept_env patterns (exact names, or a prefix
// ending in "*"). No pattern may cover a Forbidden variable — one that makes the dynamic
// linker or a shell run code chosen by whoever sets it — so no host ever accepts one.
package envpolicy

import (
	"errors"
	"fmt"
	"strings"
)

// MaxNameBytes bounds a variable name.
const MaxNameBytes = 256

// Builtin are accepted by every host: the Postern variables and the locale.
var Builtin = []string{"POSTERN_*", "LANG", "LC_*"}

// Forbidden are never accepted, whatever the configuration: they make the dynamic linker or
// a shell execute code chosen by whoever sets them.
var Forbidden = []string{"LD_*", "DYLD_*", "BASH_ENV", "ENV", "BASH_FUNC_*", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PATH", "GCONV_PATH", "HOSTALIASES", "LOCPATH", "NLSPATH"}

// Reasons a name is refused; callers branch with errors.Is.
var (
	ErrInvalidName = errors.New("not a valid environment variable name")
	ErrForbidden   = errors.New("can make the command run arbitrary code; no host accepts it")
	ErrNotAccepted = errors.New("not accepted by the host")
)

// ValidName accepts [A-Za-z_][A-Za-z0-9_]* of at most MaxNameBytes bytes.
func ValidName(name string) bool {
	if name == "" || len(name) > MaxNameBytes {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Match matches name against an exact name or a "PREFIX*" pattern.
func Match(pattern, name string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}

// IsForbidden reports whether name is a Forbidden variable.
func IsForbidden(name string) bool {
	for _, f := range Forbidden {
		if Match(f, name) {
			return true
		}
	}
	return false
}

// CheckPattern validates an accept_env pattern: a valid name, optionally ending in "*", that
// can match no Forbidden variable (nor be matched by one: "L*" would cover "LD_PRELOAD").
func CheckPattern(pattern string) error {
	name := strings.TrimSuffix(pattern, "*")
	if name == "" {
		return errors.New("must name a variable or a non-empty prefix")
	}
	if !ValidName(name) {
		return ErrInvalidName
	}
	for _, f := range Forbidden {
		if Match(f, name) || Match(pattern, strings.TrimSuffix(f, "*")) {
			return fmt.Errorf("would accept %s, which can make the child run arbitrary code", f)
		}
	}
	return nil
}

// Allowlist is what one host accepts: Builtin plus its accept_env patterns.
type Allowlist struct {
	extra []string
}

// New returns the allowlist of a host configured with acceptEnv, or every bad pattern.
func New(acceptEnv []string) (Allowlist, error) {
	var errs []error
	for _, p := range acceptEnv {
		if err := CheckPattern(p); err != nil {
			errs = append(errs, fmt.Errorf("accept_env %q: %w", p, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Allowlist{}, err
	}
	return Allowlist{extra: append([]string(nil), acceptEnv...)}, nil
}

// Allows reports whether the host keeps a variable called name.
func (a Allowlist) Allows(name string) bool {
	return a.Check(name) == nil
}

// Check says why the host would drop name (nil if it keeps it). The error names what is
// allowed.
func (a Allowlist) Check(name string) error {
	switch {
	case !ValidName(name):
		return fmt.Errorf("%q: %w", name, ErrInvalidName)
	case IsForbidden(name):
		return fmt.Errorf("%s %w", name, ErrForbidden)
	}
	for _, p := range Builtin {
		if Match(p, name) {
			return nil
		}
	}
	for _, p := range a.extra {
		if Match(p, name) {
			return nil
		}
	}
	return fmt.Errorf("%s: %w, which accepts only %s", name, ErrNotAccepted, a)
}

// String lists the accepted patterns: "POSTERN_*, LANG, LC_* and its accept_env RAILS_ENV, APP_*".
func (a Allowlist) String() string {
	s := strings.Join(Builtin, ", ")
	if len(a.extra) == 0 {
		return s + " (its accept_env is empty)"
	}
	return s + " and its accept_env " + strings.Join(a.extra, ", ")
}
