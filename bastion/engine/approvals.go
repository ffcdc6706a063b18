package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/markers"
)

// Approval is evidence, not idempotency (docs/design.md): an operator's decision is journaled on
// the execution it concerns, with the operator's identity, and a retry of that execution
// shows the record — it never opens a second approval.

// maxNoteBytes bounds an operator's note or reason.
const maxNoteBytes = 1024

func checkNote(what, s string, required bool) error {
	switch {
	case required && strings.TrimSpace(s) == "":
		return api.Invalid("%s is required", what)
	case len(s) > maxNoteBytes || !utf8.ValidString(s) || strings.ContainsAny(s, "\x00\r"):
		return api.Invalid("%s must be UTF-8 text of at most %d bytes", what, maxNoteBytes)
	}
	return nil
}

// Approve authorizes an execution awaiting approval and dispatches it, when op may decide
// it (operatorRefusal).
func (b *Engine) Approve(ctx context.Context, op api.Operator, id, note string) (*markers.Record, error) {
	return b.approve(ctx, op.Name, &op, id, note)
}

// approve journals who's approval and dispatches the execution. op is the operator to check
// (checkOperator); nil for the agent's user answering in the client, whose class allows it.
func (b *Engine) approve(ctx context.Context, who string, op *api.Operator, id, note string) (*markers.Record, error) {
	switch {
	case b.readOnly:
		return nil, errReadOnly
	case b.held:
		return nil, errHeld("approving sends it (deny and review work now)")
	}
	if op != nil {
		if err := b.checkOperator(*op, id, "approve"); err != nil {
			return nil, err
		}
	}
	if err := checkNote("note", note, false); err != nil {
		return nil, err
	}
	msg := "approved by " + who
	if note != "" {
		msg += ": " + note
	}
	rec, err := b.records.approval(ctx, id, markers.Authorized, msg)
	if err != nil {
		return nil, err
	}
	b.drivers.start(rec)
	return rec, nil
}

// Deny rejects an execution awaiting approval; a retry of it returns this rejection. Anyone
// the operator socket admits may deny: a denial runs nothing.
func (b *Engine) Deny(ctx context.Context, op api.Operator, id, reason string) (*markers.Record, error) {
	return b.deny(ctx, op.Name, id, reason)
}

func (b *Engine) deny(ctx context.Context, who, id, reason string) (*markers.Record, error) {
	if b.readOnly {
		return nil, errReadOnly
	}
	if err := checkNote("reason", reason, true); err != nil {
		return nil, err
	}
	return b.records.approval(ctx, id, markers.Rejected, "denied by "+who+": "+reason)
}

// PendingApprovals lists the executions awaiting a decision, oldest first, as whoever
// decides them sees them.
func (b *Engine) PendingApprovals(limit int) (*api.ApprovalPage, error) {
	recs, _, err := b.journal.List(markers.Query{State: markers.AwaitingApproval, Limit: limit})
	if err != nil {
		return nil, err
	}
	page := &api.ApprovalPage{Approvals: make([]*api.ApprovalRequest, 0, len(recs))}
	for _, r := range recs {
		page.Approvals = append(page.Approvals, b.approvalRequest(r))
	}
	return page, nil
}

// approvalRequest is rec, awaiting approval, as whoever decides it sees it.
func (c *core) approvalRequest(rec *markers.Record) *api.ApprovalRequest {
	what := commandLine(rec)
	if rec.Channel == "http" {
		what = strings.TrimSpace(rec.Target)
	}
	r := &api.ApprovalRequest{
		ExecutionID: rec.ID, Actor: rec.Actor, Run: rec.IntentScope, Host: rec.Host, Class: rec.Class,
		What: what, Reason: rec.Reason, Rule: rec.Rule,
		Decide: fmt.Sprintf("postern approve %s [--note TEXT], or postern deny %s --reason TEXT (state dir %s)", rec.ID, rec.ID, c.cfg.StateDir),
	}
	if rec.IsFleetRun() {
		r.Host = fmt.Sprintf("%d hosts", len(rec.Fleet.Hosts))
		for _, h := range rec.Fleet.Hosts {
			r.Hosts = append(r.Hosts, h.Name)
		}
	}
	if since, ok := rec.StateTimes[markers.AwaitingApproval]; ok {
		r.Requested = since
		if timeout := c.current().cfg.ApprovalTimeout; timeout > 0 {
			r.Expires = since.Add(timeout)
		}
	}
	return r
}

// Review records what an operator verified about an execution whose outcome Postern cannot
// settle (verdict.Reviewable): "completed" (it took effect) or "not-run" (it did not: only this permits
// a new execution of the same intent, since a failed execution no longer matches).
func (b *Engine) Review(ctx context.Context, op api.Operator, id, outcome, note string) (*markers.Record, error) {
	if b.readOnly {
		return nil, errReadOnly
	}
	if err := b.checkOperator(op, id, "review"); err != nil {
		return nil, err
	}
	operator := op.Name
	if err := checkNote("note", note, true); err != nil {
		return nil, err
	}
	var to markers.State
	var msg string
	switch outcome {
	case "completed":
		to, msg = markers.Completed, "reviewed by "+operator+": it took effect: "+note
	case "not-run":
		to, msg = markers.Failed, "reviewed by "+operator+": it did not run: "+note
	default:
		return nil, api.Invalid("outcome must be completed or not-run")
	}
	cur, err := b.journal.Get(id)
	switch {
	case errors.Is(err, markers.ErrNotFound):
		return nil, &api.ToolError{Code: api.CodeNotFound, Message: "no execution " + id}
	case err != nil:
		return nil, journalError(err)
	}
	driven := b.drivers.live(id) != nil
	if !verdict.Reviewable(cur.State, driven) {
		why := "Postern is still carrying it to an outcome (cancel it, or wait)"
		switch {
		case markers.JournalGraph.Terminal(cur.State):
			why = "its outcome is known"
		case cur.State == markers.AwaitingApproval:
			why = "it awaits approval (approve or deny it)"
		}
		return cur, fmt.Errorf("%w: %s is %s: %s", api.ErrNotReviewable, id, cur.State, why)
	}
	rec, err := b.records.reviewed(ctx, id, cur.State, to, msg)
	switch {
	case errors.Is(err, markers.ErrConflict):
		return rec, fmt.Errorf("%w: %s is %s now", api.ErrNotReviewable, id, rec.State)
	case err != nil:
		return nil, journalError(err)
	}
	return rec, nil
}

// checkOperator refuses a decision that lets execution id run (approve) or settles it
// (review) when op is not trusted to make it (operatorRefusal), saying why and what to do.
func (b *Engine) checkOperator(op api.Operator, id, verb string) error {
	caller := -1
	if rec, err := b.journal.Get(id); err == nil {
		if run, err := b.journal.Run(rec.Actor, rec.IntentScope); err == nil && run.UID != nil {
			caller = *run.UID
		}
	}
	why, err := b.operatorRefused(op, caller)
	if err != nil || why == "" {
		return err
	}
	who := "an operator whose uid could not be read"
	if op.UID >= 0 {
		who = fmt.Sprintf("uid %d (%s)", op.UID, strings.TrimPrefix(op.Name, "operator:"))
	}
	return &api.ToolError{Code: api.CodeNotAnOperator, ExecutionID: id, Message: fmt.Sprintf(
		"%s may not %s %s: %s. %s as another user or root (sudo postern %s %s --state-dir %s), or name who may in [approvals] operators",
		who, verb, id, why, strings.ToUpper(verb[:1])+verb[1:], verb, id, b.cfg.StateDir)}
}

// operatorRefused is operatorRefusal with this bastion's operators and agents: "" when op
// is trusted with a decision that lets a command run, else why not. caller is the uid whose
// agent made the call decided on (-1: none, or a remote caller).
func (b *Engine) operatorRefused(op api.Operator, caller int) (string, error) {
	cfg := b.current().cfg
	named, err := cfg.Approvals.OperatorUIDs()
	if err != nil {
		return "", err
	}
	agents := map[int]string{os.Getuid(): "the bastion's own user"}
	for _, a := range cfg.Actors {
		if a.UID != nil {
			agents[*a.UID] = "the uid of local actor " + a.Name
		}
	}
	return operatorRefusal(op, named, caller, agents), nil
}

// operatorRefusal decides whether an operator's approve or review is taken: "" when it is,
// else why not. Same-uid processes cannot be told apart, so a decision that lets a command
// run must not come from a uid an agent runs as — its own shell could send it. named are
// the uids [approvals] operators trusts: then those decide and no other (whoever wrote the
// config vouches that no agent runs as them). Without it, every uid the socket admits
// decides except one an agent may run as: caller, the uid whose agent made the execution's
// call (-1: a remote caller), and agents, with what makes each one (the bastion's own user,
// a local actor's).
func operatorRefusal(op api.Operator, named []int, caller int, agents map[int]string) string {
	switch {
	case op.UID < 0:
		return "its uid could not be read"
	case len(named) > 0 && slices.Contains(named, op.UID):
		return ""
	case len(named) > 0:
		return "it is not one of [approvals] operators"
	case op.UID == caller:
		return "it is the uid whose agent made this call, and an agent does not approve its own call"
	case agents[op.UID] != "":
		return "it is " + agents[op.UID] + ", so an agent may run as it, and any process of it — the agent's own shell included — can reach the operator socket"
	}
	return ""
}
