package bastion

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// Version is reported to MCP clients.
const Version = "0.4.0"

// The replay contract every execution tool states: what happens when the caller loses a
// response and calls again.
const replayContract = `Replay contract: every call that starts work gets a server-made execution id, journaled before anything is sent. If you lose the response and call again with the same arguments (same actor and run), you get the SAME execution back (replayed: true) — it is never run twice; a finished one returns its stored result. If the connection to the host was lost, Postern asks the host before deciding: it re-sends only when the host proves the command never started (no marker, for an execution younger than the host keeps markers), otherwise it attaches. A command that could not start (missing cwd or shell) ends "failed" with the cause in its evidence: it did not run. state "unknown" means the outcome could not be proven: it is never hidden and never retried blindly; with review_required: true, Postern will not ask or send again and only an operator's review settles it. If policy requires an operator's approval, the call returns at once with state "awaiting_approval" and the execution id; a retry returns that same pending (or decided) execution and never asks for approval twice. A "rejected" execution stays rejected: a retry returns the same rejection.`

func boolPtr(v bool) *bool { return &v }

// MCPServer builds the MCP server with the bastion's tools.
func (b *Bastion) MCPServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "postern", Title: "Postern SSH bastion", Version: Version}, &mcp.ServerOptions{
		Instructions: "Postern runs commands on enrolled hosts over SSH with exactly-once execution: retries never run a command twice. Use hosts_list to see hosts, ssh_exec to run, execution_output to follow a long command.",
	})
	mcp.AddTool(srv, &mcp.Tool{
		Name:  "ssh_exec",
		Title: "Run a command on a host",
		Description: "Run a command on an enrolled host (the account's shell runs it with -c). Returns after the command ends or after wait_s seconds (default 30), then with state \"running\" and the execution id — use execution_output to follow it; it is never a timeout error. " +
			"Pass idempotency_key to make a retry from another run return the same execution; operation_key makes the host refuse a second execution of one operation. " + replayContract +
			` Hosts differ in what they can prove after a lost connection (hosts_list "guarantee"): "hostagent" and "marker_script" hosts are asked as above (a marker_script host keeps no output to re-attach); on a "none" host such an outcome stays "unknown" with review_required and is never sent again; operation_key needs a hostagent.`,
		Annotations: &mcp.ToolAnnotations{
			ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true),
		},
	}, executionTool(b, startsWork, func(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, in api.ExecArgs) (*api.Execution, error) {
		return b.Exec(ctx, c, in, progressFor(ctx, req))
	}))
	if b.plugin != nil {
		mcp.AddTool(srv, &mcp.Tool{
			Name:  "http_request",
			Title: "Call a configured HTTP API",
			Description: "Send an HTTP request to a configured endpoint (see the endpoint's allowed methods and path prefixes). The bastion injects the endpoint's credential; never pass Authorization yourself. Every request carries Idempotency-Key: the execution id. " +
				"If the outcome is unknown (the connection broke after the request was written), the endpoint's class decides: read_only and idempotent_write are re-sent with the same Idempotency-Key, conditional_write is checked with the endpoint's status check first, irreversible is never re-sent and needs review. " + replayContract,
			Annotations: &mcp.ToolAnnotations{
				ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true),
			},
		}, executionTool(b, startsWork, func(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, in api.HTTPArgs) (*api.Execution, error) {
			return b.HTTPRequest(ctx, c, in, progressFor(ctx, req))
		}))
	}
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "execution_status",
		Title:       "Status of an execution",
		Description: "The journal's record of one of your executions: state, exit code, evidence, the last output. For an execution whose outcome is unknown it asks the host again first. Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, executionTool(b, operatesOnOne, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in executionRef) (*api.Execution, error) {
		return b.Status(ctx, c, in.ExecutionID, b.cfg.DefaultWait/3)
	}))
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "execution_output",
		Title:       "Read or follow an execution's output",
		Description: "Attach to one of your executions: returns its output from the given offsets (stdout offset, stderr_offset), waiting up to wait_s (default 30) for new output or the end. Call again with stdout_offset+len(stdout) to read on. Never starts anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, executionTool(b, operatesOnOne, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in api.OutputArgs) (*api.Execution, error) {
		return b.Output(ctx, c, in)
	}))
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "execution_cancel",
		Title:       "Cancel an execution",
		Description: "Cancel one of your executions: not yet dispatched, or never started by its host → cancelled, nothing runs; running on its host → TERM, then KILL after the host's grace period. A sent HTTP request cannot be recalled. Cancelling an execution that already ended changes nothing. Calling it twice is the same as once.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(true)},
	}, executionTool(b, operatesOnOne, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in executionRef) (*api.Execution, error) {
		return b.Cancel(ctx, c, in.ExecutionID)
	}))
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "executions_list",
		Title:       "List your executions",
		Description: "Your executions, newest first, optionally filtered by state (e.g. running, unknown), host and acceptance time. Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, in api.ListArgs) (*mcp.CallToolResult, *api.ListResult, error) {
		c, err := callerOf(req)
		if err != nil {
			return nil, nil, err
		}
		out, err := b.List(c, in)
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: listSummary(out)}}}, out, nil
	})
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "hosts_list",
		Title:       "List enrolled hosts",
		Description: "The hosts you can run commands on, with their pinned host key fingerprints, whether a connection is open, and each host's guarantee: hostagent (a lost outcome is resolved from the host's marker), marker_script (resolved from a marker script's record; no output re-attach), or none (a lost outcome stays unknown and needs an operator's review; it is never sent again). Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *api.HostsResult, error) {
		if _, err := callerOf(req); err != nil {
			return nil, nil, err
		}
		out, err := b.Hosts()
		if err != nil {
			return nil, nil, err
		}
		var text string
		for _, h := range out.Hosts {
			text += fmt.Sprintf("%s (%s@%s, %s %s, guarantee %s)\n", h.Name, h.Account, h.Addr, h.HostKeyType, h.HostKey, h.Guarantee)
		}
		if text == "" {
			text = "No hosts are enrolled."
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
	})
	// Tasks (bastion/tasks): every execution is a task, answered from the journal.
	if err := tasks.Install(srv, taskBackend{b}, tasks.Options{
		Tools: []string{"ssh_exec", "http_request"}, WaitArgument: "wait_s", Now: b.now,
	}); err != nil {
		panic(err) // unreachable: the method names are not go-sdk's own
	}
	if err := b.installElicitedApprovals(srv); err != nil {
		panic(err) // unreachable, as above
	}
	return srv
}

// executionRef is the argument of the tools that name one execution.
type executionRef struct {
	ExecutionID string `json:"execution_id" jsonschema:"the ex_… id returned by ssh_exec"`
}

// toolRole is what an execution tool does, which decides what its isError means.
type toolRole int

const (
	// startsWork: ssh_exec, http_request — isError when the command or request failed.
	startsWork toolRole = iota
	// operatesOnOne: execution_status, execution_output, execution_cancel — the call
	// succeeded when it returns the execution, whatever state that is in.
	operatesOnOne
)

// executionTool is the handler of a tool that returns one execution: the caller comes from
// the transport, the result is tracked for delivery.
func executionTool[In any](b *Bastion, role toolRole, do func(context.Context, *mcp.CallToolRequest, transport.Caller, In) (*api.Execution, error)) mcp.ToolHandlerFor[In, *api.Execution] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, *api.Execution, error) {
		c, err := callerOf(req)
		if err != nil {
			return nil, nil, err
		}
		ctx = b.tracker.Context(ctx, headerOf(req.Extra))
		x, err := do(ctx, req, c, in)
		if role == startsWork && err == nil && b.askInSession(ctx, req, c, x) {
			// Decided by the user: the same call again joins the same execution, now
			// approved (and followed for wait_s) or rejected.
			x, err = do(ctx, req, c, in)
		}
		res, out, err := b.result(ctx, role, x, err)
		if role == startsWork && err == nil {
			if offer := b.offerApproval(ctx, req, c, out); offer != nil {
				res.Meta = mcp.Meta{transport.MetaApprovalOffer: offer}
			}
		}
		return res, out, err
	}
}

func callerOf(req *mcp.CallToolRequest) (transport.Caller, error) {
	c, ok := transport.CallerFromTokenInfo(req.Extra.TokenInfo)
	if !ok {
		return transport.Caller{}, &api.ToolError{Code: "unauthenticated", Message: "the transport did not identify the caller"}
	}
	return c, nil
}

// result turns an execution into the tool result, and registers it for delivery tracking.
// isError says the call failed: for a tool that starts work, that the command or request
// failed (callFailed); reading or cancelling an execution that returns it succeeded — its
// state and is_error say how the execution went.
func (b *Bastion) result(ctx context.Context, role toolRole, x *api.Execution, err error) (*mcp.CallToolResult, *api.Execution, error) {
	if err != nil {
		return nil, nil, err
	}
	// A task-augmented call answers with the task, not the result: nothing is delivered.
	if markers.JournalGraph.Terminal(markers.State(x.State)) && !x.ResultDelivered && !tasks.Creating(ctx) {
		delivery.Carries(ctx, x.ExecutionID)
	}
	isError := role == startsWork && x.CallFailed()
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: x.Summary()}}, IsError: isError}, x, nil
}

func listSummary(out *api.ListResult) string {
	if len(out.Executions) == 0 {
		return "No executions."
	}
	var s string
	for _, x := range out.Executions {
		s += fmt.Sprintf("%s %s %s on %s: %s\n", x.ExecutionID, x.AcceptedAt.Format("2006-01-02T15:04:05Z"), x.State, x.Host, x.Command)
	}
	return s
}

// progressFor reports progress to the client if it asked for it (a progress token).
func progressFor(ctx context.Context, req *mcp.CallToolRequest) func(*api.Execution) {
	token := req.Params.GetProgressToken()
	if token == nil {
		return nil
	}
	return func(x *api.Execution) {
		req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: token,
			Progress:      float64(x.StdoutBytes + x.StderrBytes),
			Message:       fmt.Sprintf("%s %s: %d bytes of output", x.ExecutionID, x.State, x.StdoutBytes+x.StderrBytes),
		})
	}
}

// RevokeDelivery revokes the delivery of id's result unless a newer execution of the same
// intent was accepted since: the delivery then already ended the matching window and a
// retry joins the newer one, so revoking would only rewrite what made it new. It holds the
// intake lock of the intent, so no new execution is accepted meanwhile.
func (b *Bastion) RevokeDelivery(ctx context.Context, id string) (bool, error) {
	rec, err := b.journal.Get(id)
	if err != nil {
		return false, err
	}
	if rec.IdempotencyKey == "" {
		defer b.intake.Lock(intent.LockKey(rec.Actor, rec.IntentScope, rec.Fingerprint))()
		latest, err := b.journal.FindByFingerprint(rec.Actor, rec.IntentScope, rec.Fingerprint)
		if err != nil && !errors.Is(err, markers.ErrNotFound) {
			return false, err
		}
		if latest != nil && latest.ID != id {
			b.log.Info("result delivery stays: a newer execution of the same intent was accepted since", "execution_id", id, "newer", latest.ID)
			return false, nil
		}
	}
	_, revoked, err := b.journal.RevokeDelivery(ctx, id, "the client cancelled the request that carried the result (notifications/cancelled)")
	return revoked, err
}

// headerOf is the HTTP header of the request that carried a message (nil when none).
func headerOf(extra *mcp.RequestExtra) http.Header {
	if extra == nil {
		return nil
	}
	return extra.Header
}
