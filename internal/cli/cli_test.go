package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

const prog = Program("postern-x")

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		n          int
		want       []string
		wantErr    error
		wantStderr string
	}{
		{name: "flags around the argument", args: []string{"--json", "ex_1", "--limit", "3"}, n: 1, want: []string{"ex_1"}},
		{name: "none wanted", args: []string{"--json"}, n: 0, want: nil},
		{name: "stray argument", args: []string{"extra"}, n: 0, wantErr: ErrUsage, wantStderr: `unexpected arguments: ["extra"]`},
		{name: "missing argument", args: nil, n: 1, wantErr: ErrUsage, wantStderr: `want 1 argument(s), got []`},
		{name: "unknown flag", args: []string{"--nope"}, n: 0, wantErr: ErrUsage, wantStderr: "flag provided but not defined: -nope"},
		{name: "help", args: []string{"-h"}, n: 0, wantErr: flag.ErrHelp, wantStderr: "usage: postern-x thing [flags]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs := prog.FlagSet("thing [flags]", &stderr)
			fs.Bool("json", false, "print JSON")
			fs.Int("limit", 0, "at most")
			got, err := ParseArgs(fs, tt.args, tt.n)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
			if err == nil && !slices.Equal(got, tt.want) {
				t.Errorf("got = %q; want %q", got, tt.want)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr = %q; want it to contain %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestDispatch(t *testing.T) {
	subs := Subcommands{"list": func(context.Context, []string) error { return errors.New("listed") }}
	tests := []struct {
		name                   string
		args                   []string
		wantCode               int
		wantStdout, wantStderr string
	}{
		{name: "subcommand", args: []string{"list"}, wantCode: 1, wantStderr: "postern-x: listed"},
		{name: "none", args: nil, wantCode: 2, wantStderr: "USAGE"},
		{name: "unknown", args: []string{"frob"}, wantCode: 2, wantStderr: `postern-x things: unknown subcommand "frob"` + "\n\nUSAGE"},
		{name: "help", args: []string{"--help"}, wantCode: 0, wantStdout: "USAGE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := prog.Dispatch(context.Background(), "things", "USAGE", subs, tt.args, &stdout, &stderr)
			if got := prog.ExitCode(err, &stderr); got != tt.wantCode {
				t.Errorf("exit code = %d; want %d", got, tt.wantCode)
			}
			if got := strings.TrimSpace(stdout.String()); got != tt.wantStdout {
				t.Errorf("stdout = %q; want %q", got, tt.wantStdout)
			}
			if got := strings.TrimSpace(stderr.String()); got != tt.wantStderr {
				t.Errorf("stderr = %q; want %q", got, tt.wantStderr)
			}
		})
	}
}

func TestUsageErrorfIsPrintedOnce(t *testing.T) {
	var stderr bytes.Buffer
	err := prog.UsageErrorf(&stderr, "--limit must be at least %d", 1)
	if got := prog.ExitCode(err, &stderr); got != 2 {
		t.Errorf("exit code = %d; want 2", got)
	}
	if got, want := stderr.String(), "postern-x: --limit must be at least 1\n"; got != want {
		t.Errorf("stderr = %q; want %q", got, want)
	}
}
