package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
)

// TestDocCommandsParse: every `postern-hostagent …` command README.md and docs/*.md show is
// one this binary accepts.
func TestDocCommandsParse(t *testing.T) {
	testutil.CheckDocCommands(t, "postern-hostagent", 15, func(args []string) (int, string) {
		if args[0] == "shim" { // the supervisor's entry (main runs it before any flag parsing)
			return 0, ""
		}
		if args[0] == "marker" { // positional only, no flags: as shown, outside a command it
			args = args[:len(args)-1] // fails for want of POSTERN_EXECUTION_ID, not for usage
		}
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		return prog.ExitCode(err, &stderr), stderr.String()
	})
}
