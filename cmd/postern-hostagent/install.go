package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/cli"
)

// InstallCommand writes the config, host key and systemd unit under --root.
type InstallCommand struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

func (c *InstallCommand) Usage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "usage: postern-hostagent install [--root DIR] [--listen ADDR] [--read-write PATH]… [--trusted-user-ca FILE]\n\nflags:\n")
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
	caFile := fs.String("trusted-user-ca", "", "a file of the CA lines `postern ca keys` prints on a bastion with [ssh_ca]: a new config trusts them and authorizes no key (\"-\": read them from stdin)")
	fs.Usage = func() { c.Usage(fs) }
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *caFile != "" {
		var err error
		if opts.TrustedUserCAKeys, err = readCAFile(*caFile, c.Stdin); err != nil {
			return err
		}
	}
	return hostagent.Install(opts, c.Stdout)
}

// maxCAFileBytes bounds the CA lines install reads: a few keys of ~100 bytes each.
const maxCAFileBytes = 64 << 10

// readCAFile reads the CA lines from path, or stdin for "-".
func readCAFile(path string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--trusted-user-ca: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxCAFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--trusted-user-ca: %w", err)
	}
	if len(data) > maxCAFileBytes {
		return nil, fmt.Errorf("--trusted-user-ca: larger than %d bytes", maxCAFileBytes)
	}
	return data, nil
}
