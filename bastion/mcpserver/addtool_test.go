package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
)

// TestAddToolAsSDK checks that addTool answers as go-sdk's mcp.AddTool does: the same tool
// in tools/list (schemas included), and the same results for valid, invalid and absent
// arguments, a tool error, a protocol error and a nil output.
func TestAddToolAsSDK(t *testing.T) {
	// The handler echoes what it decoded, so a difference in decoding shows in the output.
	handler := func(_ context.Context, _ *mcp.CallToolRequest, in api.ExecArgs) (*mcp.CallToolResult, *api.Execution, error) {
		switch in.Command {
		case "tool-error":
			return nil, nil, &api.ToolError{Code: api.CodeInvalidArgument, Message: "bad"}
		case "wire-error":
			return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "wire"}
		case "nil-output":
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "none"}}}, nil, nil
		case "no-content":
			return nil, &api.Execution{ExecutionID: in.Host, State: in.Command}, nil
		}
		wait := 0
		if in.WaitS != nil {
			wait = *in.WaitS
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Host}}},
			&api.Execution{ExecutionID: in.Host, State: in.Command, StdoutBytes: int64(wait), Command: in.Command}, nil
	}
	tool := func() *mcp.Tool { return &mcp.Tool{Name: "t", Description: "d"} }
	sdk := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
	mcp.AddTool(sdk, tool(), handler)
	ours := mcp.NewServer(&mcp.Implementation{Name: "s"}, nil)
	addTool(ours, tool(), handler)
	sdkCS, oursCS := inMemorySession(t, sdk), inMemorySession(t, ours)

	ctx := context.Background()
	sdkTools, err := sdkCS.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	oursTools, err := oursCS.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, sdkTools.Tools), mustJSON(t, oursTools.Tools); a != b {
		t.Errorf("tools/list differs:\nsdk:  %s\nours: %s", a, b)
	}

	for _, args := range []any{
		map[string]any{"host": "h1", "command": "true"},
		map[string]any{"host": "h1", "command": "true", "wait_s": 1e2},
		map[string]any{"host": "h1", "command": "true", "wait_s": 1.5},
		json.RawMessage(`{"host": "h1", "command": "true", "wait_s": 1e2}`), // decoded from the re-encoding: 100
		json.RawMessage(`{"host": "h1", "command": "true", "wait_s": 7.0, "host": "h2"}`),
		map[string]any{"host": "h1", "command": "true", "unknown": 1},
		map[string]any{"host": 1, "command": "true"},
		map[string]any{"command": "true"},
		nil,
		map[string]any{"host": "h1", "command": "tool-error"},
		map[string]any{"host": "h1", "command": "wire-error"},
		map[string]any{"host": "h1", "command": "nil-output"},
		map[string]any{"host": "h1", "command": "no-content"},
	} {
		a, aErr := sdkCS.CallTool(ctx, &mcp.CallToolParams{Name: "t", Arguments: args})
		b, bErr := oursCS.CallTool(ctx, &mcp.CallToolParams{Name: "t", Arguments: args})
		if (aErr == nil) != (bErr == nil) || (aErr != nil && aErr.Error() != bErr.Error()) {
			t.Errorf("%v: error %v, want the SDK's %v", args, bErr, aErr)
			continue
		}
		if aErr != nil {
			continue
		}
		if a.IsError != b.IsError || mustJSON(t, a.Content) != mustJSON(t, b.Content) && !sameJSONText(a.Content, b.Content) {
			t.Errorf("%v: result %s (isError %v), want the SDK's %s (isError %v)", args, mustJSON(t, b.Content), b.IsError, mustJSON(t, a.Content), a.IsError)
		}
		if !reflect.DeepEqual(a.StructuredContent, b.StructuredContent) {
			t.Errorf("%v: structured content %v, want the SDK's %v", args, b.StructuredContent, a.StructuredContent)
		}
	}
}

// sameJSONText reports whether two contents are one text each holding equal JSON values
// (the structured content's fallback text: ours keeps the fields' order, the SDK sorts).
func sameJSONText(a, b []mcp.Content) bool {
	if len(a) != 1 || len(b) != 1 {
		return false
	}
	at, aok := a[0].(*mcp.TextContent)
	bt, bok := b[0].(*mcp.TextContent)
	if !aok || !bok {
		return false
	}
	var av, bv any
	return json.Unmarshal([]byte(at.Text), &av) == nil && json.Unmarshal([]byte(bt.Text), &bv) == nil && reflect.DeepEqual(av, bv)
}

func inMemorySession(t *testing.T, srv *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "c"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		if err := ss.Wait(); err != nil && !errors.Is(err, context.Canceled) {
			t.Log(err)
		}
	})
	return cs
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// BenchmarkDecodeArguments is ssh_exec's arguments decoded as the SDK does (defaults applied,
// re-encoded) and, without defaults in the schema, as sent.
func BenchmarkDecodeArguments(b *testing.B) {
	schema, err := inputSchema[api.ExecArgs](nil)
	if err != nil {
		b.Fatal(err)
	}
	raw := json.RawMessage(`{"host":"h1","command":"true","run_id":"mcp64-1","wait_s":30}`)
	for _, withDefaults := range []bool{true, false} {
		b.Run(map[bool]string{true: "as the SDK", false: "as sent"}[withDefaults], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if in, err := decodeArguments[api.ExecArgs](raw, schema, withDefaults); err != nil || in.Host != "h1" {
					b.Fatal(in, err)
				}
			}
		})
	}
}
