package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// addHTTPRequest adds http_request: call a configured HTTP API through the HTTP plugin.
func (s *server) addHTTPRequest() {
	addTool(s.srv, &mcp.Tool{
		Name:  "http_request",
		Title: "Call a configured HTTP API",
		Description: "Send an HTTP request to a configured endpoint (see the endpoint's allowed methods and path prefixes). The bastion injects the endpoint's credential; never pass Authorization yourself. Every request carries Idempotency-Key: the execution id. " +
			"If the outcome is unknown (the connection broke after the request was written), the endpoint's class decides: read_only and idempotent_write are re-sent with the same Idempotency-Key, conditional_write is checked with the endpoint's status check first, irreversible is never re-sent and needs review. " + replayContract,
		Annotations: &mcp.ToolAnnotations{
			ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true),
		},
	}, executionTool(s, startsWork, func(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, in api.HTTPArgs) (*api.Execution, error) {
		return s.engine.HTTPRequest(ctx, c, in, progressFor(ctx, req))
	}))
}
