package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/journal"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// auditCommand exports the journal's hash-chained event log and verifies it offline
// against the audit verifier key.
type auditCommand struct{ operatorIO }

const auditUsage = `usage: postern audit SUBCOMMAND [flags]

subcommands:
  export [--out FILE]
                 the journal's event log as JSONL (to stdout, or atomically to FILE)
  verify [--file EXPORT.jsonl | --dir JOURNAL_DIR] [--archive OLD.jsonl] [--key VERIFIER_KEY_FILE] [--require-sealed] [--json]
                 check the hash chain and the signed checkpoints; exit status 1 on FAIL.
                 Without --file or --dir: the running bastion's export, else its journal
                 (its dir, or the etcd cluster of [journal]). A log retention pruned says
                 what range was pruned; --archive also checks an export made before the
                 pass, and that it reaches where the pruned log starts.

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

// errVerifyFailed: the log did not verify (the report says where and why).
var errVerifyFailed = errors.New("verification failed")

func (c *auditCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "audit", auditUsage, cli.Subcommands{"export": c.export, "verify": c.verify}, args, c.stdout, c.stderr)
}

func (c *auditCommand) export(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("audit export [--out FILE] [flags]")
	out := fs.String("out", "", "write the export to FILE (atomically, mode 0600) instead of stdout")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if *out == "" {
		return c.exportTo(ctx, cfg, c.stdout)
	}
	return c.exportFile(ctx, cfg, *out)
}

// exportFile writes the journal's export to the file out, atomically (mode 0600).
func (c *auditCommand) exportFile(ctx context.Context, cfg config.Config, out string) error {
	// A partial export must never look like a complete one: write beside FILE, rename once
	// complete.
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	err = c.exportTo(ctx, cfg, tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		return fmt.Errorf("export to %s: %w", out, err)
	}
	fmt.Fprintf(c.stderr, "exported the journal to %s\n", out)
	return nil
}

// exportTo writes the journal's export to w: from the daemon, or from the journal dir when
// the daemon is down.
func (c *auditCommand) exportTo(ctx context.Context, cfg config.Config, w io.Writer) error {
	err := fetchExport(ctx, cfg, w)
	if !errors.Is(err, errBastionDown) {
		return err
	}
	where := cfg.JournalDir()
	if cfg.Journal.Etcd() {
		where = "in etcd"
	}
	fmt.Fprintf(c.stderr, "note: %v; exporting the journal %s directly\n", err, where)
	return exportOffline(cfg, w)
}

// fetchExport streams the daemon's export to w. The daemon can only log a failure once the
// export has started, so a truncated stream is caught here: an export always ends with a
// signed checkpoint line.
func fetchExport(ctx context.Context, cfg config.Config, w io.Writer) error {
	resp, err := newOperatorClient(cfg.OperatorSocketPath()).do(ctx, "/v1/audit/export", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	watch := &lastLineWriter{w: w}
	if _, err := io.Copy(watch, resp.Body); err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	if !watch.endsSealed() {
		return errors.New("audit export: the bastion's export ended without its closing checkpoint (truncated; see the bastion's log)")
	}
	return nil
}

// exportOffline exports the journal dir while no daemon holds it, read-only: the export ends
// where the log ends (the daemon seals the chain when it stops, so normally with a checkpoint).
func exportOffline(cfg config.Config, w io.Writer) error {
	if _, err := os.Stat(cfg.JournalDir()); err != nil && !cfg.Journal.Etcd() {
		return fmt.Errorf("no journal to export: %w", err)
	}
	store, err := journal.OpenReadOnly(cfg, quiet)
	if err != nil {
		return err
	}
	return errors.Join(store.Export(w), store.Close())
}

// quiet drops the store's and Pebble's log lines: the command reports its errors itself.
var quiet = slog.New(slog.DiscardHandler)

// lastLineWriter passes writes through and remembers how the last line begins.
type lastLineWriter struct {
	w     io.Writer
	n     int64
	cur   []byte // the start of the line being written
	last  []byte // the start of the last complete line
	ended bool   // the stream ends with a newline
}

// lineStartBytes is how much of a line's start lastLineWriter keeps.
const lineStartBytes = 32

func (l *lastLineWriter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	l.n += int64(n)
	for rest := p[:n]; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		if room := lineStartBytes - len(l.cur); room > 0 {
			l.cur = append(l.cur, chunk[:min(room, len(chunk))]...)
		}
		if i < 0 {
			l.ended = false
			break
		}
		l.last, l.cur = append(l.last[:0], l.cur...), l.cur[:0]
		l.ended = true
		rest = rest[i+1:]
	}
	return n, err
}

// endsSealed reports whether the stream was empty or ended with a complete checkpoint line.
func (l *lastLineWriter) endsSealed() bool {
	return l.n == 0 || (l.ended && bytes.HasPrefix(l.last, []byte(`{"type":"checkpoint"`)))
}

func (c *auditCommand) verify(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("audit verify [flags]")
	file := fs.String("file", "", "verify this exported JSONL file (- for stdin)")
	dir := fs.String("dir", "", "verify this journal data dir (no process may have it open)")
	keyPath := fs.String("key", "", "the audit verifier key file (default <state-dir>/audit.key.pub)")
	var opts markers.VerifyOptions
	fs.BoolVar(&opts.RequireSealed, "require-sealed", false, "fail if the last events are not covered by a signed checkpoint")
	archive := fs.String("archive", "", "also verify this export made before a retention pass, and that it reaches where the pruned log starts")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *file != "" && *dir != "" {
		return prog.UsageErrorf(c.stderr, "--file and --dir exclude each other")
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if *keyPath == "" {
		*keyPath = cfg.AuditKeyPath() + ".pub"
	}
	key, err := os.ReadFile(*keyPath)
	if err != nil {
		return fmt.Errorf("audit verifier key (--key): %w", err)
	}
	verifier := strings.TrimSpace(string(key))

	var rep markers.Report
	var source string
	switch {
	case *file == "-":
		source = "stdin"
		rep, err = markers.VerifyJSONL(c.stdin, verifier, opts)
	case *file != "":
		source = *file
		rep, err = verifyFile(*file, verifier, opts)
	case *dir != "":
		source = *dir
		rep, err = markers.VerifyDir(*dir, verifier, opts)
	default:
		source, rep, err = c.verifyBastion(ctx, cfg, verifier, opts)
	}
	if err != nil {
		return err
	}
	if *archive == "" {
		if *asJSON {
			err = cli.WriteJSON(c.stdout, rep)
		} else {
			_, err = fmt.Fprintf(c.stdout, "%s: %s\n", source, rep)
		}
		if err == nil && !rep.OK {
			err = errVerifyFailed
		}
		return err
	}
	// The archive: on its own, and joining the pruned log where it starts.
	aopts := markers.VerifyOptions{RequireSealed: true}
	if rep.PrunedThrough > 0 {
		aopts.Joins = &markers.ChainPos{Seq: rep.PrunedThrough, Hash: rep.PrunedHash}
	}
	arep, err := verifyFile(*archive, verifier, aopts)
	if err != nil {
		return err
	}
	if *asJSON {
		err = cli.WriteJSON(c.stdout, map[string]markers.Report{"log": rep, "archive": arep})
	} else {
		_, err = fmt.Fprintf(c.stdout, "%s: %s\n%s (archive): %s\n", source, rep, *archive, arep)
		if err == nil && rep.PrunedThrough == 0 {
			_, err = fmt.Fprintln(c.stdout, "note: the log is not pruned; the archive was verified on its own")
		}
	}
	if err == nil && (!rep.OK || !arep.OK) {
		err = errVerifyFailed
	}
	return err
}

// verifyExport verifies an export as export writes it.
func verifyExport(export func(io.Writer) error, verifier string, opts markers.VerifyOptions) (markers.Report, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(export(pw)) }()
	rep, err := markers.VerifyJSONL(pr, verifier, opts)
	pr.CloseWithError(io.ErrClosedPipe) // the writer, if still writing, stops
	return rep, err
}

func verifyFile(path, verifier string, opts markers.VerifyOptions) (markers.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return markers.Report{}, err
	}
	defer f.Close()
	return markers.VerifyJSONL(f, verifier, opts)
}

// verifyBastion verifies the running daemon's export as it streams, or the journal dir when
// the daemon is down.
func (c *auditCommand) verifyBastion(ctx context.Context, cfg config.Config, verifier string, opts markers.VerifyOptions) (string, markers.Report, error) {
	resp, err := newOperatorClient(cfg.OperatorSocketPath()).do(ctx, "/v1/audit/export", nil)
	if errors.Is(err, errBastionDown) && cfg.Journal.Etcd() {
		fmt.Fprintf(c.stderr, "note: %v; verifying the etcd journal directly\n", err)
		rep, err := verifyExport(func(w io.Writer) error { return exportOffline(cfg, w) }, verifier, opts)
		return "the etcd journal", rep, err
	}
	if errors.Is(err, errBastionDown) {
		fmt.Fprintf(c.stderr, "note: %v; verifying the journal %s directly\n", err, cfg.JournalDir())
		rep, err := markers.VerifyDir(cfg.JournalDir(), verifier, opts)
		return cfg.JournalDir(), rep, err
	}
	if err != nil {
		return "", markers.Report{}, err
	}
	defer resp.Body.Close()
	// The daemon seals its chain before it exports, so a live export that does not end
	// sealed was cut short.
	opts.RequireSealed = true
	rep, err := markers.VerifyJSONL(resp.Body, verifier, opts)
	return "the bastion's export", rep, err
}
