package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/cli"
)

// InstallCommand writes the config, host key and systemd unit under --root.
type InstallCommand struct {
	Stdout, Stderr io.Writer
}

func (c *InstallCommand) Usage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "usage: postern-hostagent install [--root DIR] [--listen ADDR] [--read-write PATH]…\n\nflags:\n")
	fs.PrintDefaults()
}

func (c *InstallCommand) Run(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(c.Stderr)
	var opts hostagent.InstallOptions
	fs.StringVar(&opts.Root, "root", "/", "a staging root (an image, a chroot): every file is written under it at the path it has on the machine that root becomes, and the config and unit name that machine's paths")
	fs.StringVar(&opts.ConfigPath, "config", hostagent.DefaultConfigPath, "config file to create (kept if it exists)")
	fs.StringVar(&opts.UnitPath, "unit", hostagent.DefaultUnitPath, "systemd unit to write")
	fs.StringVar(&opts.BinaryPath, "binary", hostagent.DefaultBinaryPath, "hostagent binary the unit runs")
	fs.StringVar(&opts.Listen, "listen", "", "listen address for a new config (default "+hostagent.DefaultConfig().Listen+")")
	fs.Func("read-write", "extra path commands may write (repeatable; the unit sets ProtectSystem=strict)", func(p string) error {
		opts.ReadWritePaths = append(opts.ReadWritePaths, strings.TrimSpace(p))
		return nil
	})
	fs.Usage = func() { c.Usage(fs) }
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	return hostagent.Install(opts, c.Stdout)
}
