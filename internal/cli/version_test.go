package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/version"
)

func TestVersionCommand(t *testing.T) {
	run := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := (&VersionCommand{Name: "postern-x", Stdout: &stdout, Stderr: &stderr}).Run(context.Background(), args)
		return stdout.String(), err
	}
	if out, err := run(); err != nil || out != version.Line("postern-x")+"\n" {
		t.Errorf("version = %q, %v; want %q", out, err, version.Line("postern-x")+"\n")
	}
	out, err := run("--json")
	var got version.Info
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got != version.Get() {
		t.Errorf("version --json = %q, %v; want %+v as JSON", out, err, version.Get())
	}
	if _, err := run("extra"); !errors.Is(err, ErrUsage) {
		t.Errorf("version extra: err = %v; want a usage error", err)
	}
	if !strings.HasPrefix(version.Line("postern-x"), "postern-x ") {
		t.Errorf("Line = %q; want the name first", version.Line("postern-x"))
	}
}

func TestIsVersionFlag(t *testing.T) {
	for arg, want := range map[string]bool{"--version": true, "-version": true, "version": false, "-v": false, "--versions": false} {
		if got := IsVersionFlag(arg); got != want {
			t.Errorf("IsVersionFlag(%q) = %v; want %v", arg, got, want)
		}
	}
}
