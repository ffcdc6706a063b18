package mcpserver

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
)

// addExecutionsList adds executions_list: the caller's executions, newest first.
func (s *server) addExecutionsList() {
	addTool(s.srv, &mcp.Tool{
		Name:        "executions_list",
		Title:       "List your executions",
		Description: "Your executions, newest first, optionally filtered by state (e.g. running, unknown), host and acceptance time. Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, in api.ListArgs) (*mcp.CallToolResult, *api.ListResult, error) {
		c, err := callerOf(req.Extra)
		if err != nil {
			return nil, nil, err
		}
		out, err := s.engine.List(c, in)
		if err != nil {
			return nil, nil, err
		}
		for _, x := range out.Executions {
			compact(x)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: listSummary(out)}}}, out, nil
	})
}

func listSummary(out *api.ListResult) string {
	if len(out.Executions) == 0 {
		return "No executions."
	}
	var s string
	for _, x := range out.Executions {
		s += fmt.Sprintf("%s %s %s on %s: %s\n", x.ExecutionID, x.AcceptedAt.UTC().Format("2006-01-02T15:04:05Z"), x.State, x.Host, x.Command)
	}
	return s
}
