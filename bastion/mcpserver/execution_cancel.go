package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// addExecutionCancel adds execution_cancel: stop an execution.
func (s *server) addExecutionCancel() {
	addTool(s.srv, &mcp.Tool{
		Name:        "execution_cancel",
		Title:       "Cancel an execution",
		Description: "Cancel one of your executions: not yet dispatched, or never started by its host → cancelled, nothing runs; running on its host → TERM, then KILL after the host's grace period. A sent HTTP request cannot be recalled. Cancelling an execution that already ended changes nothing. Calling it twice is the same as once.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(true)},
	}, executionTool(s, operatesOnOne, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in executionRef) (*api.Execution, error) {
		return s.engine.Cancel(ctx, c, in.ExecutionID)
	}))
}
