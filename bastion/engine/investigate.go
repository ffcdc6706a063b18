package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// An investigation answers, from the journal (and the host, asked live), the five questions
// an operator asks about a retried call, in order:
//
//  1. Did one agent process send the calls, or two?
//  2. Was the first call authorized, and did it reach dispatch?
//  3. Did the bastion get a response or exit status from the target?
//  4. Did result delivery fail after the target completed?
//  5. Did a later call reuse the execution or its idempotency key, or make a new attempt?
//
// The intent is the execution's siblings: every execution of the same actor, scope and
// fingerprint, and the keyed attempts linked to it (previous_attempt). Calls are what their
// create, joined and delivery events say (calls.go).

// Bounds of an investigation.
const (
	maxSiblings       = 50
	maxRelatedScanned = 2000
	markerAskTimeout  = 10 * time.Second
)

// investigation reads what the five questions need: the journal, the inventory, the hosts.
type investigation struct{ *core }

// Investigate answers the five questions about execution id.
func (b *Engine) Investigate(ctx context.Context, id string) (*api.Investigation, error) {
	iv := investigation{b.core}
	rec, err := b.journal.Get(id)
	if err != nil {
		return nil, err
	}
	inv := &api.Investigation{ExecutionID: id, Record: rec, Calls: []api.InvestigatedCall{}, Runs: []*markers.Run{}}
	siblings, err := iv.siblings(rec)
	if err != nil {
		return nil, err
	}
	eventsOf := map[string][]markers.Event{}
	for _, s := range siblings {
		evs, err := b.journal.Events(s.ID)
		if err != nil {
			return nil, err
		}
		eventsOf[s.ID] = evs
		inv.Siblings = append(inv.Siblings, siblingOf(s))
		inv.Calls = append(inv.Calls, callsOf(s, evs, guaranteeOf(iv.inv, s))...)
	}
	slices.SortStableFunc(inv.Calls, func(a, b api.InvestigatedCall) int { return a.At.Compare(b.At) })
	seen := map[string]bool{}
	for _, c := range inv.Calls {
		if c.Run == "" || seen[c.Run] {
			continue
		}
		seen[c.Run] = true
		if r, err := b.journal.Run(rec.Actor, c.Run); err == nil {
			inv.Runs = append(inv.Runs, r)
		}
	}
	if inv.Related, err = iv.related(rec); err != nil {
		return nil, err
	}
	inv.Authorization = authorizationOf(rec, eventsOf[id])
	inv.Replicas = replicasOf(eventsOf[id])
	inv.Outcome = iv.observedOutcome(ctx, rec)
	inv.Delivery = deliveryOf(rec, eventsOf[id])
	if rec.IsFleetRun() {
		if err := b.investigateHosts(ctx, inv); err != nil {
			return nil, err
		}
	}
	inv.Answers = []string{
		answerWho(inv),
		answerAuthorization(inv),
		answerOutcome(inv),
		answerDelivery(inv),
		answerLater(inv),
	}
	return inv, nil
}

// investigateHosts answers the five questions for each host of fleet run inv.Record that
// has an execution, in the run's order, and says in the run's outcome how its hosts stand.
func (b *Engine) investigateHosts(ctx context.Context, inv *api.Investigation) error {
	children, err := b.fleetChildren(inv.Record)
	if err != nil {
		return err
	}
	counts := countsOf(children)
	inv.Outcome.MarkerNote += fmt.Sprintf(". Its %d hosts: %s", len(children), api.CountsText(counts))
	if n := counts[api.NotStarted]; n > 0 {
		inv.Outcome.MarkerNote += fmt.Sprintf(" (%d never started: nothing was journaled or sent for them)", n)
	}
	for _, ch := range children {
		if ch.rec == nil {
			continue
		}
		h, err := b.Investigate(ctx, ch.rec.ID)
		if errors.Is(err, markers.ErrNotFound) {
			continue // removed by retention: nothing left to answer from
		}
		if err != nil {
			return fmt.Errorf("host %s (%s): %w", ch.host.Name, ch.rec.ID, err)
		}
		inv.Hosts = append(inv.Hosts, h)
	}
	return nil
}

// siblings are the executions of rec's intent, oldest first: the same actor, scope and
// fingerprint, and for a keyed execution every attempt under its key.
func (iv investigation) siblings(rec *markers.Record) ([]*markers.Record, error) {
	ids, err := iv.journal.SiblingIDs(rec.Actor, rec.IntentScope, rec.Fingerprint, maxSiblings)
	if err != nil {
		return nil, err
	}
	if rec.IdempotencyKey != "" {
		newest, err := iv.journal.FindByIdempotencyKey(rec.Actor, rec.IdempotencyKey)
		for n := 0; err == nil && newest != nil && n < maxSiblings; n++ {
			ids = append(ids, newest.ID)
			if newest.PreviousAttempt == "" {
				break
			}
			newest, err = iv.journal.Get(newest.PreviousAttempt)
		}
		if err != nil && !errors.Is(err, markers.ErrNotFound) {
			return nil, err
		}
	}
	ids = append(ids, rec.ID)
	slices.Sort(ids) // execution ids sort by acceptance time
	ids = slices.Compact(ids)
	var out []*markers.Record
	for _, sid := range ids {
		s, err := iv.journal.Get(sid)
		if errors.Is(err, markers.ErrNotFound) {
			continue // removed by retention
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// related are the actor's executions of the same command on the same target from other
// agent runs, accepted within the class's attach window of rec.
func (iv investigation) related(rec *markers.Record) ([]api.Sibling, error) {
	window := iv.current().classes.Get(rec.Class).AttachWindow
	recs, _, err := iv.journal.List(markers.Query{Actor: rec.Actor, Since: rec.CreatedAt.Add(-window), Until: rec.CreatedAt.Add(window), Limit: maxRelatedScanned})
	if err != nil {
		return nil, err
	}
	var out []api.Sibling
	for _, r := range recs {
		if r.ID != rec.ID && r.IntentScope != rec.IntentScope && r.Target == rec.Target &&
			slices.Equal(r.Command, rec.Command) && r.Cwd == rec.Cwd && r.Tool == rec.Tool {
			out = append(out, siblingOf(r))
		}
	}
	return out, nil
}

func siblingOf(r *markers.Record) api.Sibling {
	return api.Sibling{ExecutionID: r.ID, State: string(r.State), Scope: r.IntentScope, AcceptedAt: r.CreatedAt,
		DeliveredAt: r.ResultDeliveredAt, IdempotencyKey: r.IdempotencyKey, PreviousAttempt: r.PreviousAttempt}
}

// callsOf are the calls that the events of execution rec name (delivery events are not
// calls of their own: they say which call got the result); level is its host's guarantee.
func callsOf(rec *markers.Record, evs []markers.Event, level fleet.Guarantee) []api.InvestigatedCall {
	var out []api.InvestigatedCall
	for _, ev := range evs {
		switch {
		case ev.Kind == markers.KindCreate:
			c := markers.Call{Match: string(intent.NewExecution)}
			if ev.Call != nil {
				c = *ev.Call
			}
			what := "created " + rec.ID
			if c.Match == string(intent.NewAttempt) {
				what = fmt.Sprintf("new attempt %s of %s (same idempotency key, same request; the earlier attempt failed without effect)", rec.ID, rec.PreviousAttempt)
			} else if rec.IdempotencyKey != "" {
				what += " with idempotency key " + rec.IdempotencyKey
			}
			out = append(out, api.InvestigatedCall{At: ev.At, ExecutionID: rec.ID, Call: c, What: what})
		case ev.Kind == markers.KindJoined && ev.Call != nil:
			out = append(out, api.InvestigatedCall{At: ev.At, ExecutionID: rec.ID, Call: *ev.Call, What: joinedWhat(rec, ev.Call.Match, level)})
		}
	}
	return out
}

// joinedWhat says what a call that joined rec amounted to; level (its host's guarantee, ""
// when not known) says what reconciling an unknown outcome could ask.
func joinedWhat(rec *markers.Record, match string, level fleet.Guarantee) string {
	via := "same intent"
	if rec.IdempotencyKey != "" {
		via = "reused idempotency key " + rec.IdempotencyKey
	}
	switch intent.Match(match) {
	case intent.KeyReused:
		return fmt.Sprintf("reused idempotency key %s for a different request: refused, nothing dispatched", rec.IdempotencyKey)
	case intent.Replay:
		return fmt.Sprintf("joined %s (%s): its stored result was replayed, nothing dispatched", rec.ID, via)
	case intent.Attach:
		return fmt.Sprintf("joined %s (%s): attached to it while it ran, nothing dispatched", rec.ID, via)
	case intent.Continue:
		return fmt.Sprintf("joined %s (%s): continued it before dispatch", rec.ID, via)
	case intent.Reconcile:
		return fmt.Sprintf("joined %s (%s): %s", rec.ID, via, reconcileWhat(rec, level))
	case intent.Pending:
		return fmt.Sprintf("joined %s (%s): returned it awaiting approval, no second approval", rec.ID, via)
	case intent.Rejection:
		return fmt.Sprintf("joined %s (%s): returned the same rejection", rec.ID, via)
	case intent.Recovered:
		return fmt.Sprintf("joined %s (its fingerprint; recovered from %s's marker): returned awaiting review, nothing dispatched", rec.ID, rec.RecoveredFrom)
	}
	return fmt.Sprintf("joined %s (%s)", rec.ID, match)
}

// reconcileWhat says what joining rec's unknown outcome did, by what its target can tell.
func reconcileWhat(rec *markers.Record, level fleet.Guarantee) string {
	switch {
	case rec.Channel == "http":
		class := "the endpoint's class"
		if rec.Class != "" {
			class += " (" + rec.Class + ")"
		}
		return "its unknown outcome was handled by " + class + ", nothing sent blindly"
	case level == fleet.GuaranteeHostagent:
		return "its unknown outcome was reconciled with the host, nothing dispatched blindly"
	case level == fleet.GuaranteeMarkerScript:
		return fmt.Sprintf("its unknown outcome was reconciled by reading its marker from the marker script on %s, nothing dispatched blindly", rec.Host)
	case level == fleet.GuaranteeNone:
		return fmt.Sprintf("its outcome was unknown and nothing can be asked of %s (guarantee level none: nothing there records executions), so it was returned as unknown and not sent again", rec.Host)
	}
	return fmt.Sprintf("its outcome was unknown, nothing dispatched blindly (%s is not enrolled now, so how it was reconciled cannot be told)", rec.Host)
}

func authorizationOf(rec *markers.Record, evs []markers.Event) api.Authorization {
	a := api.Authorization{Decision: rec.Decision, Class: rec.Class, AcceptedAt: rec.CreatedAt}
	for _, e := range rec.Evidence {
		if rule, ok := api.RuleOf(e); ok {
			a.Rule = rule
		}
	}
	if t, ok := rec.StateTimes[markers.Authorized]; ok {
		a.AuthorizedAt = &t
	}
	if t, ok := rec.StateTimes[markers.Dispatched]; ok {
		a.DispatchedAt = &t
	}
	for _, ev := range evs {
		if ev.Kind == markers.KindTransition && (ev.To == markers.AwaitingApproval || ev.To == markers.Rejected ||
			ev.From == markers.AwaitingApproval) {
			a.Steps = append(a.Steps, fmt.Sprintf("%s %s → %s: %s", ev.At.UTC().Format(time.RFC3339), ev.From, ev.To, ev.Note))
		}
	}
	return a
}

// observedOutcome is what the journal holds, and what the host's marker says now.
func (iv investigation) observedOutcome(ctx context.Context, rec *markers.Record) api.ObservedOutcome {
	o := api.ObservedOutcome{State: string(rec.State), ExitCode: rec.ExitCode, Signal: rec.Signal, HTTPStatus: rec.HTTPStatus, Evidence: rec.Evidence}
	if t := intent.FinishedAt(rec); !t.IsZero() {
		o.ObservedAt = &t
	}
	switch {
	case rec.IsFleetRun():
		o.MarkerNote = "a fleet run is sent nowhere itself and has no marker: each host's execution does, answered for below"
		return o
	case rec.Channel == "http":
		o.MarkerNote = "HTTP executions have no host marker: the endpoint's response stored in the journal is the evidence"
		return o
	case rec.StateTimes[markers.Dispatched].IsZero():
		o.MarkerNote = "never dispatched, so the host was not asked"
		return o
	}
	ctx, cancel := context.WithTimeout(ctx, markerAskTimeout)
	defer cancel()
	host, err := hostOf(iv.inv, rec)
	if err == nil && host.Level() != fleet.GuaranteeHostagent {
		o.MarkerNote = iv.hosts.agentlessMarkerNote(ctx, rec, host) // agentless.go
		return o
	}
	var cc *hostproto.ControlClient
	if err == nil {
		cc, err = iv.hosts.control(ctx, host)
	}
	if err != nil {
		o.MarkerNote = fmt.Sprintf("host %s could not be asked: %v", rec.Host, err)
		return o
	}
	defer cc.Close()
	rep, err := cc.StatusReport(ctx, []string{rec.ID})
	switch {
	case err != nil:
		o.MarkerNote = fmt.Sprintf("host %s could not be asked: %v", rec.Host, err)
	case len(rep.Markers) == 1:
		o.Marker = rep.Markers[0]
		o.MarkerNote = fmt.Sprintf("host %s, asked now, has marker %s: %s", rec.Host, rec.ID, markerOutcome(o.Marker))
	default:
		o.MarkerNote = fmt.Sprintf("host %s, asked now, has no marker %s (it keeps finished markers for %s)", rec.Host, rec.ID,
			rep.MarkerRetention)
	}
	return o
}

func markerOutcome(m *hostproto.Marker) string {
	s := string(m.State)
	switch {
	case m.ExitCode != nil:
		s += fmt.Sprintf(", exit %d", *m.ExitCode)
	case m.Signal != "":
		s += ", signal " + m.Signal
	}
	if m.StartError != "" {
		s += " (" + m.StartError + ")"
	}
	return s
}

func deliveryOf(rec *markers.Record, evs []markers.Event) api.DeliveryAnswer {
	d := api.DeliveryAnswer{DeliveredAt: rec.ResultDeliveredAt}
	for _, ev := range evs {
		switch {
		case ev.Kind == markers.KindUpdate && ev.Note == deliveredNote:
			if r, err := ev.DecodedRecord(); err != nil || r.ResultDeliveredAt == nil {
				continue // not a delivery after all (the execution had not ended)
			}
			d.Deliveries = append(d.Deliveries, api.DeliveryEvent{At: ev.At, Call: ev.Call})
		case ev.Kind == markers.KindDeliveryRevoked:
			d.Revocations = append(d.Revocations, api.DeliveryEvent{At: ev.At, Note: ev.Note})
		case ev.Kind == markers.KindUpdate && strings.HasPrefix(ev.Note, api.NotDeliveredNote+": "):
			d.Failures = append(d.Failures, api.DeliveryEvent{At: ev.At, Call: ev.Call, Note: strings.TrimPrefix(ev.Note, api.NotDeliveredNote+": ")})
		}
	}
	return d
}

// runOf is the run of scope among inv's runs, nil if it has none.
func runOf(inv *api.Investigation, scope string) *markers.Run {
	for _, r := range inv.Runs {
		if r.Scope == scope {
			return r
		}
	}
	return nil
}

// runText is a run in one line: the process (or token) behind it.
func runText(r *markers.Run) string {
	if r.PID != 0 || r.Exe != "" {
		s := fmt.Sprintf("pid %d, %s", r.PID, r.Exe)
		if len(r.Cmdline) > 0 {
			s += " (" + strings.Join(r.Cmdline, " ") + ")"
		}
		if !r.StartTime.IsZero() {
			s += ", started " + r.StartTime.UTC().Format(time.RFC3339)
		}
		if r.UID != nil {
			s += fmt.Sprintf(", uid %d", *r.UID)
		}
		return s + ", via " + r.Transport
	}
	s := "token " + r.Token
	if r.Subject != "" {
		s += " (OAuth subject " + r.Subject + ")"
	}
	if r.RunID != "" {
		s += ", run id " + r.RunID
	} else {
		s += ", no run id (the actor's verdict.Attach window)"
	}
	return s + ", via " + r.Transport
}

func answerWho(inv *api.Investigation) string {
	runs := map[string]bool{}
	for _, c := range inv.Calls {
		runs[c.Run] = true
	}
	var b strings.Builder
	switch len(runs) {
	case 0:
		b.WriteString("No call is recorded for this intent (it was accepted before calls were journaled).")
	case 1:
		var scope string
		for s := range runs {
			scope = s
		}
		fmt.Fprintf(&b, "One agent run sent %s: %s", plural(len(inv.Calls), "call"), scopeText(inv, scope))
	default:
		fmt.Fprintf(&b, "%d agent runs sent the %s:", len(runs), plural(len(inv.Calls), "call"))
		for _, s := range slices.Sorted(maps.Keys(runs)) {
			b.WriteString("\n  " + scopeText(inv, s))
		}
	}
	if from := inv.Record.RecoveredFrom; from != "" {
		fmt.Fprintf(&b, ". The journal lost the call that started it, its actor and its run: it was rebuilt from %s's marker (postern recover --from-hosts); later calls of the same intent found it by its fingerprint.", from)
	} else {
		fmt.Fprintf(&b, ". Actor %s.", inv.Record.Actor)
	}
	if len(inv.Related) > 0 {
		fmt.Fprintf(&b, "\nOther agent runs of the same actor sent the same command within the verdict.Attach window, as separate intents (another process is another run):")
		for _, r := range inv.Related {
			fmt.Fprintf(&b, "\n  %s (%s) in %s", r.ExecutionID, r.State, r.Scope)
		}
	}
	return b.String()
}

func scopeText(inv *api.Investigation, scope string) string {
	if scope == "" {
		return "an unnamed run"
	}
	if r := runOf(inv, scope); r != nil {
		return scope + " — " + runText(r)
	}
	return scope + " (no run record)"
}

func answerAuthorization(inv *api.Investigation) string {
	a := inv.Authorization
	var b strings.Builder
	fmt.Fprintf(&b, "Accepted %s; policy decided %s", stamp(a.AcceptedAt), dash(a.Decision))
	if a.Rule != "" {
		fmt.Fprintf(&b, " by %s", a.Rule)
	}
	if a.Class != "" {
		fmt.Fprintf(&b, ", class %s", a.Class)
	}
	b.WriteString(".")
	for _, s := range a.Steps {
		b.WriteString(" " + s + ".")
	}
	if a.AuthorizedAt != nil {
		fmt.Fprintf(&b, " Authorized %s.", stamp(*a.AuthorizedAt))
	}
	if a.DispatchedAt != nil {
		fmt.Fprintf(&b, " Dispatched %s.", stamp(*a.DispatchedAt))
	} else {
		b.WriteString(" Never dispatched.")
	}
	for _, r := range inv.Replicas {
		fmt.Fprintf(&b, " %s: %s.", stamp(r.At), r.What)
	}
	return b.String()
}

// replicasOf are the turns of the replicas that drove an execution, from its events: each
// event's record names the replica driving it (Record.Replica); a change is a turn, in the
// words of the event that made it.
func replicasOf(evs []markers.Event) []api.ReplicaStep {
	var out []api.ReplicaStep
	last := ""
	for _, ev := range evs {
		r, err := ev.DecodedRecord()
		if err != nil || r.Replica == "" || r.Replica == last {
			continue
		}
		what := ""
		switch {
		case ev.Kind == markers.KindCreate:
			what = "accepted by replica " + r.Replica
		case strings.HasPrefix(ev.Note, "taken over by replica "):
			what = ev.Note
		case ev.Kind == markers.KindTransition:
			what = fmt.Sprintf("%s by replica %s", ev.To, r.Replica)
		default:
			what = "driven by replica " + r.Replica
		}
		out = append(out, api.ReplicaStep{At: ev.At, Replica: r.Replica, What: what})
		last = r.Replica
	}
	return out
}

func answerOutcome(inv *api.Investigation) string {
	o := inv.Outcome
	var b strings.Builder
	switch {
	case o.ExitCode != nil:
		fmt.Fprintf(&b, "Yes: the bastion observed exit %d", *o.ExitCode)
	case o.Signal != "":
		fmt.Fprintf(&b, "Yes: the bastion observed signal %s", o.Signal)
	case o.HTTPStatus != 0:
		fmt.Fprintf(&b, "Yes: the bastion observed HTTP %d", o.HTTPStatus)
	case markers.State(o.State) == markers.Unknown:
		b.WriteString("No: the outcome is unknown")
	default:
		fmt.Fprintf(&b, "No exit status or response observed (state %s)", o.State)
	}
	if o.ObservedAt != nil {
		fmt.Fprintf(&b, " at %s", stamp(*o.ObservedAt))
	}
	fmt.Fprintf(&b, "; state %s. %s.", o.State, o.MarkerNote)
	return b.String()
}

func answerDelivery(inv *api.Investigation) string {
	d := inv.Delivery
	rec := inv.Record
	var b strings.Builder
	for _, dl := range d.Deliveries {
		fmt.Fprintf(&b, "Delivered %s to %s. ", stamp(dl.At), callText(dl.Call))
	}
	for _, f := range d.Failures {
		fmt.Fprintf(&b, "Not delivered %s to %s: %s. ", stamp(f.At), callText(f.Call), f.Note)
	}
	for _, r := range d.Revocations {
		fmt.Fprintf(&b, "Delivery revoked %s: %s. ", stamp(r.At), r.Note)
	}
	switch {
	case d.DeliveredAt != nil:
		fmt.Fprintf(&b, "The result counts as delivered (%s): an identical call after it is a new intent.", stamp(*d.DeliveredAt))
	case rec.FleetRun != "" && markers.JournalGraph.Terminal(rec.State):
		fmt.Fprintf(&b, "Its result was not read on its own: it is one host's part of fleet run %s, whose answer carries its state and cause (execution_output on %s reads its output).", rec.FleetRun, rec.ID)
	case rec.State == markers.Completed:
		b.WriteString("Yes: the target completed but the result is not delivered (completed_result_not_delivered); a retry replays it.")
	case markers.JournalGraph.Terminal(rec.State):
		fmt.Fprintf(&b, "No result was delivered (it ended %s).", rec.State)
	default:
		fmt.Fprintf(&b, "Not yet: it is %s.", rec.State)
	}
	return strings.TrimSpace(b.String())
}

func answerLater(inv *api.Investigation) string {
	var b strings.Builder
	first := true
	for _, c := range inv.Calls {
		if first && len(inv.Siblings) > 0 && c.ExecutionID == inv.Siblings[0].ExecutionID && (c.Match == string(intent.NewExecution) || c.Match == "") {
			first = false
			continue
		}
		first = false
		fmt.Fprintf(&b, "\n  %s %s: %s", stamp(c.At), callText(&c.Call), c.What)
	}
	later := b.String()
	var out strings.Builder
	if later == "" {
		out.WriteString("No later call.")
	} else {
		out.WriteString("Later calls:" + later)
	}
	if len(inv.Siblings) > 1 {
		fmt.Fprintf(&out, "\nExecutions of this intent (same actor, scope and fingerprint, or idempotency key):")
		for _, s := range inv.Siblings {
			fmt.Fprintf(&out, "\n  %s %s, accepted %s", s.ExecutionID, s.State, stamp(s.AcceptedAt))
			if s.DeliveredAt != nil {
				fmt.Fprintf(&out, ", delivered %s", stamp(*s.DeliveredAt))
			}
			if s.PreviousAttempt != "" {
				fmt.Fprintf(&out, ", new attempt of %s", s.PreviousAttempt)
			}
		}
	} else {
		out.WriteString("\nNo other execution of this intent.")
	}
	return out.String()
}

// callText names a call: its JSON-RPC id, transport and run.
func callText(c *markers.Call) string {
	if c == nil {
		return "a call the journal did not record"
	}
	s := "call " + dash(c.RequestID) + " (" + c.Transport
	if c.Run != "" {
		s += ", " + c.Run
	}
	if c.Subject != "" {
		s += ", subject " + c.Subject
	}
	if c.Replica != "" {
		s += ", replica " + c.Replica
	}
	return s + ")"
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
