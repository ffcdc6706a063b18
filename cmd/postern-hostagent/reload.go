package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/cli"
)

// ReloadCommand asks the running agent to re-read its config file (as SIGHUP does) and says
// what changed, or why nothing did.
type ReloadCommand struct {
	Stdout, Stderr io.Writer
}

func (c *ReloadCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	fs.SetOutput(c.Stderr)
	var af agentFlags
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: postern-hostagent reload [--config FILE] [--data-dir DIR] [--socket PATH]

The running agent re-reads the config file it was started with (as on SIGHUP), checks all of
it, and applies what may change without a restart: keys, accounts, the environment
allowlist, the request limits. A file with a problem, or one that changes a setting only a
restart applies (listen, data_dir, host_key_file, …), changes nothing: the command says why
and exits 1. Connections whose key is no longer authorized are closed; their commands go on.

flags:
`)
		fs.PrintDefaults()
	}
	af.register(fs)
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	// A config with problems is the running agent's to judge (and log): only the socket is
	// needed here, and the keys that did decode name it.
	cfg, found, err := findAgent(af.config, af.dataDir)
	if err != nil && !hostagent.IsConfigProblem(err) {
		return err
	}
	af.found(cfg, found)
	agent, err := hostproto.DialLocalControl(ctx, af.socket)
	if err != nil {
		if agentDown(err) {
			return fmt.Errorf("no hostagent listens on %s (%s): nothing to reload — serve reads the config when it starts", af.socket, af.where)
		}
		return err
	}
	defer agent.Close()
	res, err := agent.Reload(ctx)
	var ce *hostproto.ControlError
	switch {
	case errors.As(err, &ce) && ce.Code == hostproto.CodeReloadRefused:
		return errors.New(ce.Message)
	case errors.Is(err, hostproto.ErrBadControlRequest) && strings.Contains(err.Error(), "unknown op"):
		return fmt.Errorf("the hostagent on %s is of a release without reload: restart it to apply its config", af.socket)
	case err != nil:
		return fmt.Errorf("reload through %s: %w", af.socket, err)
	}
	if len(res.Changed) == 0 {
		fmt.Fprintf(c.Stdout, "reloaded %s: nothing changed\n", res.Config)
		return nil
	}
	fmt.Fprintf(c.Stdout, "reloaded %s: changed %s\n", res.Config, strings.Join(res.Changed, ", "))
	return nil
}
