package main

import (
	"context"
	"fmt"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
)

// reloadCommand is `postern reload`: the running daemon reads its config file again and
// applies what a reload may change (as SIGHUP does), or refuses and changes nothing.
type reloadCommand struct{ operatorIO }

const reloadUsage = `The running bastion reads its config file again (the one it started with) and applies
actors, principals, rules, classes, approvals.operators, approval_timeout, default_wait,
max_wait, max_command_bytes and max_request_body_bytes to new calls; executions already
accepted keep their decisions. The whole file is checked first: a config that does not load,
or that changes a setting only a restart applies (listen, state_dir, journal, …), changes
nothing and the error says why. Each change is logged to <state dir>/reloads.jsonl (who,
when, the file's digest, what changed) before it applies. Sending the daemon SIGHUP does
the same.
`

func (c *reloadCommand) Run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("reload [flags]")
	flagsUsage := fs.Usage
	fs.Usage = func() { flagsUsage(); fmt.Fprint(fs.Output(), "\n"+reloadUsage) }
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	// The CLI reads the same file to find the daemon's socket: a file that does not load
	// stops here, and the daemon never sees it.
	op, err := loc.operator(c.stderr)
	if err != nil {
		return fmt.Errorf("%w\nNothing was reloaded: the running bastion keeps its config. Fix the file, then run postern reload again", err)
	}
	var change api.ConfigChange
	if err := op.postJSON(ctx, "/v1/reload", struct{}{}, &change); err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, change)
	}
	for _, w := range change.Warnings {
		fmt.Fprintf(c.stderr, "postern: warning: %s\n", w)
	}
	if len(change.Changes) == 0 {
		fmt.Fprintf(c.stdout, "Reloaded %s: nothing a reload applies has changed.\n", digestText(change.Digest))
		return nil
	}
	fmt.Fprintf(c.stdout, "Reloaded %s (was %s); new calls see:\n", digestText(change.Digest), digestText(change.Previous))
	for _, line := range change.Changes {
		fmt.Fprintf(c.stdout, "  %s\n", line)
	}
	return nil
}
