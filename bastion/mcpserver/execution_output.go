package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// addExecutionOutput adds execution_output: read or follow an execution's output from offsets.
func (s *server) addExecutionOutput() {
	mcp.AddTool(s.srv, &mcp.Tool{
		Name:        "execution_output",
		Title:       "Read or follow an execution's output",
		Description: "Attach to one of your executions: returns its output from the given offsets (stdout offset, stderr_offset), waiting up to wait_s (default 30) for new output or the end. Call again with stdout_offset+len(stdout) to read on. Never starts anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, executionTool(s, operatesOnOne, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in api.OutputArgs) (*api.Execution, error) {
		return s.engine.Output(ctx, c, in)
	}))
}
