package main

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/cli"
)

var printedToken = regexp.MustCompile(`(?m)^(pst_\S+)$`)

func TestToken(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr error
	}{
		{name: "name", args: []string{"ci-bot.prod_1"}},
		{name: "no name", args: nil, wantErr: cli.ErrUsage},
		{name: "two names", args: []string{"a", "b"}, wantErr: cli.ErrUsage},
		{name: "leading dash", args: []string{"--", "-bot"}, wantErr: cli.ErrUsage},
		{name: "space", args: []string{"a bot"}, wantErr: cli.ErrUsage},
		{name: "quote", args: []string{`a"b`}, wantErr: cli.ErrUsage},
		{name: "too long", args: []string{strings.Repeat("a", 65)}, wantErr: cli.ErrUsage},
		{name: "static with an expiry", args: []string{"a", "--expires", "30d"}, wantErr: cli.ErrUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runCLI(t, "", append([]string{"token", "--static"}, tt.args...)...)
			if tt.wantErr != nil {
				if !errors.Is(res.err, tt.wantErr) || res.stdout != "" {
					t.Fatalf("err = %v, stdout %q; want %v and no token", res.err, res.stdout, tt.wantErr)
				}
				return
			}
			if res.err != nil {
				t.Fatal(res.err)
			}
			m := printedToken.FindStringSubmatch(res.stdout)
			if m == nil {
				t.Fatalf("no token line in:\n%s", res.stdout)
			}
			snippet := "[[actors]]\nname = \"" + tt.args[0] + "\"\ntoken_sha256 = \"" + transport.HashToken(m[1]) + "\"\n"
			if !strings.HasSuffix(res.stdout, snippet) {
				t.Fatalf("output does not end with the config snippet %q:\n%s", snippet, res.stdout)
			}
			if strings.Count(res.stdout, m[1]) != 1 || !strings.Contains(res.stdout, "the token\nitself must not go in it") {
				t.Fatalf("want the token exactly once and the warning to keep it out of the config:\n%s", res.stdout)
			}
		})
	}
	// Tokens are fresh every time.
	a, b := runCLI(t, "", "token", "--static", "x"), runCLI(t, "", "token", "--static", "x")
	if printedToken.FindString(a.stdout) == printedToken.FindString(b.stdout) {
		t.Fatal("two runs printed the same token")
	}
}

// What the daemon would refuse is refused before it is asked, without a daemon.
func TestTokenUsage(t *testing.T) {
	for _, args := range [][]string{
		{"token", "ci", "--expires", "0d"},
		{"token", "ci", "--expires", "yesterday"},
		{"token", "ci", "--expires", "2020-01-01T00:00:00Z"},
		{"token", "ci", "--expires", "9999d"},
		{"token", "revoke", "ci"},
		{"token", "revoke"},
		{"token", "list", "extra"},
	} {
		res := runCLI(t, "", args...)
		if !errors.Is(res.err, cli.ErrUsage) || res.stdout != "" {
			t.Errorf("%q: err = %v, stdout %q; want a usage error", args, res.err, res.stdout)
		}
	}
}
