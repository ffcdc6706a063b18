package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// The replay contract every execution tool states: what happens when the caller loses a
// response and calls again.
const replayContract = `Replay contract: every call that starts work gets a server-made execution id, journaled before anything is sent. If you lose the response and call again with the same arguments from the same actor and run (the agent process over the local socket or postern mcp; run_id or the Postern-Run header over HTTP), you get the SAME execution back (replayed: true) — it is never run twice; a finished one returns its stored result until that result was delivered. A restarted agent process is a new run and never joins the old run's executions: pass idempotency_key for anything that must not repeat across restarts — the same key and arguments return the same execution from any run and any actor of your principal. If the connection to the host was lost, Postern asks the host before deciding: it re-sends only when the host proves the command never started (no marker, for an execution younger than the host keeps markers), otherwise it attaches. A command that could not start (missing cwd or shell) ends "failed" with the cause in its evidence: it did not run. state "unknown" means the outcome could not be proven: it is never hidden and never retried blindly; with review_required: true, Postern will not ask or send again and only an operator's review settles it. If policy requires an operator's approval, the call returns at once with state "awaiting_approval" and the execution id; a retry returns that same pending (or decided) execution and never asks for approval twice. A "rejected" execution stays rejected: a retry returns the same rejection.`

// addSSHExec adds ssh_exec: run a command on an enrolled host.
func (s *server) addSSHExec() {
	addTool(s.srv, &mcp.Tool{
		Name:  "ssh_exec",
		Title: "Run a command on a host",
		Description: "Run a command on an enrolled host (the account's shell runs it with -c). Returns after the command ends or after wait_s seconds (default 30), then with state \"running\" and the execution id — use execution_output to follow it; it is never a timeout error. Keep wait_s below your client's request timeout (the TypeScript SDK gives up at 60 s); with a progress token you get a progress notification every second while it waits. " +
			"Pass idempotency_key to make a retry from another run return the same execution; operation_key makes the host refuse a second execution of one operation. " + replayContract +
			` Hosts differ in what they can prove after a lost connection (hosts_list "guarantee"): "hostagent" and "marker_script" hosts are asked as above (a marker_script host keeps no output to re-attach); on a "none" host such an outcome stays "unknown" with review_required and is never sent again; operation_key needs a hostagent.`,
		Annotations: &mcp.ToolAnnotations{
			ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true),
		},
	}, executionTool(s, startsWork, func(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, in api.ExecArgs) (*api.Execution, error) {
		return s.engine.Exec(ctx, c, in, progressFor(ctx, req))
	}))
}
