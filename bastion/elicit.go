package bastion

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// Approvals in the client (elicitation). The daemon's MCP endpoints are stateless, so the
// daemon cannot send a request to a client; the stdio bridge can — it is the client's own
// stdio session. So the daemon offers, the bridge asks:
//
//  1. A bridged call (a kernel-verified `postern mcp`) whose client declared elicitation
//     (BridgeElicitationHeader) and that leaves an execution awaiting approval gets an offer
//     in its result's _meta (transport.MetaApprovalOffer) — once per execution: the offer is
//     journaled before it leaves, and an execution with an offer in its events is never
//     offered again, so a retry of it never asks again.
//  2. The bridge asks the client's user with an elicitation form (approve or deny, a note),
//     and sends the answer to the daemon as transport.MethodApproval — a JSON-RPC method, not
//     a tool, so the model cannot call it through its client, and one the bridge refuses
//     from its client, so only the answer to its own question reaches the daemon.
//  3. The daemon journals it as a decision by "the agent's user, by elicitation" — only for
//     the actor and agent run of the execution, only with the offer's token, only for a class
//     that allows it (operator_approval_only, default true for irreversible). The operator CLI
//     decides as before; the first decision wins (a compare-and-set on awaiting_approval).
//
// The token is a random secret in the offer, which only the bridge sees (it strips the offer
// before its client does): the kernel proves that a connection comes from a child of the
// agent, not that it is that bridge, so without it any process the agent started — a shell
// its model runs — could send the decision while the user is being asked. The daemon keeps
// the token's hash in memory only: after a restart an offered execution waits for an
// operator.
//
// Trust: the answer is as good as the client that relays it, which is what MCP elicitation
// means on any transport; classes whose approvals must not rest on the agent's machine keep
// operator_approval_only.

// approvalOfferedNote is the journal event note of an offer.
const approvalOfferedNote = "approval asked of the agent's user by elicitation"

// askable reports whether x is an execution a client's user may be asked to approve.
func (b *Bastion) askable(ctx context.Context, x *api.Execution) bool {
	return x != nil && x.State == string(markers.AwaitingApproval) && !tasks.Creating(ctx) && b.classes.InBandApproval(x.Class)
}

// offerApproval returns the offer to attach to a bridged call's result, or nil: x awaits
// approval and the caller is a stdio bridge of the daemon's own binary whose client declared
// elicitation.
func (b *Bastion) offerApproval(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, x *api.Execution) map[string]any {
	if !c.Local || !c.BridgeBinary || req.Extra == nil || req.Extra.Header.Get(transport.BridgeElicitationHeader) != "form" || !b.askable(ctx, x) {
		return nil
	}
	rec := b.offer(ctx, c, x.ExecutionID)
	if rec == nil {
		return nil
	}
	return map[string]any{"execution_id": rec.ID, "message": approvalMessage(rec), "token": b.offers.issue(rec.ID, b.now())}
}

// offerTokenTTL bounds how long an offer's token is kept for an execution nobody decides.
const offerTokenTTL = 24 * time.Hour

// offerTokens are the tokens of the offers made, by execution id, as SHA-256 hashes.
type offerTokens struct {
	mu sync.Mutex
	m  map[string]offerToken
}

type offerToken struct {
	sum [sha256.Size]byte
	at  time.Time
}

// issue makes the token of execution id's offer, dropping tokens older than offerTokenTTL.
func (o *offerTokens) issue(id string, now time.Time) string {
	token := rand.Text()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]offerToken{}
	}
	for k, t := range o.m {
		if now.Sub(t.at) > offerTokenTTL {
			delete(o.m, k)
		}
	}
	o.m[id] = offerToken{sum: sha256.Sum256([]byte(token)), at: now}
	return token
}

// redeem reports whether token is execution id's, and forgets it if so: a token decides once.
func (o *offerTokens) redeem(id, token string) bool {
	sum := sha256.Sum256([]byte(token))
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.m[id]
	if !ok || subtle.ConstantTimeCompare(t.sum[:], sum[:]) != 1 {
		return false
	}
	delete(o.m, id)
	return true
}

// offer journals that the approval of execution id is asked of the agent's user, unless it
// was before (then, or on a failed write, nil: nothing is asked).
func (b *Bastion) offer(ctx context.Context, c transport.Caller, id string) *markers.Record {
	defer b.intake.Lock("e\x00" + id)()
	offered, err := b.approvalOffered(id)
	if err != nil || offered {
		return nil
	}
	rec, err := b.journal.UpdateFor(context.WithoutCancel(ctx), id, approvalOfferedNote, b.newCall(ctx, c, intent.Scope(c, ""), "", false), markers.Sync, func(r *markers.Record) error {
		if r.State != markers.AwaitingApproval {
			return errNoOffer
		}
		r.Evidence = appendBounded(r.Evidence, approvalOfferedNote+"; an operator may still decide")
		return nil
	})
	if err != nil {
		if !errors.Is(err, errNoOffer) {
			b.log.Error("journal approval offer", "execution_id", id, "err", err)
		}
		return nil
	}
	return rec
}

// sessionElicits reports whether ss is a stateful session (it has an id) whose client
// declared elicitation: the daemon can ask it itself.
func sessionElicits(ss *mcp.ServerSession) bool {
	if ss == nil || ss.ID() == "" {
		return false
	}
	p := ss.InitializeParams()
	return p != nil && p.Capabilities != nil && p.Capabilities.Elicitation != nil
}

// askInSession asks the user of a stateful Streamable HTTP session about x (elicitation,
// within the call) and journals the answer; it reports whether a decision was journaled.
func (b *Bastion) askInSession(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, x *api.Execution) bool {
	if c.Local || !sessionElicits(req.Session) || !b.askable(ctx, x) {
		return false
	}
	rec := b.offer(ctx, c, x.ExecutionID)
	if rec == nil {
		return false
	}
	// A client that never answers does not hold the call past the approval timeout, when
	// the execution would be rejected anyway.
	if b.cfg.ApprovalTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.cfg.ApprovalTimeout)
		defer cancel()
	}
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: approvalMessage(rec), RequestedSchema: transport.ApprovalSchema})
	if err != nil {
		b.log.Info("approval by elicitation not answered; an operator decides", "execution_id", rec.ID, "err", err)
		return false
	}
	decision, _ := res.Content["decision"].(string)
	note, _ := res.Content["note"].(string)
	if res.Action != "accept" {
		return false
	}
	if _, err := b.decideElicited(ctx, c, rec, decision, note); err != nil {
		b.log.Info("approval by elicitation not journaled", "execution_id", rec.ID, "err", err)
		return false
	}
	return true
}

var errNoOffer = errors.New("bastion: no longer awaiting approval")

func (b *Bastion) approvalOffered(id string) (bool, error) {
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

// approvalMessage is what the client's user is asked.
func approvalMessage(rec *markers.Record) string {
	what := commandLine(rec)
	if rec.Channel == "http" {
		what = strings.TrimSpace(rec.Target)
	}
	return fmt.Sprintf("Postern: %s asks to run on %s (class %s):\n\n%s\n\nPolicy requires an approval before it runs (execution %s). Approve or deny; an operator can also decide with `postern approve`.",
		rec.Actor, rec.Host, rec.Class, what, rec.ID)
}

// approvalParams are the params of transport.MethodApproval.
type approvalParams struct {
	mcp.ParamsBase
	ExecutionID string `json:"execution_id"`
	Decision    string `json:"decision"`
	Note        string `json:"note,omitempty"`
	// Token is the offer's (offerTokens).
	Token string `json:"token"`
}

type approvalResult struct {
	mcp.ResultBase
	ExecutionID string `json:"execution_id"`
	State       string `json:"state"`
}

type approvalExtraKey struct{}

// installElicitedApprovals registers transport.MethodApproval on srv.
func (b *Bastion) installElicitedApprovals(srv *mcp.Server) error {
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == transport.MethodApproval {
				ctx = context.WithValue(ctx, approvalExtraKey{}, req.GetExtra())
			}
			return next(ctx, method, req)
		}
	})
	return mcp.AddReceivingCustomMethod(srv, transport.MethodApproval, func(ctx context.Context, _ *mcp.ServerSession, p *approvalParams) (*approvalResult, error) {
		extra, _ := ctx.Value(approvalExtraKey{}).(*mcp.RequestExtra)
		c, err := taskBackend{b}.caller(extra)
		if err != nil {
			return nil, err
		}
		if p == nil {
			p = &approvalParams{}
		}
		rec, err := b.ElicitedDecision(ctx, c, p.ExecutionID, p.Decision, p.Note, p.Token)
		if err != nil {
			return nil, err
		}
		return &approvalResult{ExecutionID: rec.ID, State: string(rec.State)}, nil
	})
}

// ElicitedDecision journals a decision the agent's user took in the client, relayed by the
// stdio bridge that was offered it (token is the offer's): decision is approve or deny.
func (b *Bastion) ElicitedDecision(ctx context.Context, c transport.Caller, id, decision, note, token string) (*markers.Record, error) {
	rec, err := b.own(c, id)
	if err != nil {
		return nil, err
	}
	switch {
	case !c.Local || !c.Bridged || rec.IntentScope != intent.Scope(c, ""):
		return nil, &api.ToolError{Code: "not_offered", ExecutionID: id, Message: "only the stdio bridge of the agent run that made the execution relays its user's decision"}
	case !b.classes.InBandApproval(rec.Class):
		return nil, &api.ToolError{Code: "operator_approval_only", ExecutionID: id, Message: "approvals of class " + rec.Class + " are decided by an operator only (`postern approve`)"}
	}
	offered, err := b.approvalOffered(id)
	if err != nil {
		return nil, journalError(err)
	}
	if !offered || !b.offers.redeem(id, token) {
		return nil, &api.ToolError{Code: "not_offered", ExecutionID: id, Message: "no approval was asked of this bridge's user for " + id}
	}
	return b.decideElicited(ctx, c, rec, decision, note)
}

// decideElicited journals the decision of the agent's user on rec.
func (b *Bastion) decideElicited(ctx context.Context, c transport.Caller, rec *markers.Record, decision, note string) (*markers.Record, error) {
	id := rec.ID
	who := fmt.Sprintf("the agent's user, by elicitation (%s, %s)", c.Actor, rec.IntentScope)
	switch decision {
	case "approve":
		return b.Approve(ctx, who, id, note)
	case "deny":
		if strings.TrimSpace(note) == "" {
			note = "denied in the client"
		}
		return b.Deny(ctx, who, id, note)
	}
	return nil, api.Invalid("decision must be approve or deny")
}
