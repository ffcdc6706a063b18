// Package cli holds what Postern's two CLIs (postern, postern-hostagent) share: how flag and
// usage errors become exit statuses (0 success or -h, 2 usage, 1 anything else), and the
// printers of records, tables and outcomes (print.go), which escape terminal control
// characters in everything they print.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage marks errors caused by how a command was invoked (exit status 2).
var ErrUsage = errors.New("usage error")

// ExitCode maps a command's error to its exit status, printing other errors as "name: err".
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}

// ParseFlags parses args, turning flag errors into ErrUsage (the flag package has already
// printed the message and usage). Positional arguments are left in fs.Args().
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return nil
}
