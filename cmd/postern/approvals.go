package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// approvalsCommand is the operator's side of approvals and reviews. Every decision is
// journaled by the daemon with the operator's identity (from the socket's peer credentials).
type approvalsCommand struct{ operatorIO }

func (c *approvalsCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "approvals", approvalsUsage, cli.Subcommands{"list": c.list}, args, c.stdout, c.stderr)
}

// decideCommand is `postern approve` and `postern deny` (its verb).
type decideCommand struct {
	operatorIO
	verb string
}

// reviewCommand is `postern review`.
type reviewCommand struct{ operatorIO }

const approvalsUsage = `usage: postern approvals list [--json]
       postern approve ID [--note TEXT]
       postern deny ID --reason TEXT
       postern review ID --outcome completed|not-run --note TEXT

  approvals list  executions waiting for an operator's decision, oldest first
  approve         authorize it: it is dispatched now
  deny            reject it: a retry of it returns this rejection
  review          record what you verified about an execution whose outcome Postern cannot
                  settle: unknown (see executions list --review-required), or dispatched or
                  running with nothing carrying it any more; only not-run lets the same intent
                  run again

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *approvalsCommand) list(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("approvals list [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var page api.ApprovalPage
	if err := op.getJSON(ctx, "/v1/approvals", nil, &page); err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, page)
	}
	if len(page.Approvals) == 0 {
		fmt.Fprintln(c.stdout, "No executions are awaiting approval.")
		return nil
	}
	for i, a := range page.Approvals {
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		writeApprovalRequest(c.stdout, a)
	}
	return nil
}

// writeApprovalRequest prints one approval request: what, where, who asked and why, the
// rule, and until when it may be decided.
func writeApprovalRequest(w io.Writer, a *api.ApprovalRequest) {
	fmt.Fprintf(w, "%s  %s on %s (class %s)\n", a.ExecutionID, cli.Printable(cli.Truncate(a.What, 200)), cli.Dash(a.Host), cli.Dash(a.Class))
	fmt.Fprintf(w, "  asked by   %s (%s)\n", a.Actor, cli.Dash(a.Run))
	if len(a.Hosts) > 0 {
		fmt.Fprintf(w, "  hosts      %s (one approval for all %d)\n", cli.Printable(cli.Truncate(strings.Join(a.Hosts, ", "), 400)), len(a.Hosts))
	}
	if a.Reason != "" {
		fmt.Fprintf(w, "  because    %s\n", cli.Printable(a.Reason))
	}
	fmt.Fprintf(w, "  rule       %s\n", cli.Dash(a.Rule))
	expires := "never"
	if !a.Expires.IsZero() {
		expires = cli.FormatTime(a.Expires)
	}
	fmt.Fprintf(w, "  waiting    since %s, expires %s\n", cli.FormatTime(a.Requested), expires)
}

// commandOf is what an execution does, as one line.
func commandOf(r *markers.Record) string {
	if len(r.Command) == 0 {
		return ""
	}
	return r.Command[len(r.Command)-1]
}

func (c *decideCommand) Run(ctx context.Context, args []string) error {
	// Each verb has its own flag: approve's note is optional, deny's reason is required.
	var fs *flag.FlagSet
	var loc *locator
	var text *string
	if c.verb == "deny" {
		fs, loc = c.flagSet("deny ID --reason TEXT [flags]")
		text = fs.String("reason", "", "why it is denied (required; journaled with your name)")
	} else {
		fs, loc = c.flagSet(c.verb + " ID [--note TEXT] [flags]")
		text = fs.String("note", "", "why (journaled with your name)")
	}
	id, err := parseJournalID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	body := map[string]string{"note": *text}
	if c.verb == "deny" {
		if *text == "" {
			return prog.UsageErrorf(c.stderr, "deny needs --reason")
		}
		body = map[string]string{"reason": *text}
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var rec markers.Record
	if err := op.postJSON(ctx, "/v1/approvals/"+url.PathEscape(id)+"/"+c.verb, body, &rec); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%s is %s\n", rec.ID, rec.State)
	return nil
}

func (c *reviewCommand) Run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("review ID --outcome completed|not-run --note TEXT")
	outcome := fs.String("outcome", "", "what you verified: completed (it took effect) or not-run")
	note := fs.String("note", "", "how you know (required; journaled with your name)")
	id, err := parseJournalID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	switch {
	case *outcome != "completed" && *outcome != "not-run":
		return prog.UsageErrorf(c.stderr, "--outcome must be completed or not-run")
	case *note == "":
		return prog.UsageErrorf(c.stderr, "review needs --note: what you checked")
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var rec markers.Record
	if err := op.postJSON(ctx, "/v1/executions/"+url.PathEscape(id)+"/review",
		map[string]string{"outcome": *outcome, "note": *note}, &rec); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%s is %s\n", rec.ID, rec.State)
	return nil
}
