package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/journal"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// gc runs the journal's retention pass now (docs/design.md, "Retention"): through the
// running daemon; with the daemon down, on the journal itself — a Pebble journal this
// process opens for the pass (so no daemon may start meanwhile), an etcd journal only while
// no replica serves it (the elected replica runs the pass there).
func (c *journalCommand) gc(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("journal gc [--dry-run] [--archive FILE] [--json] [flags]")
	dryRun := fs.Bool("dry-run", false, "count what the pass would remove; change nothing")
	archive := fs.String("archive", "", "first export the journal to FILE (as audit export --out): the archive of what the pass prunes")
	asJSON := fs.Bool("json", false, "print the pass as JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if *archive != "" && !*dryRun {
		if err := (&auditCommand{c.operatorIO}).exportFile(ctx, cfg, *archive); err != nil {
			return err
		}
	}
	var p *api.RetentionPass
	where := "the bastion"
	if *dryRun {
		// The daemon, or the journal read-only: a dry run writes nothing.
		op, err := loc.operator(c.stderr)
		if err != nil {
			return err
		}
		p, err = requestPass(ctx, op, true)
		if err != nil {
			return err
		}
		if op.readFromFiles() {
			where = "the journal"
		}
	} else {
		p, err = requestPass(ctx, newOperatorClient(cfg.OperatorSocketPath()), false)
		if errors.Is(err, errBastionDown) {
			fmt.Fprintf(c.stderr, "note: %v; running the pass on the journal itself\n", err)
			where = "the journal"
			p, err = gcOffline(ctx, cfg)
		}
		if err != nil {
			return err
		}
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, p)
	}
	printPass(c.stdout, where, p)
	return nil
}

// requestPass asks op for a pass. It may take long (it has no operator timeout): ctx bounds
// it.
func requestPass(ctx context.Context, op *operatorClient, dryRun bool) (*api.RetentionPass, error) {
	body, _ := json.Marshal(map[string]bool{"dry_run": dryRun})
	resp, err := op.send(ctx, http.MethodPost, "/v1/journal/gc", nil, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var p api.RetentionPass
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJSONResponseBytes)).Decode(&p); err != nil {
		return nil, fmt.Errorf("retention pass: %w", err)
	}
	return &p, nil
}

// gcOffline runs the pass on the journal while no daemon of this state dir runs.
func gcOffline(ctx context.Context, cfg config.Config) (*api.RetentionPass, error) {
	if !cfg.Journal.Etcd() {
		if _, err := os.Stat(cfg.JournalDir()); err != nil {
			return nil, fmt.Errorf("no journal to run a retention pass on: %w", err)
		}
	}
	if _, err := os.Stat(cfg.AuditKeyPath()); err != nil {
		return nil, fmt.Errorf("the audit key (it signs the checkpoint that attests the pruned chain): %w", err)
	}
	if cfg.Journal.Etcd() {
		if err := refuseWhileServed(ctx, cfg); err != nil {
			return nil, err
		}
	}
	signer, _, err := markers.LoadOrCreateAuditKey(cfg.AuditKeyPath(), "postern-bastion")
	if err != nil {
		return nil, err
	}
	jl, err := journal.Open(cfg, signer, nil, quiet, time.Now)
	if err != nil {
		return nil, fmt.Errorf("open the journal for the pass (is a bastion starting on it?): %w", err)
	}
	p := &api.RetentionPass{StartedAt: time.Now().UTC()}
	res, err := jl.GC(ctx, markers.GCOptions{Exclusive: true}) // no bastion of it runs
	p.GCResult, p.Seconds = res, time.Since(p.StartedAt).Seconds()
	if cerr := jl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("retention pass: %w (what it removed before stays removed; run it again)", err)
	}
	return p, nil
}

// refuseWhileServed refuses a pass from here while replicas serve the etcd journal: the
// elected one runs it, through its own operator socket.
func refuseWhileServed(ctx context.Context, cfg config.Config) error {
	ro, err := journal.OpenReadOnly(cfg, quiet)
	if err != nil {
		return err
	}
	defer ro.Close()
	elected, ok := ro.(interface {
		Elected(context.Context) (string, error)
	})
	if !ok {
		return errors.New("the etcd journal cannot name its elected replica")
	}
	name, err := elected.Elected(ctx)
	if err != nil {
		return err
	}
	if name != "" {
		return fmt.Errorf("replicas serve this journal: %s, the elected one, runs its retention pass every retention_interval; to run one now, run postern journal gc on a replica's machine (through its operator socket)", name)
	}
	return nil
}

func printPass(w io.Writer, where string, p *api.RetentionPass) {
	verb := "removed"
	if p.DryRun {
		verb = "would remove"
	}
	fmt.Fprintf(w, "retention pass of %s (%.1fs): %s %d executions (%d ended ones kept by their class), %d agent runs, %d expired tombstones",
		where, p.Seconds, verb, p.Records, p.Kept, p.Runs, p.TombstonesExpired)
	if !p.DryRun {
		fmt.Fprintf(w, "; %d tombstones left to answer late calls", p.Tombstones)
	}
	fmt.Fprintln(w)
	switch {
	case p.Events > 0 && p.DryRun:
		fmt.Fprintf(w, "  the chain could be pruned through event %d now (%d events)\n", p.BaseSeq, p.Events)
	case p.Events > 0:
		fmt.Fprintf(w, "  the chain is pruned through event %d (%d events; a signed checkpoint attests the new start; exports made before hold them)\n", p.BaseSeq, p.Events)
		if p.Carried > 0 {
			fmt.Fprintf(w, "  %d executions still held had events there: carried forward first\n", p.Carried)
		}
	case p.BaseSeq > 0:
		fmt.Fprintf(w, "  the chain starts after event %d\n", p.BaseSeq)
	}
	if !p.DryRun {
		compacted := ""
		if p.Compacted {
			compacted = ", after compaction"
		}
		fmt.Fprintf(w, "  backend %s → %s%s\n", formatBytes(p.BytesBefore), formatBytes(p.BytesAfter), compacted)
	}
}

// formatBytes is n in B, KiB, MiB or GiB, one decimal.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 2 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMG"[i])
}
