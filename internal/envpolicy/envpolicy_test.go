package envpolicy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/envpolicy"
)

func TestCheck(t *testing.T) {
	allow, err := envpolicy.New([]string{"RAILS_ENV", "APP_*"})
	if err != nil {
		t.Fatal(err)
	}
	none, err := envpolicy.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		allow envpolicy.Allowlist
		env   string
		want  error // nil = kept
	}{
		{name: "locale", allow: none, env: "LANG"},
		{name: "locale prefix", allow: none, env: "LC_TIME"},
		{name: "postern", allow: none, env: "POSTERN_STEP"},
		{name: "accept_env exact", allow: allow, env: "RAILS_ENV"},
		{name: "accept_env prefix", allow: allow, env: "APP_MODE"},
		{name: "accept_env is exact, not a prefix", allow: allow, env: "RAILS_ENVX", want: envpolicy.ErrNotAccepted},
		{name: "not configured on this host", allow: none, env: "RAILS_ENV", want: envpolicy.ErrNotAccepted},
		{name: "LD_PRELOAD", allow: allow, env: "LD_PRELOAD", want: envpolicy.ErrForbidden},
		{name: "LD_LIBRARY_PATH", allow: none, env: "LD_LIBRARY_PATH", want: envpolicy.ErrForbidden},
		{name: "BASH_ENV", allow: allow, env: "BASH_ENV", want: envpolicy.ErrForbidden},
		{name: "exported function", allow: allow, env: "BASH_FUNC_x%%", want: envpolicy.ErrInvalidName},
		{name: "bash function name", allow: allow, env: "BASH_FUNC_x", want: envpolicy.ErrForbidden},
		{name: "PATH", allow: allow, env: "PATH", want: envpolicy.ErrForbidden},
		{name: "IFS", allow: allow, env: "IFS", want: envpolicy.ErrForbidden},
		{name: "leading digit", allow: allow, env: "1APP", want: envpolicy.ErrInvalidName},
		{name: "equals sign", allow: allow, env: "APP_A=B", want: envpolicy.ErrInvalidName},
		{name: "empty", allow: allow, env: "", want: envpolicy.ErrInvalidName},
		{name: "too long", allow: allow, env: "APP_" + strings.Repeat("X", envpolicy.MaxNameBytes), want: envpolicy.ErrInvalidName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.allow.Check(tt.env)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("Check(%q) = %v; want %v", tt.env, err, tt.want)
			}
			if got := tt.allow.Allows(tt.env); got != (tt.want == nil) {
				t.Fatalf("Allows(%q) = %v; want %v", tt.env, got, tt.want == nil)
			}
		})
	}
}

func TestCheckNamesWhatIsAllowed(t *testing.T) {
	allow, _ := envpolicy.New([]string{"APP_*"})
	err := allow.Check("FOO")
	if err == nil || !strings.Contains(err.Error(), "POSTERN_*, LANG, LC_* and its accept_env APP_*") {
		t.Fatalf("Check(FOO) = %v; want the list of what the host accepts", err)
	}
}

func TestCheckPattern(t *testing.T) {
	tests := []struct {
		pattern string
		wantErr string
	}{
		{pattern: "RAILS_ENV"},
		{pattern: "APP_*"},
		{pattern: "L*", wantErr: "LD_*"},
		{pattern: "LD_*", wantErr: "LD_*"},
		{pattern: "LD_PRELOAD", wantErr: "LD_*"},
		{pattern: "B*", wantErr: "BASH_ENV"},
		{pattern: "PATH", wantErr: "PATH"},
		{pattern: "PATHX"},
		{pattern: "*", wantErr: "non-empty prefix"},
		{pattern: "A-B", wantErr: "not a valid"},
		{pattern: "A*B*", wantErr: "not a valid"},
	}
	for _, tt := range tests {
		err := envpolicy.CheckPattern(tt.pattern)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CheckPattern(%q) = %v; want %q", tt.pattern, err, tt.wantErr)
		}
	}
	if _, err := envpolicy.New([]string{"OK", "L*", "1X"}); err == nil || !strings.Contains(err.Error(), `"L*"`) || !strings.Contains(err.Error(), `"1X"`) {
		t.Errorf("New reports %v; want every bad pattern", err)
	}
}

// FuzzCheck: whatever the name and accept_env, a kept name is a valid name, never a
// forbidden one, and matched by a builtin or a configured pattern; a name is never both kept
// and refused for a reason.
func FuzzCheck(f *testing.F) {
	f.Add("LANG", "APP_*")
	f.Add("LD_PRELOAD", "LD_PRELOAD")
	f.Add("APP_X", "APP_*")
	f.Add("BASH_FUNC_f%%", "BASH_*")
	f.Add("PATH", "PAT*")
	f.Add("é", "")
	f.Fuzz(func(t *testing.T, name, pattern string) {
		var accept []string
		if pattern != "" {
			accept = []string{pattern}
		}
		allow, err := envpolicy.New(accept)
		if err != nil {
			if envpolicy.CheckPattern(pattern) == nil {
				t.Fatalf("New(%q) = %v, yet the pattern checks", pattern, err)
			}
			return
		}
		err = allow.Check(name)
		if err != nil {
			if !errors.Is(err, envpolicy.ErrInvalidName) && !errors.Is(err, envpolicy.ErrForbidden) && !errors.Is(err, envpolicy.ErrNotAccepted) {
				t.Fatalf("Check(%q) = %v: not one of the reasons", name, err)
			}
			return
		}
		if !envpolicy.ValidName(name) || envpolicy.IsForbidden(name) {
			t.Fatalf("Check(%q) kept an invalid or forbidden name (accept_env %q)", name, accept)
		}
		matched := false
		for _, p := range append(append([]string(nil), envpolicy.Builtin...), accept...) {
			matched = matched || envpolicy.Match(p, name)
		}
		if !matched {
			t.Fatalf("Check(%q) kept a name no pattern matches (accept_env %q)", name, accept)
		}
	})
}
