package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	gliderssh "github.com/gliderlabs/ssh"

	"github.com/postern-dev/postern/hostagent"
)

// shutdownGrace is how long serve lets running sessions finish after SIGTERM before it cuts
// the connections (the commands themselves keep running under their shims).
const shutdownGrace = 10 * time.Second

// ServeCommand runs the SSH server until its context is cancelled.
type ServeCommand struct {
	Stdout, Stderr io.Writer
	// Handler runs validated work; nil means notWiredHandler.
	Handler hostagent.Handler
}

func (c *ServeCommand) Usage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "usage: postern-hostagent serve --config FILE [--listen ADDR] [--data-dir DIR]\n\nflags (override the config file):\n")
	fs.PrintDefaults()
}

func (c *ServeCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(c.Stderr)
	configPath := fs.String("config", hostagent.DefaultConfigPath, "config file (TOML)")
	listen := fs.String("listen", "", "address to listen on, overrides listen")
	dataDir := fs.String("data-dir", "", "data directory, overrides data_dir")
	fs.Usage = func() { c.Usage(fs) }
	if err := parseFlags(fs, args); err != nil {
		return err
	}

	cfg, err := hostagent.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *dataDir != "" {
		cfg.DataDir = *dataDir
	}
	logger := slog.New(slog.NewTextHandler(c.Stderr, nil)).With("component", "hostagent")
	handler := c.Handler
	if handler == nil {
		handler = notWiredHandler{}
	}
	srv, err := hostagent.NewServer(cfg, handler, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		srv.Close()
		return fmt.Errorf("listen: %w", err)
	}
	fmt.Fprintf(c.Stdout, "listening on %s, host key %s\n", ln.Addr(), srv.HostKeyFingerprint())

	// Serve until the signal; then let running sessions finish for a while.
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx, ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	if serr := <-served; serr != nil {
		err = errors.Join(err, serr)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		logger.Warn("sessions cut off at shutdown", "grace", shutdownGrace)
		return nil
	}
	return err
}

// notWiredHandler refuses everything; it stands in until the executor is connected.
type notWiredHandler struct{}

func (notWiredHandler) Exec(_ context.Context, s gliderssh.Session, _ hostagent.ExecRequest) {
	io.WriteString(s.Stderr(), "postern: executor not wired\n")
	s.Exit(255)
}

func (notWiredHandler) Control(_ context.Context, s gliderssh.Session, _ hostagent.Account) {
	io.WriteString(s.Stderr(), "postern: executor not wired\n")
	s.Exit(255)
}
