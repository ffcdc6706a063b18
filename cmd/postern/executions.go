package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// executionsCommand reads the journal through the daemon: the executions, newest first, and
// one execution's story.
type executionsCommand struct{ operatorIO }

const executionsUsage = `usage: postern executions SUBCOMMAND [flags]

subcommands:
  list [--state S] [--review-required] [--actor A] [--host H] [--since RFC3339] [--limit N] [--cursor C] [--json]
                 executions, newest first; --review-required: the unknown outcomes only an
                 operator can settle (postern review)
  show ID [--json]
                 one execution: its record, the sequence of its events, its stored output
  follow ID [--from-start=false]
                 stream its output (stdout to stdout, stderr to stderr) until it ends, then
                 print how it ended; exits 0 once it ended, whatever its exit status

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *executionsCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "executions", executionsUsage, cli.Subcommands{"list": c.list, "show": c.show, "follow": c.follow}, args, c.stdout, c.stderr)
}

// maxPageLimit is the most records the operator API returns per request.
const maxPageLimit = 1000

func (c *executionsCommand) list(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("executions list [flags]")
	state := fs.String("state", "", "only executions in this state ("+cli.States(markers.JournalGraph)+")")
	actor := fs.String("actor", "", "only this actor's executions, named as the journal names it (token:NAME, local:USER)")
	host := fs.String("host", "", "only executions on this host")
	review := fs.Bool("review-required", false, "only unknown outcomes that wait for an operator's review")
	since := fs.String("since", "", "only executions accepted at or after this time (RFC 3339)")
	limit := fs.Int("limit", 50, "at most this many executions")
	cursor := fs.String("cursor", "", "continue from where a previous list stopped")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *state != "" && !markers.JournalGraph.Has(markers.State(*state)) {
		return prog.UsageErrorf(c.stderr, "unknown state %q (want one of %s)", *state, cli.States(markers.JournalGraph))
	}
	if *since != "" {
		if _, err := time.Parse(time.RFC3339, *since); err != nil {
			return prog.UsageErrorf(c.stderr, "--since: want an RFC 3339 time such as 2026-01-02T15:04:05Z: %v", err)
		}
	}
	if *limit < 1 {
		return prog.UsageErrorf(c.stderr, "--limit must be at least 1")
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	q := url.Values{}
	for k, v := range map[string]string{"state": *state, "actor": *actor, "host": *host, "since": *since} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *review {
		if *state != "" && *state != string(markers.Unknown) {
			return prog.UsageErrorf(c.stderr, "--review-required selects unknown executions; drop --state %s", *state)
		}
		q.Set("review_required", "true")
	}
	// The API filters by host after it reads a page, so a page may come back short: read on
	// until the limit is reached or the journal ends. Each request asks for no more than is
	// left, so the cursor stays exact.
	out := api.ExecutionPage{Executions: []*markers.Record{}, Next: *cursor}
	for {
		q.Set("limit", strconv.Itoa(min(*limit-len(out.Executions), maxPageLimit)))
		if out.Next != "" {
			q.Set("cursor", out.Next)
		}
		var page api.ExecutionPage
		if err := op.getJSON(ctx, "/v1/executions", q, &page); err != nil {
			return err
		}
		out.Executions = append(out.Executions, page.Executions...)
		out.Next = page.Next
		if out.Next == "" || len(out.Executions) >= *limit {
			break
		}
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, out)
	}
	rows := make([][]string, 0, len(out.Executions))
	for _, r := range out.Executions {
		rows = append(rows, []string{r.ID, cli.FormatTime(r.CreatedAt), stateLabel(r), cli.Printable(cli.Dash(r.Actor)),
			cli.Printable(cli.Dash(r.Host)), cli.Outcome(r), cli.Printable(cli.CommandText(r))})
	}
	if err := cli.PrintTable(c.stdout, cli.TableWidth(c.stdout), []string{"ID", "ACCEPTED", "STATE", "ACTOR", "HOST", "EXIT", "COMMAND"}, rows); err != nil {
		return err
	}
	if out.Next != "" {
		fmt.Fprintf(c.stderr, "more: --cursor %s\n", out.Next)
	}
	return nil
}

func (c *executionsCommand) show(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("executions show ID [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	id, err := parseJournalID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var detail api.ExecutionDetail
	if err := op.getJSON(ctx, "/v1/executions/"+url.PathEscape(id), nil, &detail); err != nil {
		return err
	}
	if detail.Record == nil {
		return fmt.Errorf("operator API: execution %s came back without its record", id)
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, detail)
	}
	return writeExecution(c.stdout, &detail)
}

// writeExecution prints the record's fields, the sequence of its events and its stored
// output.
func writeExecution(w io.Writer, d *api.ExecutionDetail) error {
	r := d.Record
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, cli.Printable(v))
		}
	}
	row("execution", r.ID)
	row("state", stateLabel(r))
	row("did not start", r.StartError)
	if markers.JournalGraph.Terminal(r.State) || r.State == markers.Unknown {
		row("outcome", cli.OutcomeText(r))
	}
	row("actor", r.Actor)
	row("recovered from", r.RecoveredFrom)
	row("replica", r.Replica)
	row("tool", r.Tool)
	row("host", r.Host)
	row("target", r.Target)
	row("account", r.Account)
	row("command", cli.CommandText(r))
	row("cwd", r.Cwd)
	if r.TimeoutSeconds > 0 {
		row("timeout", (time.Duration(r.TimeoutSeconds) * time.Second).String())
	}
	row("class", r.Class)
	row("intent scope", r.IntentScope)
	if d.Run != nil {
		row("agent run", runWho(d.Run)+" ("+d.Run.Transport+")")
	}
	row("fingerprint", r.Fingerprint)
	row("idempotency key", r.IdempotencyKey)
	row("previous attempt", r.PreviousAttempt)
	row("operation key", r.OperationKey)
	row("operation taken by", r.OperationTakenBy)
	row("accepted", r.CreatedAt.Local().Format(time.RFC3339))
	if r.ResultDeliveredAt != nil {
		row("result delivered", r.ResultDeliveredAt.Local().Format(time.RFC3339))
	} else if why := notDeliveredWhy(d.Events); why != "" {
		row("not delivered", why)
	}
	if o := r.Output; o.StdoutBytes > 0 || o.StderrBytes > 0 || o.StdoutSHA256 != "" {
		row("stdout", fmt.Sprintf("%d bytes  sha256 %s", o.StdoutBytes, cli.Dash(o.StdoutSHA256)))
		row("stderr", fmt.Sprintf("%d bytes  sha256 %s", o.StderrBytes, cli.Dash(o.StderrSHA256)))
		if o.Truncated {
			row("output", "truncated at the host's output cap")
		}
	}
	for i, e := range r.Evidence {
		k := ""
		if i == 0 {
			k = "evidence"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, cli.Printable(e))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nevents (%d)\n", len(d.Events))
	rows := make([][]string, 0, len(d.Events))
	for _, ev := range d.Events {
		rows = append(rows, []string{"  " + strconv.FormatUint(ev.Seq, 10), cli.FormatEventTime(ev.At), eventStep(ev), cli.Printable(eventNote(ev))})
	}
	if err := cli.PrintTable(w, 0, []string{"  SEQ", "TIME", "STEP", "NOTE"}, rows); err != nil {
		return err
	}

	if d.Output == nil {
		_, err := fmt.Fprintln(w, "\nno stored output")
		return err
	}
	if x := d.Output; x.HTTPStatus != 0 {
		fmt.Fprintf(w, "\nresponse: HTTP %d, %d bytes", x.HTTPStatus, x.ResponseBytes)
		if x.ResponseTruncated {
			fmt.Fprint(w, " (body truncated)")
		}
		fmt.Fprintf(w, "\n%s\n", cli.PrintableBlock(x.ResponseBody))
		return nil
	}
	writeStream(w, "stdout", d.Output.Stdout, d.Output.StdoutOffset, r.Output.StdoutBytes)
	writeStream(w, "stderr", d.Output.Stderr, d.Output.StderrOffset, r.Output.StderrBytes)
	return nil
}

// writeStream prints one stored output tail under a heading that says which bytes it is.
func writeStream(w io.Writer, name, data string, offset, total int64) {
	switch {
	case data == "":
		fmt.Fprintf(w, "\n%s: empty\n", name)
		return
	case offset > 0:
		fmt.Fprintf(w, "\n%s (bytes %d..%d of %d; earlier output is on the host):\n", name, offset, offset+int64(len(data)), max(total, offset+int64(len(data))))
	default:
		fmt.Fprintf(w, "\n%s:\n", name)
	}
	text := cli.PrintableBlock(data)
	io.WriteString(w, text)
	if !strings.HasSuffix(text, "\n") {
		io.WriteString(w, "\n")
	}
}

// notDeliveredWhy is why the last response that carried the result did not deliver it, with
// when ("" when none was journaled).
func notDeliveredWhy(events []markers.Event) string {
	for i := len(events) - 1; i >= 0; i-- {
		if why, ok := strings.CutPrefix(events[i].Note, api.NotDeliveredNote+": "); ok && events[i].Kind == markers.KindUpdate {
			return why + " (" + cli.FormatEventTime(events[i].At) + "; a retry replays it)"
		}
	}
	return ""
}

// eventStep is the event's place in the story: "→ accepted" for the creation,
// "accepted → authorized" for a transition, "completed (update)" for an update,
// "completed (delivery revoked)" when the caller abandoned the request that carried the result.
func eventStep(ev markers.Event) string {
	switch ev.Kind {
	case markers.KindCreate:
		return "→ " + string(ev.To)
	case markers.KindUpdate:
		return string(ev.To) + " (update)"
	case markers.KindDeliveryRevoked:
		return string(ev.To) + " (delivery revoked)"
	case markers.KindJoined:
		return string(ev.To) + " (call joined)"
	}
	return string(ev.From) + " → " + string(ev.To)
}

// eventNote is the event's note, and the call behind it: its JSON-RPC id, transport, run and
// what the matching rule made of it ("call 3 via http, run:ci-7: attach, replayed").
func eventNote(ev markers.Event) string {
	c := ev.Call
	if c == nil {
		return ev.Note
	}
	call := "call " + cli.Dash(c.RequestID) + " via " + c.Transport
	if c.Run != "" {
		call += ", " + c.Run
	}
	if c.Subject != "" {
		call += ", subject " + cli.Printable(c.Subject)
	}
	if c.Replica != "" {
		call += ", replica " + c.Replica
	}
	if c.Match != "" {
		call += ": " + c.Match
	}
	if c.Replayed {
		call += ", replayed"
	}
	if ev.Note == "" {
		return call
	}
	return ev.Note + " (" + call + ")"
}

// stateLabel is the journal state, with a completed execution whose result never reached
// its caller marked as such (docs/design.md: completed_result_not_delivered).
func stateLabel(r *markers.Record) string {
	if r.State == markers.Completed && r.ResultDeliveredAt == nil {
		return "completed (not delivered)"
	}
	if r.ReviewRequired {
		return "unknown (review required)"
	}
	return string(r.State)
}
