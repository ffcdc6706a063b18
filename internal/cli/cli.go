// Package cli holds what Postern's two CLIs (postern, postern-hostagent) share: how a binary
// runs a command line (Program), its flag sets, subcommand groups and usage errors, how
// errors become exit statuses (0 success or -h, 2 usage, 1 anything else), and the printers
// of records, tables and outcomes (print.go), which escape terminal control characters in
// everything they print.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"
)

// ErrUsage marks errors caused by how a command was invoked (exit status 2).
var ErrUsage = errors.New("usage error")

// Program is a binary's name ("postern"), which begins its usage lines and its messages.
type Program string

// Main runs a command line: run gets a context that SIGINT and SIGTERM cancel, and its error
// becomes the exit status (see ExitCode).
func (p Program) Main(run func(ctx context.Context) error, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx)
	stop()
	return p.ExitCode(err, stderr)
}

// ExitStatus is an error whose command already printed what it means and chose its exit
// status (`postern policy check`: the decision).
type ExitStatus interface {
	error
	ExitStatus() int
}

// ExitCode maps a command's error to its exit status, printing other errors as "name: err"
// (usage errors were printed where they arose, and so was what an ExitStatus means).
func (p Program) ExitCode(err error, stderr io.Writer) int {
	var es ExitStatus
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	case errors.As(err, &es):
		return es.ExitStatus()
	default:
		fmt.Fprintf(stderr, "%s: %v\n", p, err)
		return 1
	}
}

// UsageErrorf prints what is wrong with the invocation as "name: message" (ExitCode prints
// nothing for usage errors) and returns it as an ErrUsage.
func (p Program) UsageErrorf(stderr io.Writer, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(stderr, "%s: %s\n", p, msg)
	return fmt.Errorf("%w: %s", ErrUsage, msg)
}

// FlagSet returns a flag set reporting to stderr whose -h prints "usage: name usage" and the
// flags; usage is the command line after the binary's name ("executions show ID [flags]").
func (p Program) FlagSet(usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(string(p)+" "+usage, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s %s\n\nflags:\n", p, usage)
		fs.PrintDefaults()
	}
	return fs
}

// Subcommands maps a group's subcommand names to their runners.
type Subcommands map[string]func(ctx context.Context, args []string) error

// Dispatch runs the subcommand of group that args[0] names. With no subcommand or an unknown
// one it prints usage on stderr and returns ErrUsage; help, -h and --help print it on stdout.
func (p Program) Dispatch(ctx context.Context, group, usage string, subs Subcommands, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	sub, ok := subs[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s %s: unknown subcommand %q\n\n%s", p, group, args[0], usage)
		return ErrUsage
	}
	return sub(ctx, args[1:])
}

// ParseFlags parses args, turning flag errors into ErrUsage (the flag package has already
// printed the message and usage). Positional arguments are left in fs.Args(): for a group
// whose flags come before its subcommand. A command parses with ParseArgs.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return nil
}

// ParseArgs parses flags that may come before or after the positional arguments and returns
// the positional ones, of which there must be exactly n: other counts are usage errors,
// printed with the usage.
func ParseArgs(fs *flag.FlagSet, args []string, n int) ([]string, error) {
	var positional []string
	for {
		if err := ParseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != n {
		if n == 0 {
			fmt.Fprintf(fs.Output(), "unexpected arguments: %q\n", positional)
		} else {
			fmt.Fprintf(fs.Output(), "want %d argument(s), got %q\n", n, positional)
		}
		fs.Usage()
		return nil, ErrUsage
	}
	return positional, nil
}
