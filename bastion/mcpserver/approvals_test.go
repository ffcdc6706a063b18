package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// formHeader is the header of a tools/call whose bridge's client declared elicitation.
var formHeader = http.Header{transport.BridgeElicitationHeader: {"form"}}

// askOf is the approval request the tests' engines ask of the user for execution id.
func askOf(id string) *api.ApprovalRequest {
	return &api.ApprovalRequest{ExecutionID: id, Actor: "local:alice", Host: "h1", Class: "irreversible", What: "make deploy"}
}

// offerOf decodes the approval offer of a result, nil when there is none.
func offerOf(t testing.TB, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.Meta[transport.MetaApprovalOffer] == nil {
		return nil
	}
	return decode[map[string]any](t, res.Meta[transport.MetaApprovalOffer])
}

// TestOffer: a call's result carries an approval offer only for a stdio bridge of the
// daemon's own binary whose client declared form elicitation, when the call that started
// work left its execution awaiting approval and the engine asks (it journals the ask, once
// per execution). The offer is the engine's request: its message and a token.
func TestOffer(t *testing.T) {
	notOurBinary := bridgedCaller
	notOurBinary.BridgeBinary = false
	tests := []struct {
		name    string
		caller  transport.Caller
		header  http.Header
		tool    string
		state   string
		ask     *api.ApprovalRequest
		askErr  error
		wantAsk bool // the engine's AskInClient is called
		want    bool // an offer is made
	}{
		{name: "ssh_exec of a bridged caller", caller: bridgedCaller, header: formHeader, tool: "ssh_exec", state: "awaiting_approval", ask: askOf("ex_1"), wantAsk: true, want: true},
		{name: "http_request of a bridged caller", caller: bridgedCaller, header: formHeader, tool: "http_request", state: "awaiting_approval", ask: askOf("ex_1"), wantAsk: true, want: true},
		{name: "the engine does not ask", caller: bridgedCaller, header: formHeader, tool: "ssh_exec", state: "awaiting_approval", wantAsk: true},
		{name: "the engine cannot journal the ask", caller: bridgedCaller, header: formHeader, tool: "ssh_exec", state: "awaiting_approval", askErr: errors.New("journal down"), wantAsk: true},
		{name: "a remote caller", caller: remoteCaller, header: formHeader, tool: "ssh_exec", state: "awaiting_approval", ask: askOf("ex_1")},
		{name: "a bridge of another binary", caller: notOurBinary, header: formHeader, tool: "ssh_exec", state: "awaiting_approval", ask: askOf("ex_1")},
		{name: "a client without elicitation", caller: bridgedCaller, tool: "ssh_exec", state: "awaiting_approval", ask: askOf("ex_1")},
		{name: "a client with url elicitation only", caller: bridgedCaller, header: http.Header{transport.BridgeElicitationHeader: {"url"}}, tool: "ssh_exec", state: "awaiting_approval", ask: askOf("ex_1")},
		{name: "an execution that needs no approval", caller: bridgedCaller, header: formHeader, tool: "ssh_exec", state: "running", ask: askOf("ex_1")},
		{name: "a decided execution", caller: bridgedCaller, header: formHeader, tool: "ssh_exec", state: "rejected", ask: askOf("ex_1")},
		{name: "execution_status of an awaiting execution", caller: bridgedCaller, header: formHeader, tool: "execution_status", state: "awaiting_approval", ask: askOf("ex_1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := execution("ex_1", tt.state)
			e := &fakeEngine{
				httpEnabled: true,
				exec:        func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) { return x, nil },
				httpRequest: func(context.Context, api.HTTPArgs, func(*api.Execution)) (*api.Execution, error) { return x, nil },
				status:      func(string) (*api.Execution, error) { return x, nil },
				askInClient: func(string) (*api.ApprovalRequest, error) { return tt.ask, tt.askErr },
			}
			cs := connect(t, e, session{caller: &tt.caller, header: tt.header})
			res := callTool(t, cs, tt.tool, toolArgs[tt.tool])
			asks := e.callsTo("AskInClient")
			if got := len(asks) > 0; got != tt.wantAsk {
				t.Errorf("engine asked = %v; want %v", got, tt.wantAsk)
			}
			for _, c := range asks {
				if c.Caller != tt.caller || c.Arg != "ex_1" {
					t.Errorf("AskInClient(%+v, %v); want the transport's caller and ex_1", c.Caller, c.Arg)
				}
			}
			offer := offerOf(t, res)
			if got := offer != nil; got != tt.want {
				t.Fatalf("offered = %v (%v); want %v", got, offer, tt.want)
			}
			if offer == nil {
				return
			}
			if offer["execution_id"] != "ex_1" || offer["message"] != tt.ask.Message() {
				t.Errorf("offer = %v; want ex_1 with the request's message %q", offer, tt.ask.Message())
			}
			if token, _ := offer["token"].(string); len(token) < 16 {
				t.Errorf("offer token = %q; want a random secret", offer["token"])
			}
			if res.IsError || textOf(t, res) != x.Summary() {
				t.Errorf("the offer changed the result: isError %v, %q", res.IsError, textOf(t, res))
			}
		})
	}
}

// TestApprovalByOffer: the bridge relays its user's decision with transport.MethodApproval;
// the engine journals it for the transport's caller only with the offer's token, once:
// a wrong token, another execution's token or a token used before redeems false.
func TestApprovalByOffer(t *testing.T) {
	e := &fakeEngine{
		exec: func(_ context.Context, a api.ExecArgs, _ func(*api.Execution)) (*api.Execution, error) {
			return execution(a.Command, "awaiting_approval"), nil
		},
		askInClient: func(id string) (*api.ApprovalRequest, error) { return askOf(id), nil },
		decideInClient: func(id, _, _ string, redeem func() bool) (*api.Execution, error) {
			if redeem == nil || !redeem() {
				return nil, &api.ToolError{Code: api.CodeNotOffered, Message: "no such offer", ExecutionID: id}
			}
			return execution(id, "authorized"), nil
		},
	}
	cs := connect(t, e, session{caller: &bridgedCaller, header: formHeader})
	tokenOf := func(id string) string {
		offer := offerOf(t, callTool(t, cs, "ssh_exec", map[string]any{"host": "h1", "command": id}))
		token, _ := offer["token"].(string)
		if token == "" {
			t.Fatalf("no offer for %s", id)
		}
		return token
	}
	tokenA, tokenB := tokenOf("ex_a"), tokenOf("ex_b")
	if tokenA == tokenB {
		t.Fatalf("two offers with one token %q", tokenA)
	}

	tests := []struct {
		name         string
		id, token    string
		wantRedeemed bool
	}{
		{"a wrong token", "ex_a", "not-the-token", false},
		{"another execution's token", "ex_a", tokenB, false},
		{"no token", "ex_a", "", false},
		{"the offer's token", "ex_a", tokenA, true},
		{"the offer's token again", "ex_a", tokenA, false},
		{"the other offer's token", "ex_b", tokenB, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(e.callsTo("DecideInClient"))
			res, err := mcp.CallCustomMethod[*approvalParams, *approvalResult](t.Context(), cs, transport.MethodApproval,
				&approvalParams{ExecutionID: tt.id, Decision: "approve", Note: "looks right", Token: tt.token})
			calls := e.callsTo("DecideInClient")
			if len(calls) != before+1 {
				t.Fatalf("DecideInClient calls = %d; want one more than %d", len(calls), before)
			}
			got := calls[len(calls)-1]
			want := engineCall{Method: "DecideInClient", Caller: bridgedCaller,
				Arg: decision{ID: tt.id, Decision: "approve", Note: "looks right", Redeemed: strconv.FormatBool(tt.wantRedeemed)}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("engine call = %+v; want %+v", got, want)
			}
			switch {
			case tt.wantRedeemed && (err != nil || res.ExecutionID != tt.id || res.State != "authorized"):
				t.Errorf("%s = %+v, %v; want %s authorized", transport.MethodApproval, res, err, tt.id)
			case !tt.wantRedeemed && (err == nil || !strings.Contains(err.Error(), api.CodeNotOffered)):
				t.Errorf("%s = %+v, %v; want the engine's not_offered", transport.MethodApproval, res, err)
			}
		})
	}
}

// TestApprovalTokenExpires: an offer's token decides for offerTokenTTL after the offer, not
// later — whether or not another offer was made since.
func TestApprovalTokenExpires(t *testing.T) {
	var mu sync.Mutex
	now := at
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	e := &fakeEngine{
		exec: func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) {
			return execution("ex_1", "awaiting_approval"), nil
		},
		askInClient: func(id string) (*api.ApprovalRequest, error) { return askOf(id), nil },
		decideInClient: func(id, _, _ string, redeem func() bool) (*api.Execution, error) {
			if !redeem() {
				return nil, &api.ToolError{Code: api.CodeNotOffered, Message: "no such offer", ExecutionID: id}
			}
			return execution(id, "authorized"), nil
		},
	}
	cs := connect(t, e, session{caller: &bridgedCaller, header: formHeader, now: clock})
	token, _ := offerOf(t, callTool(t, cs, "ssh_exec", toolArgs["ssh_exec"]))["token"].(string)

	mu.Lock()
	now = now.Add(offerTokenTTL + time.Second)
	mu.Unlock()
	_, err := mcp.CallCustomMethod[*approvalParams, *approvalResult](t.Context(), cs, transport.MethodApproval,
		&approvalParams{ExecutionID: "ex_1", Decision: "approve", Token: token})
	if err == nil {
		t.Errorf("a decision with a token older than %v was journaled", offerTokenTTL)
	}
}

// TestApprovalUnauthenticated: a decision on a request the transport did not identify is
// refused before the engine.
func TestApprovalUnauthenticated(t *testing.T) {
	e := &fakeEngine{}
	cs := connect(t, e, session{header: formHeader})
	_, err := mcp.CallCustomMethod[*approvalParams, *approvalResult](t.Context(), cs, transport.MethodApproval,
		&approvalParams{ExecutionID: "ex_1", Decision: "approve", Token: "t"})
	if err == nil || !strings.Contains(err.Error(), api.CodeUnauthenticated) {
		t.Errorf("%s = %v; want unauthenticated", transport.MethodApproval, err)
	}
	if m := e.methods(); len(m) != 0 {
		t.Errorf("the engine was called: %v", m)
	}
}

// TestOfferTokens: a token decides its own execution once, for offerTokenTTL; a later offer
// for the same execution replaces it; tokens older than offerTokenTTL are dropped when an
// offer is made.
func TestOfferTokens(t *testing.T) {
	var o offerTokens
	a := o.issue("ex_a", at)
	b := o.issue("ex_b", at.Add(time.Hour))
	if o.redeem("ex_a", b, at) {
		t.Error("ex_b's token redeemed for ex_a")
	}
	if !o.redeem("ex_a", a, at.Add(offerTokenTTL)) {
		t.Error("ex_a's token not redeemed")
	}
	if o.redeem("ex_a", a, at) {
		t.Error("ex_a's token redeemed twice")
	}

	old := o.issue("ex_c", at)
	current := o.issue("ex_c", at)
	if o.redeem("ex_c", old, at) {
		t.Error("a replaced token redeemed")
	}
	if !o.redeem("ex_c", current, at) {
		t.Error("the current token not redeemed")
	}

	if o.redeem("ex_b", b, at.Add(time.Hour+offerTokenTTL+time.Second)) {
		t.Error("a token older than offerTokenTTL redeemed")
	}
	o.issue("ex_d", at.Add(time.Hour+offerTokenTTL+time.Second))
	if n := len(o.m); n != 1 {
		t.Errorf("%d tokens kept after an offer past the others' TTL; want 1", n)
	}
}

// elicitor is a client's user answering elicitations as a test scripts it.
type elicitor struct {
	answer *mcp.ElicitResult
	err    error
	// hold makes the user never answer (until the test ends).
	hold    bool
	release chan struct{}

	mu    sync.Mutex // guards asked
	asked []*mcp.ElicitParams
}

func (u *elicitor) handle(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	u.mu.Lock()
	u.asked = append(u.asked, req.Params)
	u.mu.Unlock()
	if u.hold {
		select {
		case <-ctx.Done():
		case <-u.release:
		}
		return nil, errors.New("the user never answered")
	}
	return u.answer, u.err
}

func (u *elicitor) questions() []*mcp.ElicitParams {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*mcp.ElicitParams(nil), u.asked...)
}

// TestAskInSession: in a stateful session whose client declared elicitation, a call that
// leaves its execution awaiting approval asks the user within the call; an accepted answer
// is journaled for the transport's caller (no token: the server asked itself) and the call
// joins the execution again, now decided. Anything else leaves the execution to an operator.
func TestAskInSession(t *testing.T) {
	accept := func(d string) *mcp.ElicitResult {
		return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": d, "note": "ok by me"}}
	}
	tests := []struct {
		name string
		// answer, err: the user's answer; hold: the user never answers.
		answer    *mcp.ElicitResult
		err       error
		hold      bool
		ask       *api.ApprovalRequest
		decideErr error
		// wantDecision is what the engine is asked to journal, "" for nothing.
		wantDecision string
		wantState    string
		wantIsError  bool
	}{
		{name: "approved", answer: accept("approve"), ask: askOf("ex_1"), wantDecision: "approve", wantState: "running"},
		{name: "denied", answer: accept("deny"), ask: askOf("ex_1"), wantDecision: "deny", wantState: "rejected", wantIsError: true},
		{name: "declined", answer: &mcp.ElicitResult{Action: "decline"}, ask: askOf("ex_1"), wantState: "awaiting_approval"},
		{name: "dismissed", answer: &mcp.ElicitResult{Action: "cancel"}, ask: askOf("ex_1"), wantState: "awaiting_approval"},
		{name: "the client fails", err: errors.New("no UI"), ask: askOf("ex_1"), wantState: "awaiting_approval"},
		{
			name: "expired before the user answered", hold: true,
			ask:       &api.ApprovalRequest{ExecutionID: "ex_1", Actor: "token:agent", Host: "h1", Expires: time.Now().Add(-time.Second)},
			wantState: "awaiting_approval",
		},
		{name: "the engine does not ask", answer: accept("approve"), wantState: "awaiting_approval"},
		{name: "the decision is not journaled", answer: accept("approve"), ask: askOf("ex_1"), decideErr: errors.New("decided by an operator first"), wantState: "awaiting_approval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			decided := ""
			e := &fakeEngine{
				exec: func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) {
					mu.Lock()
					defer mu.Unlock()
					switch decided {
					case "approve":
						return execution("ex_1", "running"), nil
					case "deny":
						return execution("ex_1", "rejected"), nil
					}
					return execution("ex_1", "awaiting_approval"), nil
				},
				askInClient: func(string) (*api.ApprovalRequest, error) { return tt.ask, nil },
				decideInClient: func(_, d, _ string, _ func() bool) (*api.Execution, error) {
					if tt.decideErr != nil {
						return nil, tt.decideErr
					}
					mu.Lock()
					defer mu.Unlock()
					decided = d
					return execution("ex_1", "authorized"), nil
				},
			}
			user := &elicitor{answer: tt.answer, err: tt.err, hold: tt.hold, release: make(chan struct{})}
			cs := connect(t, e, session{caller: &remoteCaller, id: "session-1", client: &mcp.ClientOptions{ElicitationHandler: user.handle}})
			t.Cleanup(func() { close(user.release) })

			res := callTool(t, cs, "ssh_exec", map[string]any{"host": "h1", "command": "make deploy"})
			x := decode[*api.Execution](t, res.StructuredContent)
			if x.State != tt.wantState || res.IsError != tt.wantIsError {
				t.Errorf("result = %s, isError %v; want %s, isError %v", x.State, res.IsError, tt.wantState, tt.wantIsError)
			}
			switch q := user.questions(); {
			case tt.ask == nil && len(q) != 0:
				t.Errorf("the user was asked %+v though the engine did not ask", q)
			case tt.ask != nil && !tt.hold && (len(q) != 1 || q[0].Message != tt.ask.Message() ||
				!reflect.DeepEqual(decode[map[string]any](t, q[0].RequestedSchema), decode[map[string]any](t, transport.ApprovalSchema))):
				t.Errorf("the user was asked %+v; want once, %q with the approval form", q, tt.ask.Message())
			}
			decisions := e.callsTo("DecideInClient")
			if tt.wantDecision == "" {
				if tt.decideErr == nil && len(decisions) != 0 {
					t.Errorf("decisions journaled: %+v; want none", decisions)
				}
				if n := len(e.callsTo("Exec")); n != 1 {
					t.Errorf("Exec called %d times; want once", n)
				}
				return
			}
			want := engineCall{Method: "DecideInClient", Caller: remoteCaller, Arg: decision{ID: "ex_1", Decision: tt.wantDecision, Note: "ok by me"}, NilCallback: true}
			if len(decisions) != 1 || !reflect.DeepEqual(decisions[0], want) {
				t.Errorf("decisions = %+v; want [%+v]", decisions, want)
			}
			if n := len(e.callsTo("Exec")); n != 2 {
				t.Errorf("Exec called %d times; want twice (the call joins its execution once decided)", n)
			}
		})
	}
}

// TestAskInSessionGuards: nobody is asked — the engine is not even asked to ask, which it
// journals — in a stateless session, by a client that declared no form elicitation (the
// approval is a form), for a local caller (the bridge asks those), for a tool that only
// reads an execution, or for an execution that does not await approval.
func TestAskInSessionGuards(t *testing.T) {
	user := &elicitor{answer: &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "approve"}}}
	elicits := &mcp.ClientOptions{ElicitationHandler: user.handle}
	tests := []struct {
		name  string
		s     session
		tool  string
		state string
	}{
		{"a stateless session", session{caller: &remoteCaller, client: elicits}, "ssh_exec", "awaiting_approval"},
		{"a client without elicitation", session{caller: &remoteCaller, id: "session-1"}, "ssh_exec", "awaiting_approval"},
		{"a client with url elicitation only", session{caller: &remoteCaller, id: "session-1", client: &mcp.ClientOptions{
			ElicitationHandler: user.handle,
			Capabilities:       &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		}}, "ssh_exec", "awaiting_approval"},
		{"a local caller", session{caller: &bridgedCaller, id: "session-1", client: elicits}, "ssh_exec", "awaiting_approval"},
		{"execution_status", session{caller: &remoteCaller, id: "session-1", client: elicits}, "execution_status", "awaiting_approval"},
		{"a running execution", session{caller: &remoteCaller, id: "session-1", client: elicits}, "ssh_exec", "running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := execution("ex_1", tt.state)
			e := &fakeEngine{
				exec:        func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) { return x, nil },
				status:      func(string) (*api.Execution, error) { return x, nil },
				askInClient: func(id string) (*api.ApprovalRequest, error) { return askOf(id), nil },
			}
			cs := connect(t, e, tt.s)
			res := callTool(t, cs, tt.tool, toolArgs[tt.tool])
			if got := decode[*api.Execution](t, res.StructuredContent); got.State != tt.state {
				t.Errorf("state = %s; want %s", got.State, tt.state)
			}
			if asks := e.callsTo("AskInClient"); len(asks) != 0 {
				t.Errorf("the engine was asked to ask: %+v", asks)
			}
			if q := user.questions(); len(q) != 0 {
				t.Errorf("the user was asked: %+v", q)
			}
		})
	}
}

// TestAskInSessionBeforeModes: a client of a protocol version before elicitation modes
// declares elicitation as {}, which means form: it is asked.
func TestAskInSessionBeforeModes(t *testing.T) {
	user := &elicitor{answer: &mcp.ElicitResult{Action: "decline"}}
	e := &fakeEngine{
		exec: func(context.Context, api.ExecArgs, func(*api.Execution)) (*api.Execution, error) {
			return execution("ex_1", "awaiting_approval"), nil
		},
		askInClient: func(id string) (*api.ApprovalRequest, error) { return askOf(id), nil },
	}
	cs := connect(t, e, session{caller: &remoteCaller, id: "session-1", version: "2025-06-18", client: &mcp.ClientOptions{ElicitationHandler: user.handle}})
	callTool(t, cs, "ssh_exec", map[string]any{"host": "h1", "command": "make deploy"})
	if q := user.questions(); len(q) != 1 {
		t.Errorf("the user was asked %d times; want once", len(q))
	}
}
