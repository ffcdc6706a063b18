// Command postern is the Postern bastion and its operator CLI: `serve` runs the MCP server,
// `up` runs a bastion and a local hostagent on a fresh machine, `mcp` bridges stdio MCP
// clients to the running daemon, and the rest read the journal and the hosts through the
// daemon's operator socket.
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
const prog = cli.Program("postern")

const mainUsage = `usage: postern COMMAND [flags]

commands:
  up          start a bastion and a local hostagent with generated keys (quick start)
  serve       run the bastion (MCP over HTTP and a unix socket, operator API)
  mcp         stdio MCP server for clients that launch one (bridges to the running bastion)
  status      what runs, what is in flight, what waits for you — start here when
              something went wrong (works with the daemon down)
  executions  list and show executions from the journal
  investigate answer the five questions about a retried call (who, authorized, outcome,
              delivery, later calls)
  runs        list and show agent runs (the process or token behind each intent scope)
  markers     list and show the markers on a host (asks its hostagent)
  hosts       list and enroll hosts
  fleet       run one command on many hosts under a rollout's brakes; show, cancel
  audit       export and verify the journal's hash-chained event log
  journal     back up and restore the journal; copy it between Pebble and etcd; run
              its retention pass (gc)
  recover     --from-hosts: after a lost or restored journal, what the hosts ran that it
              does not know (with the bastion down); --confirm journals it for review
  approvals   list executions awaiting approval; approve ID, deny ID --reason
  review      record what an operator verified about an unknown outcome
  policy      check: which rule decides a call, without running it
  reload      the running bastion applies its config file again (actors, rules, classes, …)
  doctor      check config, permissions, keys, the daemon, its port and every host, with fixes
  token       issue a bearer token for an actor (with an id and an expiry); list, revoke;
              --static prints a token for the config
  ca          the bastion's SSH certificate authority ([ssh_ca]): init, keys hosts
              trust, status, rotate, activate, retire
  version     print the build (module version, VCS revision, toolchain); also --version

Run 'postern COMMAND -h' for a command's flags.
`

func main() {
	if supervisor.Invoked(os.Args) {
		// `postern up` runs a hostagent in this process, whose executor re-executes this
		// binary as the per-host supervisor (not for people).
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	os.Exit(prog.Main(func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr) }, os.Stderr))
}

// run dispatches to a subcommand.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return cli.ErrUsage
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
		return (&cli.VersionCommand{Name: string(prog), Stdout: stdout, Stderr: stderr}).Run(ctx, rest)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, mainUsage+"\n"+ruleHelp())
		return nil
	}
	if newCommand, ok := operatorCommands[cmd]; ok {
		return newCommand(operatorIO{stdin, stdout, stderr}).Run(ctx, rest)
	}
	fmt.Fprintf(stderr, "postern: unknown command %q\n\n%s", cmd, mainUsage)
	return cli.ErrUsage
}

// operatorCommands make, for one invocation, the commands that read or change what the
// bastion owns (the journal, the hosts, its policy), mostly through its operator socket.
var operatorCommands = map[string]func(operatorIO) runner{
	"status":      func(o operatorIO) runner { return &statusCommand{o} },
	"executions":  func(o operatorIO) runner { return &executionsCommand{o} },
	"investigate": func(o operatorIO) runner { return &investigateCommand{o} },
	"runs":        func(o operatorIO) runner { return &runsCommand{o} },
	"markers":     func(o operatorIO) runner { return &markersCommand{operatorIO: o} },
	"hosts":       func(o operatorIO) runner { return &hostsCommand{o} },
	"fleet":       func(o operatorIO) runner { return &fleetCommand{o} },
	"audit":       func(o operatorIO) runner { return &auditCommand{o} },
	"journal":     func(o operatorIO) runner { return &journalCommand{o} },
	"recover":     func(o operatorIO) runner { return &recoverCommand{o} },
	"approvals":   func(o operatorIO) runner { return &approvalsCommand{o} },
	"approve":     func(o operatorIO) runner { return &decideCommand{o, "approve"} },
	"deny":        func(o operatorIO) runner { return &decideCommand{o, "deny"} },
	"review":      func(o operatorIO) runner { return &reviewCommand{o} },
	"policy":      func(o operatorIO) runner { return &policyCommand{o} },
	"doctor":      func(o operatorIO) runner { return &doctorCommand{o} },
	"reload":      func(o operatorIO) runner { return &reloadCommand{o} },
	"token":       func(o operatorIO) runner { return &tokenCommand{o} },
	"ca":          func(o operatorIO) runner { return &caCommand{o} },
}

// runner is a command made for one invocation.
type runner interface {
	Run(ctx context.Context, args []string) error
}
