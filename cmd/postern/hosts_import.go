package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
)

// importJSON is `hosts import --json`: the report as data.
type importJSON struct {
	Applied   bool            `json:"applied"`
	DryRun    bool            `json:"dry_run"`
	Added     []importedHost  `json:"added"`
	Replaced  []importedHost  `json:"replaced"`
	Unchanged []importedHost  `json:"unchanged"`
	Problems  []importProblem `json:"problems"`
}

type importedHost struct {
	Line    int      `json:"line"`
	Name    string   `json:"name"`
	Key     string   `json:"host_key"`
	Was     string   `json:"was,omitempty"`
	Changes []string `json:"changes,omitempty"`
}

type importProblem struct {
	Line    int    `json:"line,omitempty"`
	Name    string `json:"name,omitempty"`
	Problem string `json:"problem"`
}

// importFile enrolls every host of a TOML or CSV file in one change of the inventory (which
// the daemon re-reads on its next lookup: no daemon needed). Each host's key is in the file,
// or a host CA vouches for it, or the file gives its fingerprint and the host is asked for
// the key (which must match).
func (c *hostsCommand) importFile(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("hosts import FILE [flags]")
	format := fs.String("format", "", "toml or csv (default: from the file's extension)")
	account := fs.String("account", "", "the account of hosts the file gives none")
	replace := fs.Bool("replace", false, "overwrite hosts enrolled otherwise (another key, address, labels…): check new keys out of band first")
	dryRun := fs.Bool("dry-run", false, "check everything and report, write nothing")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	file := pos[0]
	f := fleet.ImportFormat(strings.ToLower(*format))
	if f == "" {
		f = fleet.ImportFormat(strings.TrimPrefix(strings.ToLower(filepath.Ext(file)), "."))
	}
	if f != fleet.ImportTOML && f != fleet.ImportCSV {
		return prog.UsageErrorf(c.stderr, "%s: say --format toml or --format csv", file)
	}
	data, err := readBounded(file, fleet.MaxImportBytes)
	if err != nil {
		return err
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if !*dryRun {
		if err := checkOwnState(cfg.StateDir); err != nil {
			return err
		}
	}
	rows, problems, err := fleet.ParseImport(data, f, *account)
	if err != nil {
		return fmt.Errorf("%s: %w; nothing was imported", file, err)
	}
	if n := countExpected(rows); n > 0 {
		fmt.Fprintf(c.stderr, "fetching the host keys of the %d hosts given by fingerprint (%d at once)\n", n, scanParallel)
		var unreached []fleet.ImportProblem
		rows, unreached = fleet.ScanImport(ctx, rows, scanParallel)
		problems = append(problems, unreached...)
	}
	rep, err := fleet.Import(cfg.InventoryPath(), rows, problems, *replace, *dryRun)
	if err != nil && !errors.Is(err, fleet.ErrImportFailed) {
		return err
	}
	if *asJSON {
		if werr := cli.WriteJSON(c.stdout, importReportJSON(rep, *dryRun)); werr != nil {
			return werr
		}
	} else {
		printImportReport(c.stdout, file, cfg.InventoryPath(), rep, *dryRun)
	}
	return err
}

// scanParallel is how many hosts an import asks for their key at once.
const scanParallel = 16

// countExpected is how many rows give a fingerprint, whose key must be fetched.
func countExpected(rows []fleet.ImportRow) int {
	n := 0
	for _, r := range rows {
		if r.Expect != "" {
			n++
		}
	}
	return n
}

// readBounded reads the file at path, refusing one larger than limit.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes: split it", path, limit)
	}
	return data, nil
}

func printImportReport(w io.Writer, file, inventory string, rep fleet.ImportReport, dryRun bool) {
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "%s: %s\n", file, cli.Printable(p.Error()))
	}
	for _, r := range rep.Replaced {
		fmt.Fprintf(w, "line %d: host %s: replaces the entry (%s; it was %s)\n", r.Line, r.Host.Name, strings.Join(r.Changes, ", "), r.Was)
	}
	total := len(rep.Added) + len(rep.Replaced) + len(rep.Unchanged) + len(rep.Problems)
	counts := fmt.Sprintf("%d new, %d replaced, %d unchanged", len(rep.Added), len(rep.Replaced), len(rep.Unchanged))
	switch {
	case len(rep.Problems) > 0:
		fmt.Fprintf(w, "%d of %d hosts cannot be imported; nothing was imported (the rest: %s)\n", len(rep.Problems), total, counts)
	case dryRun:
		fmt.Fprintf(w, "dry run: every host passes; importing would record %s in %s; nothing was written\n", counts, inventory)
	case rep.Applied:
		fmt.Fprintf(w, "imported %d hosts (%s) into %s\n", total, counts, inventory)
	default:
		fmt.Fprintf(w, "nothing to import: %s\n", counts)
	}
}

func importReportJSON(rep fleet.ImportReport, dryRun bool) importJSON {
	out := importJSON{Applied: rep.Applied, DryRun: dryRun, Added: []importedHost{}, Replaced: []importedHost{}, Unchanged: []importedHost{}, Problems: []importProblem{}}
	row := func(r fleet.ImportRow) importedHost {
		return importedHost{Line: r.Line, Name: r.Host.Name, Key: strings.TrimSpace(r.Host.KeyType() + " " + r.Host.Fingerprint())}
	}
	for _, r := range rep.Added {
		out.Added = append(out.Added, row(r))
	}
	for _, r := range rep.Unchanged {
		out.Unchanged = append(out.Unchanged, row(r))
	}
	for _, r := range rep.Replaced {
		h := row(r.ImportRow)
		h.Was, h.Changes = r.Was, r.Changes
		out.Replaced = append(out.Replaced, h)
	}
	for _, p := range rep.Problems {
		out.Problems = append(out.Problems, importProblem{Line: p.Line, Name: p.Name, Problem: p.Err.Error()})
	}
	return out
}
