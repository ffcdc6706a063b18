package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/cli"
)

// mcpCommand is the stdio MCP server that clients such as Claude Desktop and Claude Code
// launch: it forwards every message to the running bastion's unix socket, where the kernel
// names the caller: the bridge names its parent, the agent, and the daemon checks that claim
// against /proc, so any build or version of this binary gives one agent process one intent
// scope. The journal has one owner, the daemon; the bridge holds no state but an approval
// question it is asking its client (elicitation: the daemon's socket is stateless, the
// client's stdio session is not).
func mcpCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "the bastion's MCP socket (default its config's socket, <state-dir>/mcp.sock)")
	var loc locator
	loc.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: postern mcp [--socket PATH | --state-dir DIR | --config FILE]\n\nSpeaks MCP on stdin/stdout; a running `postern serve` or `postern up` does the work.\n\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\n"+ruleHelp())
	}
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	path := *socket
	if path == "" {
		cfg, err := loc.config()
		if err != nil {
			return err
		}
		path = cfg.SocketPath()
	}
	if _, err := transport.BridgeParentClaim(); err != nil {
		fmt.Fprintf(stderr, "postern mcp: warning: %v; this bridge is its own agent, so a call re-issued through another bridge is a new intent\n", err)
	}
	err := transport.Bridge(ctx, path, bastion.MCPPath, stdin, stdout)
	if errors.Is(err, transport.ErrDaemonNotRunning) && loc.where() != "" {
		err = fmt.Errorf("%w (%s)", err, loc.where())
	}
	return err
}
