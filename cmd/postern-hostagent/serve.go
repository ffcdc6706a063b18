package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/dirlock"
	"github.com/postern-dev/postern/internal/privdir"
)

// shutdownGrace is how long serve lets running sessions finish after SIGTERM before it cuts
// the connections (the commands themselves keep running under the per-host supervisor).
const shutdownGrace = 10 * time.Second

// ServeCommand runs the hostagent until its context is cancelled.
type ServeCommand struct {
	Stdout, Stderr io.Writer
}

func (c *ServeCommand) Usage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "usage: postern-hostagent serve [--config FILE] [--listen ADDR] [--data-dir DIR]\n\nflags (override the config file):\n")
	fs.PrintDefaults()
	fmt.Fprint(fs.Output(), "\n"+ruleHelp()+"serve needs a config file: postern-hostagent install writes one.\n")
}

func (c *ServeCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(c.Stderr)
	configPath := fs.String("config", "", "config file (TOML; else $"+envConfig+", else "+hostagent.DefaultConfigPath+")")
	listen := fs.String("listen", "", "address to listen on, overrides listen")
	dataDir := fs.String("data-dir", "", "data directory, overrides data_dir")
	fs.Usage = func() { c.Usage(fs) }
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}

	// SIGHUP reloads the config (below); caught from the start, so that one sent while the
	// agent starts does not end it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	_, found, err := findAgent(*configPath, *dataDir)
	if err != nil && !hostagent.IsConfigProblem(err) {
		return err
	}
	if found.Config == "" {
		return fmt.Errorf("no hostagent config to serve (%s): postern-hostagent install writes one, or pass --config FILE", found.Why())
	}
	// A reload reads the same file again with the same overrides: the rule is not applied
	// anew, so a file that appeared since cannot take the running agent elsewhere.
	load := func(data []byte) (hostagent.Config, error) {
		cfg, err := hostagent.ParseConfig(bytes.NewReader(data))
		if err != nil {
			err = fmt.Errorf("%s: %w", found.Config, err)
			if !hostagent.IsConfigProblem(err) {
				return cfg, err
			}
		}
		if found.Dir != "" {
			cfg.DataDir = found.Dir
		}
		if *listen != "" {
			cfg.Listen = *listen
		}
		// Every problem at once: the keys that did not decode and what Validate finds in the rest.
		return cfg, errors.Join(err, cfg.Validate())
	}
	data, err := os.ReadFile(found.Config)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cfg, err := load(data)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(c.Stderr, nil)).With("component", "hostagent")
	lock, err := lockDataDir(cfg.DataDir, logger)
	if err != nil {
		return err
	}
	defer lock.Release()
	if hostagent.AuthorizedKeyCount(cfg) == 0 {
		fix := "append the line `postern hosts key` prints on the bastion to " + keysPlace(cfg)
		if cfg.TrustedUserCAKeysFile != "" {
			// A bastion with [ssh_ca] needs its CA trusted, and no key authorized.
			fix += ", or for a bastion with [ssh_ca] put the lines `postern ca keys` prints in " + cfg.TrustedUserCAKeysFile
		}
		logger.Warn("no authorized keys: nobody can log in, not even the bastion, until a key is added (the files are re-read at every login): "+fix,
			"authorized_keys_file", cfg.AuthorizedKeysFile, "authorized_keys_dir", cfg.AuthorizedKeysDir, "trusted_user_ca_keys_file", cfg.TrustedUserCAKeysFile)
	}
	agent, err := hostagent.OpenAgent(ctx, cfg, hostagent.AgentOptions{
		Logger: logger, ConfigFile: found.Config, ConfigDigest: hostagent.ConfigDigest(data), Load: load,
	})
	if err != nil {
		return err
	}
	defer agent.Close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	reloadCtx, stopReloads := context.WithCancel(ctx)
	var reloads sync.WaitGroup
	defer reloads.Wait()
	defer stopReloads()
	reloads.Go(func() {
		for {
			select {
			case <-reloadCtx.Done():
				return
			case <-hup:
				agent.Reload(reloadCtx, "signal:SIGHUP") // logs what it did, or why it did nothing
			}
		}
	})
	fmt.Fprintf(c.Stdout, "listening on %s, host key %s\n", ln.Addr(), agent.HostKeyFingerprint())
	return agent.Serve(ctx, ln, shutdownGrace)
}

// lockDataDir keeps a second agent out of a data dir in use, naming the pid that holds it
// instead of the store's "resource temporarily unavailable". The dir is made private first
// (privdir, as the agent does at every start), so nothing is written into one another user
// could tamper with.
func lockDataDir(dir string, logger *slog.Logger) (*dirlock.Lock, error) {
	if err := privdir.Ensure(dir, "data dir", logger); err != nil {
		return nil, err
	}
	lock, err := dirlock.Acquire(dir)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("data dir %w — a postern-hostagent is already running on it: stop it, or pass another --data-dir", err)
	}
	return lock, err
}

// keysPlace is where an operator adds the bastion's key.
func keysPlace(cfg hostagent.Config) string {
	switch {
	case cfg.AuthorizedKeysFile != "":
		return cfg.AuthorizedKeysFile
	case cfg.AuthorizedKeysDir != "":
		return cfg.AuthorizedKeysDir + "/<account>"
	}
	return "an authorized keys file (or sign its key with the CA of " + cfg.TrustedUserCAKeysFile + ")"
}
