package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/journal"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/dirlock"
	"github.com/postern-dev/postern/internal/privdir"
)

// `postern journal backup` and `restore` (docs/operations.md, "Backup and restore"): the
// backup's format and its checks are bastion/journal's; this is where it is read from and
// what is said.

func (c *journalCommand) backup(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("journal backup DIR [flags]")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	dir, err := filepath.Abs(pos[0])
	if err != nil {
		return err
	}
	start := time.Now()
	m, err := journal.WriteBackup(cfg, dir, start, func(jdir string) (string, error) {
		err := fetchBackup(ctx, cfg, jdir)
		if err == nil {
			return "the running bastion", nil
		}
		if !errors.Is(err, errBastionDown) {
			return "", err
		}
		// Nothing serves the operator socket: read the journal here (a Pebble journal is
		// locked while it is open, so no bastion starts on it meanwhile).
		src := "the journal files in " + cfg.JournalDir()
		if cfg.Journal.Etcd() {
			src = "etcd under " + etcdPrefix(cfg)
		}
		fmt.Fprintf(c.stderr, "note: %v; reading %s directly\n", err, src)
		jl, err := journal.OpenReadOnly(cfg, quiet)
		if err != nil {
			return "", err
		}
		return src, errors.Join(journal.Snapshot(jl, jdir), jl.Close())
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "backed up the journal from %s to %s in %s: events 1..%d (sealed through %d), verified PASS, export sha256 %s; with %s\n",
		m.Source, dir, time.Since(start).Round(time.Millisecond), m.Head.Seq, m.Sealed, m.ExportSHA256, strings.Join(m.StateFiles, ", "))
	fmt.Fprintln(c.stdout, "it holds the bastion's keys: keep it as you keep the state dir")
	return nil
}

// fetchBackup has the running bastion take a snapshot of its journal and extracts it into
// dir.
func fetchBackup(ctx context.Context, cfg config.Config, dir string) error {
	resp, err := newOperatorClient(cfg.OperatorSocketPath()).do(ctx, "/v1/journal/backup", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return journal.ExtractTar(resp.Body, dir)
}

func etcdPrefix(cfg config.Config) string {
	if cfg.Journal.Prefix == "" {
		return "/postern/"
	}
	return cfg.Journal.Prefix
}

func (c *journalCommand) restore(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("journal restore DIR [--replace] [flags]")
	replace := fs.Bool("replace", false, "replace the journal and the state files that are there (a Pebble journal and files are set aside, an etcd prefix is cleared)")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	m, err := journal.ReadBackup(pos[0])
	if err != nil {
		return err
	}
	// No bastion may run on the state dir meanwhile (on etcd, Restore also refuses while a
	// replica serves the prefix).
	if err := privdir.Ensure(cfg.StateDir, "state dir", quiet); err != nil {
		return err
	}
	lock, err := dirlock.Acquire(cfg.StateDir)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("a postern runs on %s (%v): stop it first — a restore replaces the journal under it", cfg.StateDir, err)
	}
	if err != nil {
		return err
	}
	defer lock.Release()
	say := func(s string) { fmt.Fprintln(c.stdout, s) }
	if err := journal.Restore(ctx, cfg, pos[0], m, *replace, time.Now(), say); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "restored the backup taken %s (%s ago) from %s: events 1..%d, and the restored journal's export is the backup's (sha256 %s)\n",
		cli.FormatTime(m.CreatedAt), time.Since(m.CreatedAt).Round(time.Second), m.Source, m.Head.Seq, m.ExportSHA256)
	fmt.Fprintln(c.stdout, "the hosts may have run commands since it was taken: before starting the bastion, run `postern recover --from-hosts` (it lists them; --confirm journals them for your review), then start it")
	return nil
}
