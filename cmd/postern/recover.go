package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/bastion/journal"
	"github.com/postern-dev/postern/bastion/sshca"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/dirlock"
	"github.com/postern-dev/postern/internal/privdir"
)

// recoverCommand is `postern recover --from-hosts` (docs/operations.md, "Recovering from the
// hosts"): with the bastion down, on an empty or restored journal, it asks every enrolled host
// for its markers and lists what the hosts ran that the journal does not know, or knows as
// unfinished; with --confirm it journals those for an operator's review
// (engine.RecoverFromHosts). Nothing is ever sent to a host but the markers queries.
type recoverCommand struct{ operatorIO }

const recoverUsage = `With the bastion stopped, after its journal was lost or restored from a backup: ask every
enrolled host for its markers and list what the hosts ran that the journal does not know, or
knows as unfinished, and what the journal shows unfinished that no host can vouch for. With
--confirm, those are journaled as unknown outcomes awaiting your review (postern review);
nothing is sent again. Running it twice is safe. Exit status 1 if a host could not be asked.
`

func (c *recoverCommand) Run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("recover --from-hosts [--confirm] [--since T] [flags]")
	flagsUsage := fs.Usage
	fs.Usage = func() { flagsUsage(); fmt.Fprint(fs.Output(), "\n"+recoverUsage) }
	fromHosts := fs.Bool("from-hosts", false, "recover from the hosts' markers (required: the one source there is)")
	confirm := fs.Bool("confirm", false, "journal what was found, for review (without it nothing is written)")
	since := fs.String("since", "", "only markers the hosts created from this time on (RFC 3339), e.g. the backup's time less a margin")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if !*fromHosts {
		return prog.UsageErrorf(c.stderr, "--from-hosts is required")
	}
	q := api.RecoveryQuery{Confirm: *confirm}
	if *since != "" {
		t, err := time.Parse(time.RFC3339, *since)
		if err != nil {
			return prog.UsageErrorf(c.stderr, "--since: %v", err)
		}
		q.Since = t
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if cfg.SSHCA.Enabled {
		// A CA made anew here would be one no host trusts; backups do not carry it.
		if _, err := sshca.Open(cfg.SSHCADir()).State(); err != nil {
			return fmt.Errorf("the SSH CA the hosts trust ([ssh_ca]) cannot be read: %w; restore its key_dir %s from where you keep it first", err, cfg.SSHCADir())
		}
	}
	for _, f := range []struct{ path, why string }{
		{cfg.ClientKeyPath(), "the bastion's SSH key, which the hosts authorize"},
		{cfg.InventoryPath(), "the inventory of enrolled hosts"},
	} {
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s (%s) cannot be read: %w; restore the backup's state files first (postern journal restore)", f.path, f.why, err)
		}
	}
	if _, err := os.Stat(cfg.FingerprintKeyPath()); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(c.stderr, "warning: %s is missing and a new one is made: a retry of a call the hosts ran cannot be matched to its recovered execution (restore the backup's state files to keep the old key)\n", cfg.FingerprintKeyPath())
	}
	if err := privdir.Ensure(cfg.StateDir, "state dir", quiet); err != nil {
		return err
	}
	lock, err := dirlock.Acquire(cfg.StateDir)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("a postern runs on %s (%v): stop it first — recovery writes the journal under it", cfg.StateDir, err)
	}
	if err != nil {
		return err
	}
	defer lock.Release()
	if cfg.Journal.Etcd() {
		if err := noLiveReplicas(ctx, cfg); err != nil {
			return err
		}
	}
	e, err := engine.Open(engine.Options{Config: cfg, Logger: quiet, Hold: true})
	if err != nil {
		return err
	}
	rec, err := e.RecoverFromHosts(ctx, q)
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if *asJSON {
		err = cli.WriteJSON(c.stdout, rec)
	} else {
		err = c.print(rec)
	}
	if err != nil {
		return err
	}
	for _, h := range rec.Hosts {
		if h.Problem != "" {
			return fmt.Errorf("host %s could not be asked: its markers are not known; run postern recover --from-hosts again once it answers", h.Name)
		}
	}
	return nil
}

// noLiveReplicas refuses recovery while a replica serves the etcd journal.
func noLiveReplicas(ctx context.Context, cfg config.Config) error {
	jl, err := journal.OpenReadOnly(cfg, quiet)
	if err != nil {
		return err
	}
	defer jl.Close()
	lister, ok := jl.(interface {
		LiveReplicas(context.Context) ([]string, error)
	})
	if !ok {
		return nil
	}
	live, err := lister.LiveReplicas(ctx)
	if err != nil {
		return err
	}
	if len(live) > 0 {
		return fmt.Errorf("replicas %v serve the journal in etcd: stop every replica first — recovery writes the journal under them", live)
	}
	return nil
}

func (c *recoverCommand) print(r *api.Recovery) error {
	w := c.stdout
	for _, h := range r.Hosts {
		switch {
		case h.Problem != "":
			fmt.Fprintf(w, "%s (%s): could not be asked: %s\n", h.Name, h.Guarantee, cli.Printable(h.Problem))
		case h.Note != "":
			fmt.Fprintf(w, "%s (%s): %d markers; %s\n", h.Name, h.Guarantee, h.Markers, h.Note)
		default:
			fmt.Fprintf(w, "%s (%s): %d markers\n", h.Name, h.Guarantee, h.Markers)
		}
	}
	if len(r.Items) == 0 {
		fmt.Fprintf(w, "\nThe journal knows everything the hosts report (%d markers agree with it%s); nothing to recover.\n", r.Counts["known"], removedNote(r))
		return nil
	}
	rows := make([][]string, 0, len(r.Items))
	for _, it := range r.Items {
		do := it.Do
		switch {
		case it.Error != "":
			do += " (FAILED)"
		case it.Journaled:
			do += " (journaled)"
		}
		rows = append(rows, []string{it.ExecutionID, it.Host, cli.Dash(string(it.Journal)), cli.Dash(string(it.Marker)), do, cli.Printable(cli.Dash(it.Command))})
	}
	fmt.Fprintln(w)
	if err := cli.PrintTable(w, cli.TableWidth(w), []string{"ID", "HOST", "JOURNAL", "MARKER", "DO", "COMMAND"}, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, it := range r.Items {
		fmt.Fprintf(w, "%s: %s\n", it.ExecutionID, cli.Printable(it.Note))
		if it.Error != "" {
			fmt.Fprintf(w, "  journal write failed: %s\n", cli.Printable(it.Error))
		}
	}
	n := r.Counts["journal"] + r.Counts["review"]
	fmt.Fprintf(w, "\n%d to journal for review (%d the journal does not know, %d it knows as unfinished), %d left to a start, %d known and agreeing%s.\n",
		n, r.Counts["journal"], r.Counts["review"], r.Counts["leave"], r.Counts["known"], removedNote(r))
	switch {
	case n == 0:
	case r.Confirmed:
		fmt.Fprintln(w, "Journaled. Review them (postern executions list --review-required; postern review ID --outcome completed|not-run --note N), then start the bastion: none of them is sent again.")
	default:
		fmt.Fprintln(w, "Nothing was journaled: run again with --confirm to journal them for review.")
	}
	return nil
}

// removedNote counts the markers of executions the journal's retention removed.
func removedNote(r *api.Recovery) string {
	if r.Counts["removed"] == 0 {
		return ""
	}
	return fmt.Sprintf(", %d of executions the journal's retention removed (ended, accepted between its oldest and newest)", r.Counts["removed"])
}
