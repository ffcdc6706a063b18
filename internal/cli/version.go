package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/postern-dev/postern/internal/version"
)

// IsVersionFlag reports whether arg is the --version flag (or -version, as the flag package
// accepts every flag with one dash or two). Every binary takes it as its only argument.
func IsVersionFlag(arg string) bool { return arg == "--version" || arg == "-version" }

// VersionCommand is `NAME version [--json]` (and `NAME --version`): the binary's build, from
// internal/version.
type VersionCommand struct {
	// Name is the binary's name, printed first.
	Name           string
	Stdout, Stderr io.Writer
}

func (c *VersionCommand) Run(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(c.Stderr)
	asJSON := fs.Bool("json", false, "print the build as JSON (module, revision, modified, go)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s version [--json]\n\n", c.Name)
		fs.PrintDefaults()
	}
	if _, err := ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(c.Stdout).Encode(version.Get())
	}
	_, err := fmt.Fprintln(c.Stdout, version.Line(c.Name))
	return err
}
