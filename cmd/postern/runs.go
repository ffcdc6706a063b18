package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// runsCommand reads the agent runs journal: one record per agent run (intent scope), with
// who the agent was at its first contact.
type runsCommand struct{ operatorIO }

const runsUsage = `usage: postern runs SUBCOMMAND [flags]

subcommands:
  list [--actor A] [--limit N] [--json]
                 agent runs, newest first: local agent processes (pid, executable,
                 command line, start time, uid) and remote actors (token, run id)
  show SCOPE [--actor A] [--json]
                 one run, named by its intent scope as executions show it (run:PID-TICKS,
                 run:RUN_ID or window)

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *runsCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "runs", runsUsage, cli.Subcommands{"list": c.list, "show": c.show}, args, c.stdout, c.stderr)
}

func (c *runsCommand) list(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("runs list [flags]")
	actor := fs.String("actor", "", "only this actor's runs (token:NAME, local:USER)")
	limit := fs.Int("limit", 50, "at most this many runs (1..1000)")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *limit < 1 || *limit > maxPageLimit {
		return prog.UsageErrorf(c.stderr, "--limit must be in 1..%d", maxPageLimit)
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	if *actor != "" {
		q.Set("actor", *actor)
	}
	page, err := c.get(ctx, loc, q)
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, page)
	}
	rows := make([][]string, 0, len(page.Runs))
	for _, r := range page.Runs {
		rows = append(rows, []string{cli.Printable(r.Scope), cli.FormatTime(r.FirstSeen), cli.Printable(r.Actor), r.Transport, cli.Printable(runWho(r))})
	}
	return cli.PrintTable(c.stdout, cli.TableWidth(c.stdout), []string{"RUN", "FIRST SEEN", "ACTOR", "TRANSPORT", "AGENT"}, rows)
}

func (c *runsCommand) show(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("runs show SCOPE [flags]")
	actor := fs.String("actor", "", "the run's actor, when runs of several actors share the scope (window)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	q := url.Values{"scope": {pos[0]}}
	if *actor != "" {
		q.Set("actor", *actor)
	}
	page, err := c.get(ctx, loc, q)
	if err != nil {
		return err
	}
	if len(page.Runs) == 0 {
		return fmt.Errorf("no agent run %s in the journal: `postern runs list` shows the recorded runs (a run is recorded at its first call after this bastion version)", cli.Printable(pos[0]))
	}
	if *asJSON {
		if len(page.Runs) == 1 {
			return cli.WriteJSON(c.stdout, page.Runs[0])
		}
		return cli.WriteJSON(c.stdout, page)
	}
	for i, r := range page.Runs {
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		if err := writeRun(c.stdout, r); err != nil {
			return err
		}
	}
	return nil
}

func (c *runsCommand) get(ctx context.Context, loc *locator, q url.Values) (*api.RunPage, error) {
	op, err := loc.operator(c.stderr)
	if err != nil {
		return nil, err
	}
	var page api.RunPage
	if err := op.getJSON(ctx, "/v1/runs", q, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// runWho is the agent behind a run, in a table cell.
func runWho(r *markers.Run) string {
	if r.PID != 0 || r.Exe != "" {
		return fmt.Sprintf("pid %d %s", r.PID, strings.Join(append([]string{r.Exe}, argsAfterFirst(r.Cmdline)...), " "))
	}
	if r.RunID != "" {
		return "run id " + r.RunID
	}
	return "no run id"
}

func argsAfterFirst(cmdline []string) []string {
	if len(cmdline) < 2 {
		return nil
	}
	return cmdline[1:]
}

func writeRun(w io.Writer, r *markers.Run) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, cli.Printable(v))
		}
	}
	row("run", r.Scope)
	row("actor", r.Actor)
	row("transport", r.Transport)
	row("first seen", cli.FormatTime(r.FirstSeen))
	if r.PID != 0 {
		row("pid", strconv.Itoa(r.PID))
	}
	row("executable", r.Exe)
	if len(r.Cmdline) > 0 {
		row("command line", strings.Join(r.Cmdline, " "))
	}
	if !r.StartTime.IsZero() {
		row("started", cli.FormatTime(r.StartTime))
	}
	if r.UID != nil {
		row("uid", strconv.Itoa(*r.UID))
	}
	row("token", r.Token)
	row("run id", r.RunID)
	return tw.Flush()
}
