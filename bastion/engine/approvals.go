package engine

import (
	"context"
	"errors"
	"fmt"
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

// Approve authorizes an execution awaiting approval and dispatches it.
func (b *Engine) Approve(ctx context.Context, operator, id, note string) (*markers.Record, error) {
	switch {
	case b.readOnly:
		return nil, errReadOnly
	case b.held:
		return nil, errHeld("approving sends it (deny and review work now)")
	}
	if err := checkNote("note", note, false); err != nil {
		return nil, err
	}
	msg := "approved by " + operator
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

// Deny rejects an execution awaiting approval; a retry of it returns this rejection.
func (b *Engine) Deny(ctx context.Context, operator, id, reason string) (*markers.Record, error) {
	if b.readOnly {
		return nil, errReadOnly
	}
	if err := checkNote("reason", reason, true); err != nil {
		return nil, err
	}
	return b.records.approval(ctx, id, markers.Rejected, "denied by "+operator+": "+reason)
}

// PendingApprovals lists the executions awaiting an operator's decision, oldest first.
func (b *Engine) PendingApprovals(limit int) ([]*markers.Record, error) {
	recs, _, err := b.journal.List(markers.Query{State: markers.AwaitingApproval, Limit: limit})
	return recs, err
}

// Review records what an operator verified about an execution whose outcome Postern cannot
// settle (verdict.Reviewable): "completed" (it took effect) or "not-run" (it did not: only this permits
// a new execution of the same intent, since a failed execution no longer matches).
func (b *Engine) Review(ctx context.Context, operator, id, outcome, note string) (*markers.Record, error) {
	if b.readOnly {
		return nil, errReadOnly
	}
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
