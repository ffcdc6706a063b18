// Command postern is the Postern bastion and its operator CLI: `serve` runs the MCP server,
// `up` runs a bastion and a local hostagent on a fresh machine, `mcp` bridges stdio MCP
// clients to the running daemon, and the rest read the journal and the hosts through the
// daemon's operator socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/cli"
)

// errUsage marks errors caused by how the command was invoked (exit status 2).
var errUsage = cli.ErrUsage

const mainUsage = `usage: postern COMMAND [flags]

commands:
  up          start a bastion and a local hostagent with generated keys (quick start)
  serve       run the bastion (MCP over HTTP and a unix socket, operator API)
  mcp         stdio MCP server for clients that launch one (bridges to the running bastion)
  executions  list and show executions from the journal
  investigate answer the five questions about a retried call (who, authorized, outcome,
              delivery, later calls)
  runs        list and show agent runs (the process or token behind each intent scope)
  markers     list and show the markers on a host (asks its hostagent)
  hosts       list and enroll hosts
  audit       export and verify the journal's hash-chained event log
  journal     copy the journal between Pebble and etcd (a single node into replicas, and back)
  approvals   list executions awaiting approval; approve ID, deny ID --reason
  review      record what an operator verified about an unknown outcome
  policy      check: which rule decides a call, without running it
  doctor      check config, permissions, keys, the daemon, its port and every host, with fixes
  token       make a bearer token for an actor and print its config hash
  version     print the build (module version, VCS revision, toolchain); also --version

Run 'postern COMMAND -h' for a command's flags.
`

func main() {
	if supervisor.Invoked(os.Args) {
		// `postern up` runs a hostagent in this process, whose executor re-executes this
		// binary as the per-host supervisor (not for people).
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// run dispatches to a subcommand.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return errUsage
	}
	if len(args) == 1 && cli.IsVersionFlag(args[0]) {
		args = []string{"version"}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serveCommand(ctx, rest, stdout, stderr)
	case "up":
		return upCommand(ctx, rest, stdout, stderr)
	case "mcp":
		return mcpCommand(ctx, rest, stdin, stdout, stderr)
	case "version":
		return (&cli.VersionCommand{Name: "postern", Stdout: stdout, Stderr: stderr}).Run(ctx, rest)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, mainUsage)
		return nil
	}
	if op, ok := operatorCommands[cmd]; ok {
		return op(ctx, rest, stdin, stdout, stderr)
	}
	fmt.Fprintf(stderr, "postern: unknown command %q\n\n%s", cmd, mainUsage)
	return errUsage
}

// operatorCommands are the read and enrollment commands (operator.go and friends).
var operatorCommands = map[string]func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error{}

func exitCode(err error, stderr io.Writer) int { return cli.ExitCode("postern", err, stderr) }

// parseFlags is cli.ParseFlags: positional arguments are left in fs.Args().
func parseFlags(fs *flag.FlagSet, args []string) error { return cli.ParseFlags(fs, args) }
