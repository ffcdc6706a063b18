package api

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// FleetArgs are the arguments of fleet_exec (and of `postern fleet run`): one command on
// every host its targets select, under a rollout's brakes.
type FleetArgs struct {
	Targets []string `json:"targets" jsonschema:"the hosts to run on, among those hosts_list shows you: host names, group:NAME (the hosts of a group), or labels as role=db,env=prod (the hosts that carry all of them); the union of all targets, each of which must select at least one host"`
	Command string   `json:"command" jsonschema:"command line, run by each host account's shell"`
	// MaxConcurrency and MaxErrors are a count or a percentage of the run's hosts.
	MaxConcurrency Limit             `json:"max_concurrency" jsonschema:"how many hosts run the command at once: a count (5) or a percentage of the hosts (\"25%\"); at least 1"`
	MaxErrors      Limit             `json:"max_errors" jsonschema:"how many failed hosts the run tolerates: once more fail, no new host is started and the running ones finish; a count (0 stops at the first failure) or a percentage (\"10%\")"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"absolute working directory on every host; default: each host's configured directory or the account's home"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables to set: LANG, LC_* and what every selected host accepts"`
	TimeoutS       int               `json:"timeout_s,omitempty" jsonschema:"kill the command on a host after this many seconds (exit 124); 0 means no timeout"`
	CallOptions
}

// Limit is a max_concurrency or max_errors as a call gives it: a JSON number (a count) or a
// string (a count, or a percentage such as "25%"). bastion/rollout parses it.
type Limit string

// UnmarshalJSON takes a whole number or a string.
func (l *Limit) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*l = Limit(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a count (5) or a percentage (\"25%%\"), not %s", b)
	}
	i, err := strconv.Atoi(n.String())
	if err != nil {
		return fmt.Errorf("want a whole count (5) or a percentage (\"25%%\"), not %s", b)
	}
	*l = Limit(strconv.Itoa(i))
	return nil
}

// FleetRun is a fleet run's rollout as it stands: what an Execution of a fleet run (fr_…)
// carries besides its state. Counts and hosts are read from the journal at every answer.
type FleetRun struct {
	Targets []string `json:"targets"`
	// MaxConcurrency and MaxErrors are the brakes as written; Concurrency and Tolerated what
	// they are for this run's hosts (hosts at once, failed hosts tolerated).
	MaxConcurrency string `json:"max_concurrency"`
	MaxErrors      string `json:"max_errors"`
	Concurrency    int    `json:"concurrency"`
	Tolerated      int    `json:"errors_tolerated"`
	// Total is the number of hosts the targets selected when the run was accepted.
	Total int `json:"total"`
	// Counts are how many hosts are in each state: their executions' journal states, and
	// not_started for a host that has none (yet, or ever: the run stopped or was cancelled).
	Counts map[string]int `json:"counts"`
	// Failures is how many hosts failed as the brakes count them (a non-zero exit, not run,
	// rejected, cancelled, an unknown outcome only a review settles): max_errors is checked
	// against it.
	Failures int `json:"failures"`
	// Braked: no new host starts any more (max_errors exceeded, or cancelled).
	Braked bool `json:"braked,omitempty"`
	// Outcome is how the rollout ended: completed (every host succeeded), failed (every
	// host was started, some failed), stopped (max_errors exceeded before every host was
	// started), cancelled; empty while it runs.
	Outcome string `json:"outcome,omitempty"`
	// Failed are the hosts that failed (or whose outcome is unknown), with why.
	Failed []FleetHost `json:"failed,omitempty"`
	// Hosts are every host of the run, in the order the run starts them.
	Hosts []FleetHost `json:"hosts"`
}

// FleetHost is one host of a fleet run and its execution.
type FleetHost struct {
	Host string `json:"host"`
	// ExecutionID is the host's execution (execution_status and execution_output read it);
	// empty while the host was not started.
	ExecutionID string `json:"execution_id,omitempty"`
	// State is the execution's state, or not_started.
	State    string `json:"state"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// Cause says why a failed or unknown host is so.
	Cause string `json:"cause,omitempty"`
}

// NotStarted is the state a fleet run reports for a host that has no execution.
const NotStarted = "not_started"

// fleetSummary is the text of a fleet run's result: the rollout in a line, the failed
// hosts with their cause.
func (x *Execution) fleetSummary(sb *strings.Builder) {
	f := x.Fleet
	fmt.Fprintf(sb, "%s: fleet run on %d hosts (max_concurrency %s, max_errors %s): %s", x.ExecutionID, f.Total, f.MaxConcurrency, f.MaxErrors, x.State)
	if f.Outcome != "" {
		fmt.Fprintf(sb, ", %s", f.Outcome)
	} else if f.Braked {
		sb.WriteString(", braked: no new host starts")
	}
	if x.Replayed {
		sb.WriteString(" [replayed: no new dispatch]")
	}
	fmt.Fprintf(sb, ".\nHosts: %s; %d failed (max_errors tolerates %d).", CountsText(f.Counts), f.Failures, f.Tolerated)
	for _, h := range f.Failed {
		fmt.Fprintf(sb, "\nFailed: %s %s %s", h.Host, h.ExecutionID, h.State)
		if h.ExitCode != nil {
			fmt.Fprintf(sb, " (exit %d)", *h.ExitCode)
		}
		if h.Cause != "" {
			sb.WriteString(": " + h.Cause)
		}
	}
	sb.WriteString("\nNext: " + x.Next)
}

// countOrder is the order counts are named in.
var countOrder = []string{"completed", "running", "dispatched", "authorized", "accepted", "unknown", "failed", "rejected", "timed_out", "cancelled", NotStarted}

// CountsText names per-state counts in one line, the usual states first: "8 completed, 2
// running, 1 failed, 1 not_started".
func CountsText(counts map[string]int) string {
	var parts []string
	seen := map[string]bool{}
	for _, st := range countOrder {
		seen[st] = true
		if n := counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	for _, st := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[st]; !seen[st] && n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// FleetRunRequest is the body of the operator API's POST /v1/fleet/runs (`postern fleet
// run`): a fleet run an operator starts, decided by the policy of a configured actor.
type FleetRunRequest struct {
	// Actor names the configured actor whose policy decides every host, and whose limits
	// the hosts' executions count toward.
	Actor string `json:"actor"`
	FleetArgs
}
