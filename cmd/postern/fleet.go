package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// fleetCommand is `postern fleet`: fleet runs (docs/fleet.md) an operator starts, reads and
// cancels through the daemon, which journals and drives them as it does an agent's
// fleet_exec.
type fleetCommand struct{ operatorIO }

const fleetUsage = `usage: postern fleet SUBCOMMAND [flags]

subcommands:
  run COMMAND --actor NAME --target T [--target T]... --max-concurrency N|P%
      --max-errors N|P% [--cwd DIR] [--timeout S] [--idempotency-key K]
      [--reason TEXT] [--wait DURATION] [--json]
                 run COMMAND on every host the targets select (a host name, group:NAME,
                 or labels role=db,env=prod), at most --max-concurrency hosts at once;
                 once more than --max-errors hosts failed no new host starts. Actor
                 NAME's policy decides each host; an approval, if one is needed, is one
                 for the whole run (postern approve fr_…). Follows the run to its end
                 (or for --wait, e.g. 5m: it goes on without you)
  show ID [--json]
                 a fleet run: counts per state, each host's execution, failed hosts
                 with their cause
  cancel ID [--json]
                 start no more hosts and cancel the running ones

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *fleetCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "fleet", fleetUsage, cli.Subcommands{"run": c.run, "show": c.show, "cancel": c.cancel}, args, c.stdout, c.stderr)
}

// fleetPollS is how long one request waits for the run to change (a host started or
// ended) before the CLI asks again; below the operator API's request timeout.
const fleetPollS = 20

func (c *fleetCommand) run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("fleet run COMMAND --actor NAME --target T... --max-concurrency N|P% --max-errors N|P% [flags]")
	var targets stringList
	fs.Var(&targets, "target", "a host name, group:NAME or labels k=v,k=v (repeatable; the union is run on)")
	actor := fs.String("actor", "", "the configured actor whose policy decides every host (required)")
	conc := fs.String("max-concurrency", "", "hosts at once: a count (5) or a percentage of the hosts (25%) (required)")
	maxErrors := fs.String("max-errors", "", "failed hosts tolerated before no new host starts: a count (0 stops at the first) or a percentage (required)")
	cwd := fs.String("cwd", "", "absolute working directory on every host (default: each host's own)")
	timeout := fs.Int("timeout", 0, "kill the command on a host after this many seconds (0: never)")
	key := fs.String("idempotency-key", "", "a key that makes this same run, started again, join the first (from any invocation)")
	reason := fs.String("reason", "", "why, in a sentence: shown to whoever approves it")
	wait := fs.Duration("wait", 0, "follow the run at most this long (0: to its end); it goes on either way")
	asJSON := fs.Bool("json", false, "print the run as JSON when done")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	switch {
	case *actor == "":
		return prog.UsageErrorf(c.stderr, "name the actor whose policy decides the run: --actor NAME (an [[actors]] entry)")
	case len(targets) == 0:
		return prog.UsageErrorf(c.stderr, "name the hosts: --target NAME, --target group:NAME or --target k=v,k=v")
	case *conc == "" || *maxErrors == "":
		return prog.UsageErrorf(c.stderr, "a fleet run needs both brakes: --max-concurrency and --max-errors")
	}
	// One run id per invocation: a request this invocation repeats joins the run it started.
	runID, err := markers.NewExecutionID(time.Now())
	if err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	start := time.Now()
	waitS := fleetPollS
	if *wait > 0 && *wait < fleetPollS*time.Second {
		waitS = int(wait.Seconds())
	}
	req := api.FleetRunRequest{Actor: *actor, FleetArgs: api.FleetArgs{
		Targets: targets, Command: pos[0], MaxConcurrency: api.Limit(*conc), MaxErrors: api.Limit(*maxErrors),
		Cwd: *cwd, TimeoutS: *timeout,
		CallOptions: api.CallOptions{WaitS: &waitS, RunID: "postern-fleet-" + strings.TrimPrefix(runID, markers.ExecutionIDPrefix), IdempotencyKey: *key, Reason: *reason},
	}}
	var x api.Execution
	if err := op.postJSON(ctx, "/v1/fleet/runs", req, &x); err != nil {
		return err
	}
	fmt.Fprintf(c.stderr, "%s: %s\n", x.ExecutionID, fleetProgress(&x))
	last := fleetProgress(&x)
	for !fleetSettled(&x) && (*wait == 0 || time.Since(start) < *wait) {
		asked := time.Now()
		if err := c.read(ctx, op, x.ExecutionID, fleetPollS, &x); err != nil {
			return err
		}
		p := fleetProgress(&x)
		if p != last {
			fmt.Fprintf(c.stderr, "%s: %s\n", x.ExecutionID, p)
			last = p
			continue
		}
		// Nothing changed and the daemon did not wait (no driver carries the run here: the
		// daemon is held, or it is about to start): ask again shortly.
		if time.Since(asked) < time.Second {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	if err := c.print(&x, *asJSON); err != nil {
		return err
	}
	if markers.JournalGraph.Terminal(markers.State(x.State)) && x.CallFailed() {
		return fmt.Errorf("fleet run %s did not succeed on every host (%s)", x.ExecutionID, api.CountsText(x.Fleet.Counts))
	}
	return nil
}

// fleetSettled: nothing more will happen to the run without someone (it ended, or waits for
// an approval).
func fleetSettled(x *api.Execution) bool {
	st := markers.State(x.State)
	return markers.JournalGraph.Terminal(st) || st == markers.AwaitingApproval
}

// fleetProgress is a run's state and counts in a line.
func fleetProgress(x *api.Execution) string {
	if x.Fleet == nil {
		return x.State
	}
	return fmt.Sprintf("%s, %d hosts: %s", x.State, x.Fleet.Total, api.CountsText(x.Fleet.Counts))
}

func (c *fleetCommand) show(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("fleet show ID [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	id, err := parseFleetRunID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var x api.Execution
	if err := c.read(ctx, op, id, 0, &x); err != nil {
		return err
	}
	return c.print(&x, *asJSON)
}

func (c *fleetCommand) cancel(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("fleet cancel ID [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	id, err := parseFleetRunID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var x api.Execution
	if err := op.postJSON(ctx, "/v1/fleet/runs/"+url.PathEscape(id)+"/cancel", struct{}{}, &x); err != nil {
		return err
	}
	return c.print(&x, *asJSON)
}

// read is the run as the daemon reads it now, or once it changed within waitS seconds.
func (c *fleetCommand) read(ctx context.Context, op *operatorClient, id string, waitS int, x *api.Execution) error {
	q := url.Values{"wait_s": {strconv.Itoa(waitS)}}
	if err := op.getJSON(ctx, "/v1/executions/"+url.PathEscape(id)+"/output", q, x); err != nil {
		return err
	}
	if x.Fleet == nil {
		return fmt.Errorf("%s is not a fleet run", id)
	}
	return nil
}

// print writes the run: its summary, then one row per host.
func (c *fleetCommand) print(x *api.Execution, asJSON bool) error {
	if asJSON {
		return cli.WriteJSON(c.stdout, x)
	}
	return writeFleetRun(c.stdout, x)
}

func writeFleetRun(w io.Writer, x *api.Execution) error {
	fmt.Fprintln(w, cli.Printable(x.Summary()))
	if x.Fleet == nil || len(x.Fleet.Hosts) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(x.Fleet.Hosts))
	for _, h := range x.Fleet.Hosts {
		exit := "-"
		if h.ExitCode != nil {
			exit = strconv.Itoa(*h.ExitCode)
		}
		rows = append(rows, []string{cli.Printable(h.Host), h.State, exit, cli.Dash(h.ExecutionID), cli.Printable(cli.Dash(h.Cause))})
	}
	return cli.PrintTable(w, cli.TableWidth(w), []string{"HOST", "STATE", "EXIT", "EXECUTION", "CAUSE"}, rows)
}
