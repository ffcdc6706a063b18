package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
)

// investigateCommand answers the five questions about a retried call (bastion/investigate.go)
// through the daemon, which asks the host live.
type investigateCommand struct{ operatorIO }

// investigateQuestions are the five questions, in the order they are answered.
var investigateQuestions = [...]string{
	"Did one agent process send the calls, or two?",
	"Was the first call authorized, and did it reach dispatch?",
	"Did the bastion get a response or exit status from the target?",
	"Did result delivery fail after the target completed?",
	"Did a later call reuse the execution or its idempotency key, or make a new attempt?",
}

func (c *investigateCommand) Run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("investigate ID [flags]\n\nAnswers, in order: " + strings.Join(investigateQuestions[:], " "))
	asJSON := fs.Bool("json", false, "print JSON")
	id, err := parseJournalID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var inv api.Investigation
	if err := op.getJSON(ctx, "/v1/investigate/"+url.PathEscape(id), nil, &inv); err != nil {
		return err
	}
	if inv.Record == nil || len(inv.Answers) != len(investigateQuestions) {
		return fmt.Errorf("operator API: the investigation of %s came back incomplete (is the daemon older than this CLI?)", id)
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, inv)
	}
	return writeInvestigation(c.stdout, &inv)
}

func writeInvestigation(w io.Writer, inv *api.Investigation) error {
	r := inv.Record
	fmt.Fprintf(w, "investigation of %s: %s on %s: %s\n", inv.ExecutionID, cli.Printable(r.Tool), cli.Printable(cli.Dash(r.Host)), cli.Printable(cli.CommandText(r)))
	for i, q := range investigateQuestions {
		fmt.Fprintf(w, "\n%d. %s\n", i+1, q)
		for _, line := range strings.Split(inv.Answers[i], "\n") {
			fmt.Fprintf(w, "   %s\n", cli.Printable(line))
		}
	}
	for _, h := range inv.Hosts {
		if h.Record == nil || len(h.Answers) != len(investigateQuestions) {
			continue
		}
		fmt.Fprintf(w, "\nhost %s: %s (%s)\n", cli.Printable(h.Record.Host), h.ExecutionID, h.Record.State)
		for i, a := range h.Answers {
			fmt.Fprintf(w, "   %d. %s\n", i+1, cli.Printable(strings.ReplaceAll(a, "\n", " ")))
		}
	}
	fmt.Fprintf(w, "\ncalls (%d)\n", len(inv.Calls))
	// The replica that served each call, when replicas served them (on a single node none).
	replicas := false
	for _, call := range inv.Calls {
		replicas = replicas || call.Replica != ""
	}
	rows := make([][]string, 0, len(inv.Calls))
	for _, call := range inv.Calls {
		row := []string{"  " + cli.FormatEventTime(call.At), call.ExecutionID, call.Transport, cli.Printable(cli.Dash(call.RequestID)),
			cli.Printable(cli.Dash(call.Run)), fmt.Sprint(call.Replayed)}
		if replicas {
			row = append(row, cli.Printable(cli.Dash(call.Replica)))
		}
		rows = append(rows, append(row, cli.Printable(call.What)))
	}
	header := []string{"  TIME", "EXECUTION", "TRANSPORT", "REQUEST", "RUN", "REPLAYED"}
	if replicas {
		header = append(header, "REPLICA")
	}
	return cli.PrintTable(w, cli.TableWidth(w), append(header, "WHAT"), rows)
}
