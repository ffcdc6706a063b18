package main

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/journal"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// journalCommand moves a journal between its backends (a single node's Pebble journal to
// etcd, to grow it into replicas, and back), backs it up and restores it (backup.go), and
// runs its retention pass (journal_gc.go).
type journalCommand struct{ operatorIO }

const journalUsage = `usage: postern journal SUBCOMMAND [flags]

subcommands:
  copy --to etcd|pebble
                 copy the journal key for key: from the state dir's Pebble journal to the
                 [journal] etcd cluster and prefix of the config (--to etcd), or back into a
                 new Pebble journal in the state dir (--to pebble). Stop every bastion of the
                 journal first. The copy is checked: both exports must be identical.
  gc [--dry-run] [--archive FILE] [--json]
                 run the journal's retention pass now: through the running bastion, else
                 on the journal itself (etcd: only while no replica serves it). --dry-run
                 counts what it would remove; --archive first exports the journal to FILE.
  backup DIR     a consistent copy of the journal and the state files it needs, into the new
                 directory DIR (0700; files 0600): taken by the running bastion while it
                 serves, else read from the journal here. The copy is verified.
  restore DIR [--replace]
                 bring a backup back as the journal and state files of --state-dir/--config
                 (the bastion stopped). A journal or files that are there and differ are
                 replaced only with --replace (set aside; an etcd prefix is cleared).

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *journalCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "journal", journalUsage, cli.Subcommands{"copy": c.copy, "backup": c.backup, "restore": c.restore, "gc": c.gc}, args, c.stdout, c.stderr)
}

func (c *journalCommand) copy(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("journal copy --to etcd|pebble [flags]")
	to := fs.String("to", "", "the backend to copy to: etcd or pebble")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *to != "etcd" && *to != "pebble" {
		return prog.UsageErrorf(c.stderr, "--to etcd or --to pebble")
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if !cfg.Journal.Etcd() {
		return prog.UsageErrorf(c.stderr, "the config's [journal] must name the etcd cluster (backend = \"etcd\", endpoints): it is one end of the copy")
	}
	pebbleCfg := cfg
	pebbleCfg.Journal = config.Journal{}
	var n int
	var src, dst markers.JournalStore
	switch *to {
	case "etcd":
		if src, err = journal.OpenReadOnly(pebbleCfg, quiet); err != nil {
			return fmt.Errorf("open the Pebble journal %s: %w", cfg.JournalDir(), err)
		}
		defer src.Close()
		if dst, err = journal.OpenReadOnly(cfg, quiet); err != nil {
			return err
		}
		defer dst.Close()
		importer, ok := dst.(interface {
			Import(iter.Seq2[markers.KV, error]) (int, error)
		})
		if !ok {
			return errors.New("the etcd journal cannot import")
		}
		n, err = importer.Import(src.(markers.RawJournal).Raw())
	case "pebble":
		if src, err = journal.OpenReadOnly(cfg, quiet); err != nil {
			return err
		}
		defer src.Close()
		if n, err = markers.ImportRaw(cfg.JournalDir(), markers.Options{Graph: markers.JournalGraph, Logger: quiet}, src.(markers.RawJournal).Raw()); err != nil {
			return err
		}
		if dst, err = journal.OpenReadOnly(pebbleCfg, quiet); err != nil {
			return err
		}
		defer dst.Close()
	}
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	a, err := journal.ExportDigest(src)
	if err != nil {
		return fmt.Errorf("export the source: %w", err)
	}
	b, err := journal.ExportDigest(dst)
	if err != nil {
		return fmt.Errorf("export the copy: %w", err)
	}
	if a != b {
		return fmt.Errorf("the copy's export differs from the source's (sha256 %s, not %s)", b, a)
	}
	fmt.Fprintf(c.stdout, "copied %d keys to %s; the exports are identical (sha256 %s)\n", n, *to, a)
	return nil
}
