package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/config"
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
	// load reads the config as this start does: a reload (postern reload, SIGHUP) calls it
	// again, with --listen over the file's as now.
	load := func() (config.Config, string, error) {
		cfg, digest, err := loc.configWithDigest()
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			return config.Config{}, "", err
		}
		switch *listen {
		case "":
		case "off":
			cfg.Listen = ""
		default:
			cfg.Listen = *listen
		}
		return cfg, digest, nil
	}
	cfg, digest, err := load()
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	logger.Info("found the bastion", "where", loc.where())
	claim, err := claimStateDir(cfg.StateDir, "--state-dir", logger)
	if err != nil {
		return err
	}
	defer claim.release()
	b, err := bastion.Open(bastion.Options{Config: cfg, Logger: logger, Hold: *hold, Load: load, ConfigDigest: digest})
	if err != nil {
		return err
	}
	defer b.Close()
	defer reloadOnHangup(ctx, b, logger)()
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

// reloadOnHangup reloads b's config on each SIGHUP (as postern reload does) until ctx ends or
// the returned stop is called, which waits for the handler to finish.
func reloadOnHangup(ctx context.Context, b *bastion.Bastion, logger *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				// Bastion.Reload logs what it applied; a refusal is logged here.
				if _, err := b.Reload("signal:SIGHUP"); err != nil {
					logger.Error("reload on SIGHUP refused; the config in force is unchanged", "err", err)
				}
			}
		}
	})
	return func() {
		signal.Stop(hup)
		cancel()
		wg.Wait()
	}
}
