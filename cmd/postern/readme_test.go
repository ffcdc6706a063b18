package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
)

// TestREADMECommandsParse: every `postern …` command the README shows (its shell blocks and
// whole inline commands) is one this binary accepts.
func TestREADMECommandsParse(t *testing.T) {
	testutil.CheckREADMECommands(t, "postern", func(args []string) (int, string) {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
		return prog.ExitCode(err, &stderr), stderr.String()
	})
}

// TestREADMEPathsExist: every file or directory of this repository the README names is in it.
func TestREADMEPathsExist(t *testing.T) {
	root, _ := testutil.README(t)
	paths := testutil.READMEPaths(t)
	if len(paths) < 10 {
		t.Fatalf("found only %d repository paths in the README: %q", len(paths), paths)
	}
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("README names %s, which is not in the repository", p)
		}
	}
}
