package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strconv"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// markersCommand reads a host's markers: the daemon asks the host — its hostagent, or on a
// host without one its marker script — over its pooled SSH connection, so this works only
// while the daemon runs.
type markersCommand struct {
	operatorIO
	// loc and host may be given before the subcommand (`markers --host h1 list`) or after it.
	loc  locator
	host string
}

const markersUsage = `usage: postern markers --host H SUBCOMMAND [flags]

subcommands:
  list [--state S] [--limit N] [--cursor C] [--json]
                 the host's markers, newest first
  show ID [--json]
                 one marker on the host

common flags: --host H (the host, required), --state-dir DIR, --config FILE (where the bastion is)
`

func (c *markersCommand) Run(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers --host H SUBCOMMAND [flags]", c.stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), markersUsage) }
	c.registerGroupFlags(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	return prog.Dispatch(ctx, "markers", markersUsage, cli.Subcommands{"list": c.list, "show": c.show}, fs.Args(), c.stdout, c.stderr)
}

// registerGroupFlags registers --host and the locator on fs; a value given before the
// subcommand is the default after it.
func (c *markersCommand) registerGroupFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.host, "host", c.host, "the host whose markers to read (its inventory name)")
	c.loc.register(fs)
}

// client checks the group flags and returns the operator client.
func (c *markersCommand) client() (*operatorClient, error) {
	if c.host == "" {
		return nil, prog.UsageErrorf(c.stderr, "--host is required")
	}
	return c.loc.operator(c.stderr)
}

// onDaemonDown says what to do instead when the bastion is not running.
func (c *markersCommand) onDaemonDown(err error) error {
	if errors.Is(err, errBastionDown) {
		return fmt.Errorf("%w; markers are read through it (on the host itself: postern-hostagent markers list, or ~/.postern/run list where the marker script keeps them)", err)
	}
	return err
}

func (c *markersCommand) list(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers --host H list [flags]", c.stderr)
	c.registerGroupFlags(fs)
	state := fs.String("state", "", "only markers in this state ("+cli.States(markers.HostGraph)+")")
	limit := fs.Int("limit", 50, "at most this many markers (1..1000)")
	cursor := fs.String("cursor", "", "continue from where a previous list stopped")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *state != "" && !markers.HostGraph.Has(markers.State(*state)) {
		return prog.UsageErrorf(c.stderr, "unknown state %q (want one of %s)", *state, cli.States(markers.HostGraph))
	}
	if *limit < 1 || *limit > maxPageLimit {
		return prog.UsageErrorf(c.stderr, "--limit must be in 1..%d", maxPageLimit)
	}
	op, err := c.client()
	if err != nil {
		return err
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	if *state != "" {
		q.Set("state", *state)
	}
	if *cursor != "" {
		q.Set("cursor", *cursor)
	}
	var page api.MarkerPage
	if err := op.getJSON(ctx, "/v1/markers/"+url.PathEscape(c.host), q, &page); err != nil {
		return c.onDaemonDown(err)
	}
	if page.Markers == nil {
		page.Markers = []*hostproto.Marker{}
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, page)
	}
	rows := make([][]string, 0, len(page.Markers))
	for _, r := range page.Markers {
		rows = append(rows, []string{r.ID, string(r.State), cli.Printable(cli.Dash(r.Account)), cli.FormatTime(r.CreatedAt),
			cli.MarkerOutcome(r), cli.Printable(cli.MarkerCommandText(r))})
	}
	if err := cli.PrintTable(c.stdout, cli.TableWidth(c.stdout), []string{"ID", "STATE", "ACCOUNT", "CREATED", "EXIT", "COMMAND"}, rows); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(c.stderr, "more: --cursor %s\n", page.Next)
	}
	return nil
}

func (c *markersCommand) show(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers --host H show ID [flags]", c.stderr)
	c.registerGroupFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	id, err := parseExecutionID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	op, err := c.client()
	if err != nil {
		return err
	}
	var rec hostproto.Marker
	if err := op.getJSON(ctx, "/v1/markers/"+url.PathEscape(c.host)+"/"+url.PathEscape(id), nil, &rec); err != nil {
		return c.onDaemonDown(err)
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, &rec)
	}
	return cli.WriteMarker(c.stdout, c.host, &rec)
}
