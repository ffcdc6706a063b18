// Package mcpserver is the bastion's MCP surface: the tools agents call (one file per tool),
// MCP tasks over the same executions, and approvals asked of the agent's user in the client.
// It turns MCP requests into calls of the Engine it is given and the Engine's answers into
// tool results; it decides nothing about executions itself.
//
// Invariants: every handler resolves its caller from the transport (never from arguments);
// a result that carries an execution's outcome is registered for delivery tracking
// (bastion/delivery), except a task-augmented call's, which carries only the task.
package mcpserver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/version"
	"github.com/postern-dev/postern/markers"
)

// Engine is what the MCP surface needs of the bastion's engine: the executions an agent
// starts and reads, the same executions as tasks, and approvals in the client.
type Engine interface {
	Executions
	Tasks
	Approvals
}

// Executions are the tools' operations. Every one sees only the caller's executions.
type Executions interface {
	// Exec and HTTPRequest start an execution or join the one the call belongs to, and wait
	// up to the call's wait_s for it; progress, if set, hears about it while it waits.
	Exec(ctx context.Context, c transport.Caller, a api.ExecArgs, progress func(*api.Execution)) (*api.Execution, error)
	HTTPRequest(ctx context.Context, c transport.Caller, a api.HTTPArgs, progress func(*api.Execution)) (*api.Execution, error)
	// FleetExec starts a fleet run (fr_…) or joins the one the call belongs to, and waits
	// up to wait_s for it, as Exec does.
	FleetExec(ctx context.Context, c transport.Caller, a api.FleetArgs, progress func(*api.Execution)) (*api.Execution, error)
	// HTTPEnabled reports whether an HTTP plugin is configured (http_request exists).
	HTTPEnabled() bool
	Status(ctx context.Context, c transport.Caller, id string) (*api.Execution, error)
	Output(ctx context.Context, c transport.Caller, a api.OutputArgs) (*api.Execution, error)
	Cancel(ctx context.Context, c transport.Caller, id string) (*api.Execution, error)
	List(c transport.Caller, a api.ListArgs) (*api.ListResult, error)
	// HostsOf lists the enrolled hosts the caller's policy lets it use.
	HostsOf(c transport.Caller, a api.HostsArgs) (*api.HostsResult, error)
}

// Tasks are the executions as MCP tasks see them.
type Tasks interface {
	// State is an execution of the caller's without its output; a ToolError not_found for
	// one the caller may not see.
	State(c transport.Caller, id string) (*api.ExecutionState, error)
	// States is one page of the caller's executions, newest first, and the next cursor;
	// markers.ErrInvalidCursor for a cursor the journal did not hand out.
	States(c transport.Caller, cursor string, limit int) ([]*api.ExecutionState, string, error)
	// AwaitEnd waits until the execution ended (or ctx ends) and returns its stored result;
	// changed hears its state when the wait begins and every change while it waits.
	AwaitEnd(ctx context.Context, c transport.Caller, id string, changed func(*api.ExecutionState)) (*api.Execution, error)
}

// Approvals are approvals asked of the agent's user in the client (elicitation).
type Approvals interface {
	// AskInClient journals that the approval of execution id is asked of its caller's user
	// and returns the request to show, or nil when it may not be asked (it no longer awaits
	// approval, its class keeps approvals with operators, or it was asked before).
	AskInClient(ctx context.Context, c transport.Caller, id string) (*api.ApprovalRequest, error)
	// DecideInClient journals the user's decision ("approve" or "deny") on an execution
	// whose approval was asked of them. redeem, if set, is called once every other check
	// passed and must confirm the offer's token.
	DecideInClient(ctx context.Context, c transport.Caller, id, decision, note string, redeem func() bool) (*api.Execution, error)
}

// Options configure New.
type Options struct {
	// Tracker judges the delivery of the results the server hands out. Required.
	Tracker *delivery.Tracker
	Logger  *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// server holds what the handlers share.
type server struct {
	srv     *mcp.Server
	engine  Engine
	tracker *delivery.Tracker
	log     *slog.Logger
	now     func() time.Time
	offers  offerTokens
}

// instructions is what the server tells every client at initialize.
const instructions = "Postern runs commands on enrolled hosts over SSH and journals each one before it is sent, so a retry never runs a command twice. Use hosts_list to see the hosts you may use, ssh_exec to run a command, execution_output to follow a long one, fleet_exec to run one command on many hosts as a rollout (max_concurrency, max_errors).\n\n" +
	"What joins an earlier execution: a call with the same arguments from the same actor and the same run (over the local socket or postern mcp, the run is your agent process; over HTTP, run_id or the Postern-Run header), or a call with the same idempotency_key and arguments, from any run and any actor of your principal. A restarted agent process is a new run, so its calls never join the old one's: pass idempotency_key for anything that must not run again across restarts.\n\n" +
	"Keep wait_s below your client's own request timeout (the TypeScript SDK gives up at 60 s); a call still running after wait_s returns state \"running\" with its execution id, never a timeout. With a progress token, progress notifications go out every second while a call waits."

// New builds the MCP server: every tool, MCP tasks for the tools that start work, and the
// method through which the stdio bridge relays its user's approvals.
func New(e Engine, opts Options) (*mcp.Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &server{engine: e, tracker: opts.Tracker, log: opts.Logger, now: opts.Now}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "postern", Title: "Postern SSH bastion", Version: version.Number()}, &mcp.ServerOptions{
		Instructions: instructions,
	})
	// The tools, in the order clients list them.
	s.addSSHExec()
	if err := s.addFleetExec(); err != nil {
		return nil, err
	}
	if e.HTTPEnabled() {
		s.addHTTPRequest()
	}
	s.addExecutionStatus()
	s.addExecutionOutput()
	s.addExecutionCancel()
	s.addExecutionsList()
	s.addHostsList()
	if err := tasks.Install(s.srv, taskBackend{s}, tasks.Options{
		Tools: []string{"ssh_exec", "fleet_exec", "http_request"}, WaitArgument: "wait_s", Now: s.now,
	}); err != nil {
		return nil, err
	}
	if err := s.installApprovals(); err != nil {
		return nil, err
	}
	return s.srv, nil
}

// executionRef is the argument of the tools that name one execution.
type executionRef struct {
	ExecutionID string `json:"execution_id" jsonschema:"the ex_… id returned by ssh_exec (or a host's, in a fleet run), or the fr_… id returned by fleet_exec"`
}

// toolRole is what an execution tool does, which decides what its isError means.
type toolRole int

const (
	// startsWork: ssh_exec, http_request — isError when the command or request failed.
	startsWork toolRole = iota
	// operatesOnOne: execution_status, execution_cancel — the call succeeded when it returns
	// the execution, whatever state that is in.
	operatesOnOne
	// readsOutput: execution_output — as operatesOnOne, and its text ends with where to
	// read on (api.Execution.ReadOn).
	readsOutput
)

// executionTool is the handler of a tool that returns one execution: the caller comes from
// the transport, the result is tracked for delivery, and a call that leaves its execution
// awaiting approval may ask the user in the client (approvals.go).
func executionTool[In any](s *server, role toolRole, do func(context.Context, *mcp.CallToolRequest, transport.Caller, In) (*api.Execution, error)) mcp.ToolHandlerFor[In, *api.Execution] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, *api.Execution, error) {
		c, err := callerOf(req.Extra)
		if err != nil {
			return nil, nil, err
		}
		ctx = s.tracker.Context(ctx, headerOf(req.Extra))
		x, err := do(ctx, req, c, in)
		if role == startsWork && err == nil && s.askInSession(ctx, req, c, x) {
			// Decided by the user: the same call again joins the same execution, now
			// approved (and followed for wait_s) or rejected.
			x, err = do(ctx, req, c, in)
		}
		sa, ok := any(in).(api.StatusArgs)
		res, out, err := result(ctx, role, x, err, ok && sa.Evidence == api.EvidenceFull)
		if role == startsWork && err == nil {
			if offer := s.offerApproval(ctx, req, c, out); offer != nil {
				res.Meta = mcp.Meta{transport.MetaApprovalOffer: offer}
			}
		}
		return res, out, err
	}
}

// callerOf is the caller the transport identified for a request.
func callerOf(extra *mcp.RequestExtra) (transport.Caller, error) {
	if extra != nil {
		if c, ok := transport.CallerFromTokenInfo(extra.TokenInfo); ok {
			return c, nil
		}
	}
	return transport.Caller{}, &api.ToolError{Code: api.CodeUnauthenticated, Message: "the transport did not identify the caller"}
}

// headerOf is the HTTP header of the request that carried a message (nil when none).
func headerOf(extra *mcp.RequestExtra) map[string][]string {
	if extra == nil {
		return nil
	}
	return extra.Header
}

// result turns an execution into the tool result, and registers it for delivery tracking.
// isError says the call failed: for a tool that starts work, that the command or request
// failed (CallFailed); reading or cancelling an execution that returns it succeeded — its
// state and is_error say how the execution went. Its evidence is compact unless the call
// asked for all of it (execution_status's evidence argument).
func result(ctx context.Context, role toolRole, x *api.Execution, err error, fullEvidence bool) (*mcp.CallToolResult, *api.Execution, error) {
	if err != nil {
		return nil, nil, err
	}
	// A task-augmented call answers with the task, not the result: nothing is delivered.
	if markers.JournalGraph.Terminal(markers.State(x.State)) && !x.ResultDelivered && !tasks.Creating(ctx) {
		delivery.Carries(ctx, x.ExecutionID)
	}
	if !fullEvidence {
		compact(x)
	}
	isError := role == startsWork && x.CallFailed()
	text := x.Summary()
	if role == readsOutput {
		text += "\n" + x.ReadOn()
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: isError}, x, nil
}

// compact shortens x's evidence to what an agent needs by default (api.CompactEvidence).
func compact(x *api.Execution) { x.Evidence = api.CompactEvidence(x.Evidence, x.Class) }

// progressFor reports progress to the client if it asked for it (a progress token). The
// progress value counts the notifications, as tasks/result's do: MCP requires it to increase
// with each one, and the output of a command that prints nothing does not; the message says
// how much output there is (for a fleet run, how many hosts are in which state).
func progressFor(ctx context.Context, req *mcp.CallToolRequest) func(*api.Execution) {
	token := req.Params.GetProgressToken()
	if token == nil {
		return nil
	}
	var mu sync.Mutex // guards n, and orders the notifications as their values
	n := 0
	return func(x *api.Execution) {
		mu.Lock()
		defer mu.Unlock()
		n++
		msg := fmt.Sprintf("%s %s: %d bytes of output", x.ExecutionID, x.State, x.StdoutBytes+x.StderrBytes)
		if x.Fleet != nil {
			msg = fmt.Sprintf("%s %s: %d hosts: %s", x.ExecutionID, x.State, x.Fleet.Total, api.CountsText(x.Fleet.Counts))
		}
		req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: token,
			Progress:      float64(n),
			Message:       msg,
		})
	}
}

func boolPtr(v bool) *bool { return &v }
