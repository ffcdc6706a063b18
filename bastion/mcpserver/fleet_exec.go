package mcpserver

import (
	"context"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
)

// fleetExecSchema is fleet_exec's input schema: inferred from api.FleetArgs, except that a
// max_concurrency or max_errors (api.Limit) is a whole number or a string ("25%"), which the
// inference, seeing a string type, would not let through.
func fleetExecSchema() (*jsonschema.Schema, error) {
	return jsonschema.For[api.FleetArgs](&jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[api.Limit](): {Types: []string{"integer", "string"}},
	}})
}

// addFleetExec adds fleet_exec: one command on many hosts under a rollout's brakes.
func (s *server) addFleetExec() error {
	schema, err := fleetExecSchema()
	if err != nil {
		return err
	}
	addTool(s.srv, &mcp.Tool{
		Name:  "fleet_exec",
		Title: "Run a command on many hosts",
		Description: "Run one command on every host its targets select (host names, group:NAME, labels role=db,env=prod), as a rollout: at most max_concurrency hosts at once, and once more than max_errors hosts failed no new host starts (the running ones finish). " +
			"Returns a fleet run (fr_… id) after it ends or after wait_s seconds (default 30): per-state counts of its hosts, the failed hosts with their cause, and each host's execution id (ex_…). Follow it with execution_status or execution_output on the fr_… id (the rollout) or on a host's ex_… id (that host's output); execution_cancel on the fr_… id starts no more hosts and cancels the running ones. " +
			"Each host gets an ordinary execution, decided by the policy for that host: a host the policy refuses fails in the run with its refusal; if any host needs an approval, the whole run waits for one approval, which shows every host. " +
			"The run is journaled before any host starts and is carried from the journal: a bastion restart goes on with it, and no host ever runs it twice. The same call again (same actor and run, or the same idempotency_key from any run) returns the same run, replayed — never a second rollout. A restarted agent process is a new run: pass idempotency_key for a rollout that must not repeat across restarts.",
		InputSchema: schema,
		Annotations: &mcp.ToolAnnotations{
			ReadOnlyHint: false, DestructiveHint: boolPtr(true), IdempotentHint: false, OpenWorldHint: boolPtr(true),
		},
	}, executionTool(s, startsWork, func(ctx context.Context, req *mcp.CallToolRequest, c transport.Caller, in api.FleetArgs) (*api.Execution, error) {
		return s.engine.FleetExec(ctx, c, in, progressFor(ctx, req))
	}))
	return nil
}
