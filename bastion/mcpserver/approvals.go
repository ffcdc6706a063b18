package mcpserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
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
//     in its result's _meta (transport.MetaApprovalOffer) — once per execution: the engine
//     journals the offer before it leaves, and never offers an execution twice, so a retry
//     of it never asks again.
//  2. The bridge asks the client's user with an elicitation form (approve or deny, a note),
//     and sends the answer to the daemon as transport.MethodApproval — a JSON-RPC method, not
//     a tool, so the model cannot call it through its client, and one the bridge refuses
//     from its client, so only the answer to its own question reaches the daemon.
//  3. The engine journals it as a decision by "the agent's user, by elicitation" — only for
//     the actor and agent run of the execution, only with the offer's token, only for a class
//     that allows it (operator_approval_only, default true for irreversible). The operator CLI
//     decides as before; the first decision wins (a compare-and-set on awaiting_approval).
//
// The token is a random secret in the offer, which only the bridge sees (it strips the offer
// before its client does): the kernel proves that a connection comes from a child of the
// agent, not that it is that bridge, so without it any process the agent started — a shell
// its model runs — could send the decision while the user is being asked. The server keeps
// the token's hash in memory only: after a restart an offered execution waits for an
// operator.
//
// A stateful Streamable HTTP session (http_sessions) whose client declared elicitation is
// asked by the server itself, within the call (askInSession).
//
// Trust: the answer is as good as the client that relays it, which is what MCP elicitation
// means on any transport; classes whose approvals must not rest on the agent's machine keep
// operator_approval_only.

// askable reports whether x is an execution a client's user may be asked to approve: it
// awaits approval, and the call is not a task-augmented one (which answers with the task).
func askable(ctx context.Context, x *api.Execution) bool {
	return x != nil && x.State == string(markers.AwaitingApproval) && !tasks.Creating(ctx)
}

// offerApproval returns the offer to attach to a bridged call's result, or nil: x awaits
// approval, the caller is a stdio bridge of the daemon's own binary whose client declared
// elicitation, and the engine asks (once per execution, for a class that allows it).
func (s *server) offerApproval(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, x *api.Execution) map[string]any {
	if !c.Local || !c.BridgeBinary || req.Extra == nil || req.Extra.Header.Get(transport.BridgeElicitationHeader) != "form" || !askable(ctx, x) {
		return nil
	}
	ask := s.ask(ctx, c, x.ExecutionID)
	if ask == nil {
		return nil
	}
	return map[string]any{"execution_id": ask.ExecutionID, "message": ask.Message(), "token": s.offers.issue(ask.ExecutionID, s.now())}
}

// ask is the engine's AskInClient, nil when it does not ask (or could not journal the ask).
func (s *server) ask(ctx context.Context, c transport.Caller, id string) *api.ApprovalRequest {
	ask, err := s.engine.AskInClient(ctx, c, id)
	if err != nil {
		s.log.Error("journal approval offer", "execution_id", id, "err", err)
		return nil
	}
	return ask
}

// offerTokenTTL bounds how long an offer's token is kept for an execution nobody decides.
const offerTokenTTL = 24 * time.Hour

// offerTokens are the tokens of the offers made, by execution id, as SHA-256 hashes.
type offerTokens struct {
	mu sync.Mutex // guards m
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

// redeem reports whether token is execution id's and was issued at most offerTokenTTL before
// now, and forgets it if so: a token decides once.
func (o *offerTokens) redeem(id, token string, now time.Time) bool {
	sum := sha256.Sum256([]byte(token))
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.m[id]
	if !ok || subtle.ConstantTimeCompare(t.sum[:], sum[:]) != 1 || now.Sub(t.at) > offerTokenTTL {
		return false
	}
	delete(o.m, id)
	return true
}

// statelessProtocol is the first protocol version without server-initiated requests.
const statelessProtocol = "2026-07-28"

// sessionElicits reports whether ss is a stateful session (it has an id) whose client
// declared form elicitation (an empty elicitation object means form, as before modes
// existed; the bridge decides the same): the daemon can ask it itself. A client that takes
// only url elicitation cannot be sent the approval form, and the engine journals an ask.
func sessionElicits(ss *mcp.ServerSession) bool {
	if ss == nil || ss.ID() == "" {
		return false
	}
	p := ss.InitializeParams()
	// From protocol 2026-07-28 on a server sends no requests of its own (go-sdk refuses).
	if p == nil || p.Capabilities == nil || p.ProtocolVersion >= statelessProtocol {
		return false
	}
	e := p.Capabilities.Elicitation
	return e != nil && (e.Form != nil || e.URL == nil)
}

// askInSession asks the user of a stateful Streamable HTTP session about x (elicitation,
// within the call) and journals the answer; it reports whether a decision was journaled.
func (s *server) askInSession(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, x *api.Execution) bool {
	if c.Local || !sessionElicits(req.Session) || !askable(ctx, x) {
		return false
	}
	ask := s.ask(ctx, c, x.ExecutionID)
	if ask == nil {
		return false
	}
	// A client that never answers does not hold the call past the request's expiry, when the
	// execution would be rejected anyway.
	if !ask.Expires.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ask.Expires)
		defer cancel()
	}
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: ask.Message(), RequestedSchema: transport.ApprovalSchema})
	if err != nil {
		s.log.Info("approval by elicitation not answered; an operator decides", "execution_id", ask.ExecutionID, "err", err)
		return false
	}
	decision, _ := res.Content["decision"].(string)
	note, _ := res.Content["note"].(string)
	if res.Action != "accept" {
		return false
	}
	if _, err := s.engine.DecideInClient(ctx, c, ask.ExecutionID, decision, note, nil); err != nil {
		s.log.Info("approval by elicitation not journaled", "execution_id", ask.ExecutionID, "err", err)
		return false
	}
	return true
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

// installApprovals registers transport.MethodApproval: a decision of the agent's user,
// relayed by the stdio bridge that was offered it.
func (s *server) installApprovals() error {
	s.srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == transport.MethodApproval {
				ctx = context.WithValue(ctx, approvalExtraKey{}, req.GetExtra())
			}
			return next(ctx, method, req)
		}
	})
	return mcp.AddReceivingCustomMethod(s.srv, transport.MethodApproval, func(ctx context.Context, _ *mcp.ServerSession, p *approvalParams) (*approvalResult, error) {
		extra, _ := ctx.Value(approvalExtraKey{}).(*mcp.RequestExtra)
		c, err := callerOf(extra)
		if err != nil {
			return nil, err
		}
		if p == nil {
			p = &approvalParams{}
		}
		redeem := func() bool { return s.offers.redeem(p.ExecutionID, p.Token, s.now()) }
		x, err := s.engine.DecideInClient(ctx, c, p.ExecutionID, p.Decision, p.Note, redeem)
		if err != nil {
			return nil, err
		}
		return &approvalResult{ExecutionID: x.ExecutionID, State: x.State}, nil
	})
}
