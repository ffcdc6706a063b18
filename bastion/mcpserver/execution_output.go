package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// addExecutionOutput adds execution_output: read or follow an execution's output from offsets.
func (s *server) addExecutionOutput() {
	addTool(s.srv, &mcp.Tool{
		Name:        "execution_output",
		Title:       "Read or follow an execution's output",
		Description: "Attach to one of your executions: returns its output from stdout_offset and stderr_offset (byte offsets into each stream, default 0), at most output_tail_bytes of each (64 KiB by default), waiting up to wait_s seconds (default 30) for new output or the end when there is none yet. The text ends with what is left: more output to read (with the stdout_offset and stderr_offset to ask for next), output still arriving (the execution is running), or the end of the output. Keep wait_s below your client's request timeout. Never starts anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, executionTool(s, readsOutput, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in api.OutputArgs) (*api.Execution, error) {
		return s.engine.Output(ctx, c, in)
	}))
}
