package mcpserver

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
)

// addHostsList adds hosts_list: the enrolled hosts and what each can prove.
func (s *server) addHostsList() {
	mcp.AddTool(s.srv, &mcp.Tool{
		Name:        "hosts_list",
		Title:       "List enrolled hosts",
		Description: "The hosts you can run commands on, with their pinned host key fingerprints, whether a connection is open, and each host's guarantee: hostagent (a lost outcome is resolved from the host's marker), marker_script (resolved from a marker script's record; no output re-attach), or none (a lost outcome stays unknown and needs an operator's review; it is never sent again). Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *api.HostsResult, error) {
		if _, err := callerOf(req.Extra); err != nil {
			return nil, nil, err
		}
		out, err := s.engine.Hosts()
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: hostsSummary(out)}}}, out, nil
	})
}

// hostsSummary is the text form of hosts_list: one host a line.
func hostsSummary(out *api.HostsResult) string {
	var text string
	for _, h := range out.Hosts {
		text += fmt.Sprintf("%s (%s@%s, %s %s, guarantee %s)\n", h.Name, h.Account, h.Addr, h.HostKeyType, h.HostKey, h.Guarantee)
	}
	if text == "" {
		text = "No hosts are enrolled."
	}
	return text
}
