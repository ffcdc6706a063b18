// Command postern-hostagent is the Postern agent on a fleet machine: `serve` runs the SSH
// server (`reload` makes it re-read its config), `install` sets it up under systemd.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/cli"
)

// prog names this binary in its usage lines and messages.
const prog = cli.Program("postern-hostagent")

const mainUsage = `usage: postern-hostagent COMMAND [flags]

commands:
  serve     run the SSH server
  reload    make the running agent re-read its config (as SIGHUP does)
  install   write the config, host key and systemd unit
  markers   list, show, tail and verify the markers on this host
  marker    (from a running command) record a checkpoint on its own marker
  version   print the build (module version, VCS revision, toolchain); also --version

Run 'postern-hostagent COMMAND -h' for a command's flags.
`

func main() {
	if supervisor.Invoked(os.Args) {
		// Re-executed by the executor as the per-host supervisor when postern-supervisor is
		// not next to it (not for people); before any signal handling of ours, which the
		// supervisor sets up itself.
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	os.Exit(prog.Main(func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) }, os.Stderr))
}

// run dispatches to a subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return cli.ErrUsage
	}
	if len(args) == 1 && cli.IsVersionFlag(args[0]) {
		args = []string{"version"}
	}
	switch args[0] {
	case "version":
		return (&cli.VersionCommand{Name: string(prog), Stdout: stdout, Stderr: stderr}).Run(ctx, args[1:])
	case "serve":
		return (&ServeCommand{Stdout: stdout, Stderr: stderr}).Run(ctx, args[1:])
	case "reload":
		return (&ReloadCommand{Stdout: stdout, Stderr: stderr}).Run(ctx, args[1:])
	case "install":
		return (&InstallCommand{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr}).Run(ctx, args[1:])
	case "markers":
		return (&MarkersCommand{Stdout: stdout, Stderr: stderr}).Run(ctx, args[1:])
	case "marker":
		return (&MarkerCommand{Stdout: stdout, Stderr: stderr}).Run(ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(stdout, mainUsage+"\n"+ruleHelp())
		return nil
	default:
		fmt.Fprintf(stderr, "postern-hostagent: unknown command %q\n\n%s", args[0], mainUsage)
		return cli.ErrUsage
	}
}
