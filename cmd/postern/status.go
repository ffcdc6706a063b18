package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/dirlock"
)

// statusCommand is `postern status`: the first thing to run when something went wrong. It
// says whether the daemon runs (or crashed), what is in flight, what waits for an operator,
// and — when nothing carries the executions in flight — what starting the daemon will do
// with each, so the operator decides before a restart reconciles them.
type statusCommand struct{ operatorIO }

const statusUsage = `Whether the bastion runs, what is in flight, what awaits approval or review. With the
daemon down it reads the journal's files (nothing is reconciled, sent or written), says
whether it stopped cleanly, and what a start will do with each execution in flight.
`

func (c *statusCommand) Run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("status [flags]")
	flagsUsage := fs.Usage
	fs.Usage = func() { flagsUsage(); fmt.Fprint(fs.Output(), "\n"+statusUsage) }
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var o api.Overview
	if err := op.getJSON(ctx, "/v1/status", nil, &o); err != nil {
		return err
	}
	// Read after the answer: a daemon that crashed meanwhile is reported as such.
	pid, held, lockErr := dirlock.LastHolder(o.StateDir)
	if *asJSON {
		return cli.WriteJSON(c.stdout, statusJSON{Overview: o, UncleanStopPID: uncleanPID(o, pid, held)})
	}
	w := c.stdout
	switch o.Daemon {
	case api.DaemonRunning:
		fmt.Fprintf(w, "The bastion is running%s on %s.\n", pidText(pid, held), o.StateDir)
	case api.DaemonHeld:
		fmt.Fprintf(w, "The bastion is running%s on %s, held (--hold): nothing is reconciled or sent until it is restarted without --hold.\n", pidText(pid, held), o.StateDir)
	default:
		fmt.Fprintf(w, "The bastion is not running; this was read from its journal files in %s.\n", o.StateDir)
		switch {
		case lockErr != nil:
			fmt.Fprintf(w, "Whether it stopped cleanly is not known (%v).\n", lockErr)
		case pid > 0:
			fmt.Fprintf(w, "It did not stop cleanly: pid %d held the state dir and never released it (it crashed, was killed, or its machine stopped).\n", pid)
		default:
			fmt.Fprintln(w, "It stopped cleanly.")
		}
	}
	if c := o.Config; c != nil {
		fmt.Fprintf(w, "Config in force: %s, since %s (%s).\n", digestText(c.Digest), c.At.Local().Format(time.DateTime), c.By)
	}
	carried := o.Daemon == api.DaemonRunning
	if len(o.InFlight) == 0 {
		fmt.Fprintln(w, "\nNothing is in flight.")
	} else if carried {
		fmt.Fprintf(w, "\nIn flight (%d), carried by the daemon:\n", len(o.InFlight))
		writeOverviewItems(w, o.InFlight, false)
	} else {
		fmt.Fprintf(w, "\nIn flight (%d). Starting the bastion (without --hold) reconciles each, before it serves:\n", len(o.InFlight))
		writeOverviewItems(w, o.InFlight, true)
		fmt.Fprintln(w, "  To look with the daemon up and nothing sent: postern serve --hold (or postern up --hold).")
	}
	if len(o.AwaitingReview) > 0 {
		fmt.Fprintf(w, "\nAwaiting your review (%d): their outcome is unknown and only an operator settles it.\n", len(o.AwaitingReview))
		writeOverviewItems(w, o.AwaitingReview, false)
		fmt.Fprintln(w, "  Check the host, then: postern review ID --outcome completed|not-run --note TEXT")
	}
	if len(o.AwaitingApproval) > 0 {
		fmt.Fprintf(w, "\nAwaiting approval (%d):\n", len(o.AwaitingApproval))
		writeOverviewItems(w, o.AwaitingApproval, false)
		fmt.Fprintln(w, "  postern approve ID [--note TEXT], or postern deny ID --reason TEXT")
	}
	if o.Truncated {
		fmt.Fprintln(w, "\nSome lists were cut short; postern executions list --state STATE shows them all.")
	}
	if len(o.InFlight)+len(o.AwaitingReview)+len(o.AwaitingApproval) > 0 {
		fmt.Fprintln(w, "\nOne execution's whole story, asking its host live: postern investigate ID")
	}
	return nil
}

// statusJSON is status --json: the daemon's overview and the pid of a holder that never
// released the state dir (0 when it stopped cleanly or is running).
type statusJSON struct {
	api.Overview
	UncleanStopPID int `json:"unclean_stop_pid,omitempty"`
}

func uncleanPID(o api.Overview, pid int, held bool) int {
	if o.Daemon != api.DaemonDown || held {
		return 0
	}
	return pid
}

func pidText(pid int, held bool) string {
	if held && pid > 0 {
		return fmt.Sprintf(" (pid %d)", pid)
	}
	return ""
}

// writeOverviewItems prints one line per execution and, with atStart, what a start does.
func writeOverviewItems(w io.Writer, items []api.OverviewItem, atStart bool) {
	for _, it := range items {
		r := it.Record
		fmt.Fprintf(w, "  %s  %s since %s  %s on %s  %s  (%s)\n", r.ID, r.State, cli.FormatTime(r.StateTimes[r.State]),
			cli.Dash(r.Class), cli.Dash(r.Host), cli.Truncate(cli.Printable(commandOf(r)), 60), r.Actor)
		if atStart && it.AtStart != "" {
			fmt.Fprintf(w, "      at start: %s\n", it.AtStart)
		}
	}
}

// digestText shortens a config digest for people ("defaults" without a file).
func digestText(d string) string {
	if d == "" {
		return "the defaults (no config file)"
	}
	return "sha256:" + d[:min(12, len(d))]
}
