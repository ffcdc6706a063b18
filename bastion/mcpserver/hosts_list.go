package mcpserver

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
)

// addHostsList adds hosts_list: the enrolled hosts and what each can prove.
func (s *server) addHostsList() {
	mcp.AddTool(s.srv, &mcp.Tool{
		Name:        "hosts_list",
		Title:       "List enrolled hosts",
		Description: "The hosts you may run commands on (only those your policy allows), each with what the operator says it is (description, labels such as env=prod or role=db, OS), its account and address, its pinned host key fingerprint, whether a connection is open, and its guarantee: hostagent (a lost outcome is resolved from the host's marker), marker_script (resolved from a marker script's record; no output re-attach), or none (a lost outcome stays unknown and needs an operator's review; it is never sent again). Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, *api.HostsResult, error) {
		c, err := callerOf(req.Extra)
		if err != nil {
			return nil, nil, err
		}
		out, err := s.engine.HostsOf(c)
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: hostsSummary(out)}}}, out, nil
	})
}

// hostsSummary is the text form of hosts_list: one host a line, what it is first.
func hostsSummary(out *api.HostsResult) string {
	var sb strings.Builder
	for _, h := range out.Hosts {
		sb.WriteString(h.Name)
		if h.Description != "" {
			sb.WriteString(": " + h.Description)
		}
		var about []string
		for _, k := range slices.Sorted(maps.Keys(h.Labels)) {
			about = append(about, k+"="+h.Labels[k])
		}
		if h.OS != "" {
			about = append(about, "os "+h.OS)
		}
		about = append(about, fmt.Sprintf("%s@%s", h.Account, h.Addr), h.HostKeyType+" "+h.HostKey, "guarantee "+h.Guarantee)
		fmt.Fprintf(&sb, " (%s)\n", strings.Join(about, ", "))
	}
	if sb.Len() == 0 {
		return "No hosts are enrolled that you may use."
	}
	return sb.String()
}
