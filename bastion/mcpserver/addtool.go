package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// addTool registers a typed tool as go-sdk's mcp.AddTool does — its input schema inferred
// from In (or t.InputSchema), its output schema from Out, the arguments validated against
// the input schema and its defaults applied, the output carried as structuredContent — with
// two costs per call taken out:
//
//   - The schemas are marshaled once, here. mcp.AddTool keeps them as *jsonschema.Schema,
//     and the SDK's HTTP transport marshals a tool's input schema on every tools/call to look
//     for x-mcp-header annotations (validateParamHeaders): reflectively, with the
//     descriptions, about 0.4 ms of CPU per call — the largest single item of the MCP layer.
//     As json.RawMessage, that look is a compaction and a parse.
//   - The output is not validated against its schema. The SDK decodes each result into a
//     map, checks it and encodes it again; the schema is inferred from Out, the very type the
//     handler returns, so the check cannot fail. The structured content is the output's own
//     encoding (fields in declaration order) rather than the re-encoded map's (keys sorted).
//
// Like mcp.AddTool it panics when a schema cannot be inferred: the types are fixed at build.
func addTool[In, Out any](srv *mcp.Server, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) {
	tt := *t
	input, err := inputSchema[In](t.InputSchema)
	if err != nil {
		panic(fmt.Sprintf("addTool: tool %q: input schema: %v", t.Name, err))
	}
	if tt.InputSchema, err = marshalSchema(input.Schema()); err != nil {
		panic(fmt.Sprintf("addTool: tool %q: input schema: %v", t.Name, err))
	}
	outType := reflect.TypeFor[Out]()
	var elemZero any // the zero value sent for a nil *Out (not JSON null), as the SDK does
	if outType.Kind() == reflect.Pointer {
		outType = outType.Elem()
		elemZero = reflect.Zero(outType).Interface()
	}
	output, err := jsonschema.ForType(outType, &jsonschema.ForOptions{})
	if err != nil {
		panic(fmt.Sprintf("addTool: tool %q: output schema: %v", t.Name, err))
	}
	if tt.OutputSchema, err = marshalSchema(output); err != nil {
		panic(fmt.Sprintf("addTool: tool %q: output schema: %v", t.Name, err))
	}
	// Inferred schemas carry no defaults; one given might. Without any, the arguments as sent
	// are what the SDK's re-encoding would give (decodeArguments).
	withDefaults := bytes.Contains(tt.InputSchema.(json.RawMessage), []byte(`"default"`))
	srv.AddTool(&tt, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		in, err := decodeArguments[In](req.Params.Arguments, input, withDefaults)
		if err != nil {
			var res mcp.CallToolResult
			res.SetError(err)
			return &res, nil
		}
		res, out, err := h(ctx, req, in)
		if err != nil {
			// A JSON-RPC error is the protocol's; any other is the tool's, in its result.
			if wireErr, ok := err.(*jsonrpc.Error); ok {
				return nil, wireErr
			}
			var res mcp.CallToolResult
			res.SetError(err)
			return &res, nil
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		if res.InputRequests != nil {
			return res, nil // content and input requests are exclusive on the wire
		}
		var outval any = out
		if elemZero != nil && reflect.ValueOf(out).IsNil() {
			outval = elemZero
		}
		structured, err := json.Marshal(outval)
		if err != nil {
			return nil, fmt.Errorf("marshaling output: %w", err)
		}
		res.StructuredContent = json.RawMessage(structured)
		if res.Content == nil {
			res.Content = []mcp.Content{&mcp.TextContent{Text: string(structured)}}
		}
		return res, nil
	})
}

// inputSchema is the resolved input schema of a tool taking In: the one given, or the one
// inferred from In, as mcp.AddTool resolves them.
func inputSchema[In any](given any) (*jsonschema.Resolved, error) {
	schema, ok := given.(*jsonschema.Schema)
	switch {
	case given == nil:
		rt := reflect.TypeFor[In]()
		if rt.Kind() == reflect.Pointer {
			rt = rt.Elem()
		}
		var err error
		if schema, err = jsonschema.ForType(rt, &jsonschema.ForOptions{}); err != nil {
			return nil, err
		}
	case !ok:
		return nil, fmt.Errorf("a %T; want a *jsonschema.Schema", given)
	}
	return schema.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
}

// decodeArguments is what the SDK does with a typed tool's arguments: decoded into a map
// (absent arguments are {}), the schema's defaults applied, validated, encoded again and
// decoded into In. The error reads as the SDK's. Without defaults (withDefaults false) the
// arguments are decoded as sent, and only if that fails (a number such as 1e2 for an
// integer, which the map's re-encoding writes 100) from the re-encoding.
func decodeArguments[In any](raw json.RawMessage, schema *jsonschema.Resolved, withDefaults bool) (In, error) {
	var in In
	args := map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &args); err != nil {
			return in, fmt.Errorf("validating \"arguments\": unmarshaling arguments: %v", err)
		}
	}
	var v any = args
	if withDefaults {
		if err := schema.ApplyDefaults(&v); err != nil {
			return in, fmt.Errorf("validating \"arguments\": applying schema defaults:\n%v", err)
		}
	}
	if err := schema.Validate(&v); err != nil {
		return in, fmt.Errorf("validating \"arguments\": %v", err)
	}
	if !withDefaults && len(raw) > 0 && json.Unmarshal(raw, &in) == nil {
		return in, nil
	}
	in = *new(In)
	reencoded, err := json.Marshal(v)
	if err != nil {
		return in, fmt.Errorf("validating \"arguments\": marshalling with defaults: %v", err)
	}
	if err := json.Unmarshal(reencoded, &in); err != nil {
		return in, err
	}
	return in, nil
}

// marshalSchema is a schema as the JSON the SDK sends as is (a json.RawMessage, not []byte).
func marshalSchema(s *jsonschema.Schema) (any, error) {
	b, err := json.Marshal(s)
	return json.RawMessage(b), err
}
