package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// addExecutionStatus adds execution_status: the journal's record of one execution.
func (s *server) addExecutionStatus() {
	addTool(s.srv, &mcp.Tool{
		Name:        "execution_status",
		Title:       "Status of an execution",
		Description: `The journal's record of one of your executions: state, exit code, evidence, the last output. For an execution whose outcome is unknown it asks the host again first. Evidence is compact unless you pass evidence: "full" (every step of the policy's decision). Reading never changes anything.`,
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, executionTool(s, operatesOnOne, func(ctx context.Context, _ *mcp.CallToolRequest, c transport.Caller, in api.StatusArgs) (*api.Execution, error) {
		switch in.Evidence {
		case "", api.EvidenceCompact, api.EvidenceFull:
		default:
			return nil, api.Invalid("evidence must be %q or %q", api.EvidenceCompact, api.EvidenceFull)
		}
		return s.engine.Status(ctx, c, in.ExecutionID)
	}))
}
