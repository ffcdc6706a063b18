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
	addTool(s.srv, &mcp.Tool{
		Name:        "hosts_list",
		Title:       "List enrolled hosts",
		Description: "The hosts you may run commands on (only those your policy allows), a page at a time (limit, then cursor = next_cursor), optionally only those with labels (labels = \"role=db,env=prod\"), each with what the operator says it is (description, labels such as env=prod or role=db, OS), its account and address, its pinned host key fingerprint, whether a connection is open, and its guarantee: hostagent (a lost outcome is resolved from the host's marker), marker_script (resolved from a marker script's record; no output re-attach), or none (a lost outcome stays unknown and needs an operator's review; it is never sent again). Reading never changes anything.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, a api.HostsArgs) (*mcp.CallToolResult, *api.HostsResult, error) {
		c, err := callerOf(req.Extra)
		if err != nil {
			return nil, nil, err
		}
		out, err := s.engine.HostsOf(c, a)
		if err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: hostsSummary(out, a)}}}, out, nil
	})
}

// hostsSummary is the text form of hosts_list: one host a line, what it is first, and how
// to read the next page.
func hostsSummary(out *api.HostsResult, a api.HostsArgs) string {
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
		about = append(about, fmt.Sprintf("%s@%s", h.Account, h.Addr), strings.TrimSpace(h.HostKeyType+" "+h.HostKey), "guarantee "+h.Guarantee)
		fmt.Fprintf(&sb, " (%s)\n", strings.Join(about, ", "))
	}
	switch {
	case out.Total == 0 && a.Labels != "":
		return fmt.Sprintf("No host you may use carries the labels %s.", a.Labels)
	case out.Total == 0:
		return "No hosts are enrolled that you may use."
	case len(out.Hosts) == 0:
		return fmt.Sprintf("No more hosts: all %d were on the previous pages.", out.Total)
	case out.NextCursor != "":
		fmt.Fprintf(&sb, "%d of %d hosts; for more, call hosts_list again with cursor %q.\n", len(out.Hosts), out.Total, out.NextCursor)
	}
	return sb.String()
}
