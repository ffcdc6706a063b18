package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/internal/cli"
)

func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var loc locator
	loc.register(fs)
	listen := fs.String("listen", "", "Streamable HTTP address, overrides listen (\"off\" disables HTTP)")
	hold := fs.Bool("hold", false, holdUsage)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: postern serve [--config FILE] [--state-dir DIR] [--listen ADDR] [--hold]\n\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\n"+ruleHelp())
	}
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loc.config()
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return err
	}
	switch *listen {
	case "":
	case "off":
		cfg.Listen = ""
	default:
		cfg.Listen = *listen
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	logger.Info("found the bastion", "where", loc.where())
	claim, err := claimStateDir(cfg.StateDir, "--state-dir", logger)
	if err != nil {
		return err
	}
	defer claim.release()
	b, err := bastion.Open(bastion.Options{Config: cfg, Logger: logger, Hold: *hold})
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Recover(ctx); err != nil {
		return err
	}
	return portHint(b.Serve(ctx, func(ep bastion.Endpoints) {
		claim.markServing()
		fmt.Fprintf(stdout, "postern: serving MCP at %s and %s (operator socket %s)\n", orNone(ep.URL), ep.Socket, ep.OperatorSocket)
		if *hold {
			fmt.Fprint(stdout, heldNote)
		}
	}), "pass --listen ADDR (or set listen in the config) to use another")
}

// holdUsage is the --hold flag of serve and up.
const holdUsage = "start with nothing sent: executions in flight are not reconciled, new calls and approvals are refused; look (postern status, investigate), deny or review, then restart without --hold"

// heldNote is what a held daemon says once it serves.
const heldNote = "postern: held — nothing is reconciled or sent; `postern status` shows what a start without --hold will do\n"

func orNone(s string) string {
	if s == "" {
		return "(HTTP disabled)"
	}
	return s
}
