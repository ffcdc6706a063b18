package api

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/postern-dev/postern/markers"
)

// ExecArgs are the arguments of ssh_exec.
type ExecArgs struct {
	Host         string            `json:"host" jsonschema:"inventory name of the host (see hosts_list)"`
	Command      string            `json:"command" jsonschema:"command line, run by the account's shell on the host"`
	Cwd          string            `json:"cwd,omitempty" jsonschema:"absolute working directory; default: the host's configured directory or the account's home"`
	Env          map[string]string `json:"env,omitempty" jsonschema:"environment variables to set: LANG, LC_* and the host's accept_env list (others are refused)"`
	TimeoutS     int               `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (exit 124); 0 means no timeout"`
	OperationKey string            `json:"operation_key,omitempty" jsonschema:"host-scoped key such as migration:2026_07_22: the host refuses a second execution of the operation"`
	Account      string            `json:"account,omitempty" jsonschema:"local account to run as, when policy lets you use it on this host (e.g. postgres); default: the account the host was enrolled with (hosts_list shows it)"`
	CallOptions
}

// CallOptions are the arguments every tool that starts work takes besides what it does: how
// the call is matched to a prior execution, and how long it waits.
type CallOptions struct {
	WaitS          *int   `json:"wait_s,omitempty" jsonschema:"seconds to wait for the outcome before returning the execution as running (default 30). Keep it below your client's own request timeout (the TypeScript SDK gives up at 60 s by default); with a progress token, a progress notification goes out every second while it waits"`
	RunID          string `json:"run_id,omitempty" jsonschema:"HTTP callers: the agent run this call belongs to; a call with the same arguments and run_id joins the same execution. Local callers (the socket, postern mcp) are in the run of their agent process, and this is ignored"`
	IdempotencyKey string `json:"idempotency_key,omitempty" jsonschema:"client-made key: a call with the same key and arguments returns the same execution from any run, also after your agent restarts, and from any actor of your principal; if that execution failed without effect (nothing ran), it is a new attempt linked to it (previous_attempt); the same key with other arguments is refused (idempotency_key_reused), and a key another principal holds too (idempotency_key_held)"`
	Reason         string `json:"reason,omitempty" jsonschema:"why you want this, in a sentence: shown to the operator asked to approve it when policy requires an approval (at most 1024 bytes of text; not part of the request's identity)"`
}

// HTTPArgs are the arguments of http_request.
type HTTPArgs struct {
	Endpoint string              `json:"endpoint" jsonschema:"name of a configured endpoint"`
	Method   string              `json:"method" jsonschema:"HTTP method, allowed by the endpoint"`
	Path     string              `json:"path" jsonschema:"path under the endpoint's base URL, within its allowed prefixes"`
	Query    map[string][]string `json:"query,omitempty" jsonschema:"query parameters"`
	JSON     any                 `json:"json,omitempty" jsonschema:"JSON request body (sent in RFC 8785 canonical form)"`
	Text     *string             `json:"text,omitempty" jsonschema:"text request body (instead of json)"`
	Headers  map[string]string   `json:"headers,omitempty" jsonschema:"extra request headers (never Authorization or the credential's header: the bastion injects the credential)"`
	CallOptions
}

// Execution is what every execution tool returns: the journal's record of one execution,
// its output (or a window of it), and what the caller may do next.
type Execution struct {
	ExecutionID string `json:"execution_id"`
	// State is the journal state; a completed execution whose result was never delivered
	// shows as completed with result_delivered false.
	State           string `json:"state"`
	ResultDelivered bool   `json:"result_delivered"`
	// Replayed: this call did not dispatch anything; it joined or replayed an execution
	// that already existed (a retry, a duplicate, an idempotency key).
	Replayed bool   `json:"replayed"`
	Host     string `json:"host,omitempty"`
	Command  string `json:"command,omitempty"`
	Class    string `json:"class,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	IsError  bool   `json:"is_error"`
	// Stdout and Stderr are the returned window of each stream; *Offset is the stream offset
	// (in bytes) of its first byte and *Bytes the stream's total size so far. Pass
	// stdout_offset + the bytes of stdout as execution_output's stdout_offset to read on.
	Stdout       string `json:"stdout"`
	StdoutOffset int64  `json:"stdout_offset"`
	StdoutBytes  int64  `json:"stdout_bytes"`
	Stderr       string `json:"stderr"`
	StderrOffset int64  `json:"stderr_offset"`
	StderrBytes  int64  `json:"stderr_bytes"`
	// OutputSHA256 is the host's digest of the whole stdout, when the execution ended.
	OutputSHA256 string `json:"stdout_sha256,omitempty"`
	// HTTP executions: the response (status, kept headers, body up to the endpoint's cap).
	HTTPStatus         int                 `json:"http_status,omitempty"`
	ResponseHeader     map[string][]string `json:"response_headers,omitempty"`
	ResponseBody       string              `json:"response_body,omitempty"`
	ResponseBytes      int64               `json:"response_bytes,omitempty"`
	ResponseTruncated  bool                `json:"response_truncated,omitempty"`
	IdempotentReplayed bool                `json:"idempotent_replayed,omitempty"`
	AcceptedAt         time.Time           `json:"accepted_at"`
	DispatchedAt       *time.Time          `json:"dispatched_at,omitempty"`
	// FinishedAt is when the outcome was observed (the execution's terminal state was
	// journaled), not when its record last changed.
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Evidence   []string   `json:"evidence,omitempty"`
	// Cause says why a failed or unknown execution is so (its latest evidence, one line).
	Cause string `json:"cause,omitempty"`
	// PreviousAttempt is the failed execution this one retries: a call with the same
	// idempotency_key and the same request after that one provably did not take effect.
	PreviousAttempt string `json:"previous_attempt,omitempty"`
	// ReviewRequired: the outcome is unknown and Postern will neither ask nor send again;
	// only an operator's review (`postern review`) settles it.
	ReviewRequired bool `json:"review_required,omitempty"`
	// Queued: authorized, and waiting for its actor's max_concurrent slot before dispatch.
	Queued bool `json:"queued,omitempty"`
	// Fleet is a fleet run's rollout (fleet_exec; the execution id is then its fr_… id).
	Fleet *FleetRun `json:"fleet,omitempty"`
	// FleetRun is the fleet run (fr_…) an execution is one host's part of.
	FleetRun string `json:"fleet_run,omitempty"`
	// Next says what is safe to do now.
	Next string `json:"next"`
}

// Summary is the text form of a result (the MCP text content): what happened, why (for a
// failed or unknown execution), what to do next, then the output.
func (x *Execution) Summary() string {
	var sb strings.Builder
	if x.Fleet != nil {
		x.fleetSummary(&sb)
		return sb.String()
	}
	fmt.Fprintf(&sb, "%s on %s: %s", x.ExecutionID, x.Host, x.State)
	if x.ExitCode != nil {
		fmt.Fprintf(&sb, " (exit %d)", *x.ExitCode)
	}
	if x.Signal != "" {
		fmt.Fprintf(&sb, " (%s)", x.Signal)
	}
	if x.HTTPStatus != 0 {
		fmt.Fprintf(&sb, " (HTTP %d)", x.HTTPStatus)
	}
	if x.ReviewRequired {
		sb.WriteString(" [review required]")
	}
	if x.Replayed {
		sb.WriteString(" [replayed: no new dispatch]")
	}
	sb.WriteString(".")
	if x.PreviousAttempt != "" {
		fmt.Fprintf(&sb, " New attempt after %s, which failed without effect.", x.PreviousAttempt)
	}
	if x.Cause != "" {
		fmt.Fprintf(&sb, "\nCause: %s", x.Cause)
	}
	sb.WriteString("\nNext: ")
	sb.WriteString(x.Next)
	if x.Stdout != "" {
		fmt.Fprintf(&sb, "\n--- stdout (from byte %d of %d) ---\n%s", x.StdoutOffset, x.StdoutBytes, x.Stdout)
	}
	if x.Stderr != "" {
		fmt.Fprintf(&sb, "\n--- stderr (from byte %d of %d) ---\n%s", x.StderrOffset, x.StderrBytes, x.Stderr)
	}
	if x.ResponseBody != "" {
		truncated := ""
		if x.ResponseTruncated {
			truncated = fmt.Sprintf(", truncated from %d bytes", x.ResponseBytes)
		}
		fmt.Fprintf(&sb, "\n--- response body%s ---\n%s", truncated, x.ResponseBody)
	}
	return sb.String()
}

// CallFailed reports whether a call that started (or joined) this execution failed: the
// command or request failed (non-zero exit, signal, HTTP error status), was refused, did not
// take effect, was killed at its timeout or cancelled, or its outcome cannot be proven. A
// running or pending execution has not failed.
func (x *Execution) CallFailed() bool {
	switch markers.State(x.State) {
	case markers.Failed, markers.Rejected, markers.Unknown, markers.TimedOut, markers.Cancelled:
		return true
	}
	return x.IsError
}

// OutputArgs are the arguments of execution_output. The offsets are named as the result's
// fields are: a result's stdout_offset + the bytes of its stdout is where to read on.
type OutputArgs struct {
	ExecutionID  string `json:"execution_id"`
	StdoutOffset int64  `json:"stdout_offset,omitempty" jsonschema:"byte offset in stdout to read from (default 0); the text of each answer ends with the offsets to read on from"`
	StderrOffset int64  `json:"stderr_offset,omitempty" jsonschema:"byte offset in stderr to read from (default 0)"`
	WaitS        *int   `json:"wait_s,omitempty" jsonschema:"wait up to this many seconds for new output or the end (default 30); keep it below your client's request timeout"`
}

// ReadOn is the last line of execution_output's text: whether more output is there or still
// coming, and the offsets (bytes) to ask for next — so the caller needs no call to find out.
func (x *Execution) ReadOn() string {
	outNext, errNext := x.StdoutOffset+int64(len(x.Stdout)), x.StderrOffset+int64(len(x.Stderr))
	next := fmt.Sprintf(`execution_output {"execution_id": %q, "stdout_offset": %d, "stderr_offset": %d}`, x.ExecutionID, outNext, errNext)
	sizes := fmt.Sprintf("stdout %d bytes, stderr %d bytes", x.StdoutBytes, x.StderrBytes)
	switch st := markers.State(x.State); {
	case outNext < x.StdoutBytes || errNext < x.StderrBytes:
		return fmt.Sprintf("More output is there (%s in all): read on with %s.", sizes, next)
	case markers.JournalGraph.Terminal(st):
		return fmt.Sprintf("End of output: the execution is %s, and this is all of it (%s).", x.State, sizes)
	case st == markers.Dispatched || st == markers.Running:
		return fmt.Sprintf("Output is still arriving: the execution is %s, and this is all of its output so far (%s). Read on with %s; it waits for new output or the end.", x.State, sizes, next)
	case st == markers.Unknown:
		return fmt.Sprintf("Whether more output comes is not known: the outcome is unknown, and this is all of the output Postern has (%s). Read on with %s.", sizes, next)
	}
	return fmt.Sprintf("No output yet: the execution is %s and has not started. Read on with %s once it runs.", x.State, next)
}

// StatusArgs are the arguments of execution_status.
type StatusArgs struct {
	ExecutionID string `json:"execution_id" jsonschema:"the ex_… id returned by ssh_exec or http_request (or a host's, in a fleet run), or the fr_… id returned by fleet_exec"`
	Evidence    string `json:"evidence,omitempty" jsonschema:"compact (default): the policy's decision in one line (deciding rule and class), then how the outcome is known; full: every step of the policy's decision as well"`
}

// Evidence levels (StatusArgs.Evidence).
const (
	EvidenceCompact = "compact"
	EvidenceFull    = "full"
)

// decisionPrefix starts the evidence line of a policy decision (DecisionEvidence).
const decisionPrefix = "policy: "

// DecisionEvidence is the evidence line that journals a policy decision: "policy: <outcome>
// (<rule>)", after the steps of the ladder that led to it. Operators' tools read the rule
// back from it (RuleOf).
func DecisionEvidence(outcome, rule string) string {
	return fmt.Sprintf("%s%s (%s)", decisionPrefix, outcome, rule)
}

// RuleOf is the deciding rule of a decision's evidence line, and whether line is one.
func RuleOf(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, decisionPrefix)
	if !ok {
		return "", false
	}
	_, rule, ok := strings.Cut(rest, " (")
	return strings.TrimSuffix(rule, ")"), ok
}

// CompactEvidence is an execution's evidence as an agent reads it unless it asks for all of
// it: the policy's decision in one line, with the class that applies, in place of every step
// of the ladder before it; then everything journaled after it (how the outcome is known).
// The whole trace stays in the journal (postern executions show, postern investigate).
func CompactEvidence(evidence []string, class string) []string {
	i := slices.IndexFunc(evidence, func(l string) bool { return strings.HasPrefix(l, decisionPrefix) })
	if i < 0 {
		return evidence
	}
	decision := evidence[i]
	if class != "" {
		decision += ", class " + class
	}
	return append([]string{decision}, evidence[i+1:]...)
}

// ListArgs are the arguments of executions_list.
type ListArgs struct {
	State string `json:"state,omitempty" jsonschema:"only executions in this state (e.g. running, unknown, completed)"`
	Host  string `json:"host,omitempty" jsonschema:"only executions on this host"`
	Since string `json:"since,omitempty" jsonschema:"only executions accepted at or after this RFC 3339 time"`
	Limit int    `json:"limit,omitempty" jsonschema:"at most this many (default 50, max 500)"`
}

// ListResult is the output of executions_list.
type ListResult struct {
	Executions []*Execution `json:"executions"`
}

// HostInfo describes one enrolled host.
type HostInfo struct {
	Name    string `json:"name"`
	Addr    string `json:"addr"`
	Account string `json:"account"`
	// Description, Labels (env=prod, role=db) and OS are what the operator says the host is.
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	OS          string            `json:"os,omitempty"`
	HostKey     string            `json:"host_key_fingerprint"`
	Groups      []string          `json:"groups,omitempty"`
	Connected   bool              `json:"connected"`
	DefaultCwd  string            `json:"default_cwd,omitempty"`
	HostKeyType string            `json:"host_key_type"`
	// Guarantee is what the host promises about a lost outcome: hostagent, marker_script or
	// none (docs/agentless.md).
	Guarantee string `json:"guarantee"`
}

// HostsArgs are the arguments of hosts_list (and the operator's GET /v1/hosts).
type HostsArgs struct {
	Labels string `json:"labels,omitempty" jsonschema:"only hosts carrying every one of these labels, KEY=VALUE[,KEY=VALUE…], e.g. role=db,env=prod"`
	Cursor string `json:"cursor,omitempty" jsonschema:"the next_cursor of the previous page, to read the next one"`
	Limit  int    `json:"limit,omitempty" jsonschema:"at most this many hosts (default 100, max 1000)"`
}

// HostsResult is the output of hosts_list: one page of hosts, sorted by name.
type HostsResult struct {
	Hosts []HostInfo `json:"hosts"`
	// Total is how many hosts match (the caller may use, with the labels asked for), in
	// every page.
	Total int `json:"total"`
	// NextCursor reads the next page (pass it as cursor); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// ExecutionState is an execution's state without its output: what an MCP task reports.
type ExecutionState struct {
	ExecutionID    string    `json:"execution_id"`
	State          string    `json:"state"`
	IsError        bool      `json:"is_error"`
	ReviewRequired bool      `json:"review_required,omitempty"`
	Queued         bool      `json:"queued,omitempty"`
	AcceptedAt     time.Time `json:"accepted_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	// Retention is how long the journal keeps the execution after it ended (its class's).
	Retention time.Duration `json:"retention"`
}

// ApprovalRequest is an execution awaiting approval, as whoever decides it sees it (the
// operator's `approvals list`, the webhook, the agent's user in the client): what it would
// do and where, who asked and why, the rule that requires the approval, and until when it
// may be decided.
type ApprovalRequest struct {
	ExecutionID string `json:"execution_id"`
	// Actor and Run are who asked: the journal's actor and the agent run (intent scope).
	Actor string `json:"actor"`
	Run   string `json:"run,omitempty"`
	Host  string `json:"host"`
	Class string `json:"class"`
	// What is the command line, or for an HTTP request its target.
	What string `json:"what"`
	// Reason is why the agent says it wants it ("" when it gave none).
	Reason string `json:"reason,omitempty"`
	// Rule is the policy rule that requires the approval.
	Rule string `json:"rule,omitempty"`
	// Requested is when it began to wait; Expires is when it is rejected if nobody decided
	// (zero: never).
	Requested time.Time `json:"requested,omitzero"`
	Expires   time.Time `json:"expires,omitzero"`
	// Decide says how an operator decides it.
	Decide string `json:"decide,omitempty"`
	// Hosts are the hosts of a fleet run, as its targets selected them: one approval stands
	// for all of them.
	Hosts []string `json:"hosts,omitempty"`
}

// Message is what the client's user is asked.
func (r *ApprovalRequest) Message() string {
	why := ""
	if r.Reason != "" {
		why = "\n\nWhy, in the agent's words: " + r.Reason
	}
	where := r.Host
	if len(r.Hosts) > 0 {
		where = fmt.Sprintf("%d hosts (%s), one approval for all of them", len(r.Hosts), strings.Join(r.Hosts, ", "))
	}
	return fmt.Sprintf("Postern: %s asks to run on %s (class %s):\n\n%s%s\n\nPolicy requires an approval before it runs (execution %s). Approve or deny; an operator can also decide with `postern approve`.",
		r.Actor, where, r.Class, r.What, why, r.ExecutionID)
}
