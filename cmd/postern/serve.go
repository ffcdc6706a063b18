package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/cli"
)

// defaultConfigPath is where `postern serve` looks for its configuration.
const defaultConfigPath = "/etc/postern/postern.toml"

// defaultStateDir is the per-user state dir of `postern up` and of the operator commands:
// $XDG_STATE_HOME/postern, else ~/.local/state/postern.
func defaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "postern")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "postern")
	}
	return "/var/lib/postern"
}

func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", defaultConfigPath, "config file (TOML)")
	stateDir := fs.String("state-dir", "", "state dir, overrides state_dir")
	listen := fs.String("listen", "", "Streamable HTTP address, overrides listen (\"off\" disables HTTP)")
	hold := fs.Bool("hold", false, holdUsage)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: postern serve [--config FILE] [--state-dir DIR] [--listen ADDR] [--hold]\n\n")
		fs.PrintDefaults()
	}
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loadConfig(*configPath, *stateDir)
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

// loadConfig reads the config file; with none at the default path and a state dir given,
// the defaults apply.
func loadConfig(path, stateDir string) (config.Config, error) {
	cfg, err := config.LoadConfig(path)
	if errors.Is(err, os.ErrNotExist) && path == defaultConfigPath && stateDir != "" {
		cfg, err = config.DefaultConfig(stateDir), nil
	}
	if err != nil {
		return config.Config{}, err
	}
	if stateDir != "" {
		cfg.StateDir = stateDir
	}
	return cfg, cfg.Validate()
}

func orNone(s string) string {
	if s == "" {
		return "(HTTP disabled)"
	}
	return s
}
