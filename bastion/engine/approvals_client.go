package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// Approvals asked of the agent's user in the client (elicitation; bastion/mcpserver asks
// and relays). The engine journals that the approval was asked — once per execution, so a
// retry never asks again — and the user's decision, only for the actor (and, through a
// bridge, the agent run) of the execution and only for a class that allows it
// (operator_approval_only = false; by default none does). An operator may decide as well;
// the first decision wins (a compare-and-set on awaiting_approval).

// approvalOfferedNote is the journal event note of an offer.
const approvalOfferedNote = "approval asked of the agent's user by elicitation"

var errNoOffer = errors.New("bastion: no longer awaiting approval")

// AskInClient journals that the approval of execution id is asked of the user of c's client
// and returns the request, or nil when it may not be asked: it no longer awaits approval,
// its class keeps approvals with operators, or it was asked before.
func (b *Engine) AskInClient(ctx context.Context, c transport.Caller, id string) (*api.ApprovalRequest, error) {
	cur, err := b.views.own(c, id)
	if err != nil || cur.State != markers.AwaitingApproval || !b.inBandApproval(cur) {
		return nil, nil
	}
	defer b.intake.locks.Lock("e\x00" + id)()
	offered, err := b.approvalOffered(id)
	if err != nil || offered {
		return nil, nil
	}
	rec, err := b.records.offered(ctx, id, b.records.call(ctx, c, intent.Scope(c, ""), "", false))
	if errors.Is(err, errNoOffer) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return b.approvalRequest(rec), nil
}

// inBandApproval reports whether rec's approval may be asked in the client: its class
// allows it — for a fleet run, the class of every host that needs the approval.
func (b *Engine) inBandApproval(rec *markers.Record) bool {
	classes := b.current().classes
	if !rec.IsFleetRun() {
		return classes.InBandApproval(rec.Class)
	}
	for _, h := range rec.Fleet.Hosts {
		if h.Decision == string(policy.AwaitingApproval) && !classes.InBandApproval(h.Class) {
			return false
		}
	}
	return true
}

func (b *Engine) approvalOffered(id string) (bool, error) {
	events, err := b.journal.Events(id)
	if err != nil {
		return false, err
	}
	for _, e := range events {
		if e.Note == approvalOfferedNote {
			return true, nil
		}
	}
	return false, nil
}

// DecideInClient journals the decision ("approve" or "deny") the user of c's client took on
// execution id, whose approval was asked of them (AskInClient). redeem is set when a stdio
// bridge relays the decision: then only the bridge of the execution's own agent run may,
// and redeem, called once every other check passed, must confirm the offer's token.
func (b *Engine) DecideInClient(ctx context.Context, c transport.Caller, id, decision, note string, redeem func() bool) (*api.Execution, error) {
	rec, err := b.views.own(c, id)
	if err != nil {
		return nil, err
	}
	switch {
	case redeem != nil && (!c.Local || !c.Bridged || rec.IntentScope != intent.Scope(c, "")):
		return nil, &api.ToolError{Code: api.CodeNotOffered, ExecutionID: id, Message: "only the stdio bridge of the agent run that made the execution relays its user's decision"}
	case !b.inBandApproval(rec):
		return nil, &api.ToolError{Code: api.CodeOperatorApprovalOnly, ExecutionID: id, Message: "approvals of class " + rec.Class + " are decided by an operator only (`postern approve`)"}
	}
	offered, err := b.approvalOffered(id)
	if err != nil {
		return nil, journalError(err)
	}
	if !offered || (redeem != nil && !redeem()) {
		return nil, &api.ToolError{Code: api.CodeNotOffered, ExecutionID: id, Message: "no approval was asked of this bridge's user for " + id}
	}
	who := fmt.Sprintf("the agent's user, by elicitation (%s, %s)", c.Actor, rec.IntentScope)
	switch decision {
	case "approve":
		rec, err = b.approve(ctx, who, nil, id, note)
	case "deny":
		if strings.TrimSpace(note) == "" {
			note = "denied in the client"
		}
		rec, err = b.deny(ctx, who, id, note)
	default:
		return nil, api.Invalid("decision must be approve or deny")
	}
	if err != nil {
		return nil, err
	}
	return b.views.view(rec), nil
}
