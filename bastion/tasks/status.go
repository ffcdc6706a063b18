// Package tasks serves MCP tasks over a durable execution journal, on top of go-sdk without
// forking it: a receiving middleware (task-augmented tools/call, the tasks capability in
// initialize and server/discover, execution.taskSupport in tools/list) and custom methods
// (tasks/get, tasks/result, tasks/list, tasks/cancel, tasks/update).
//
// It owns the protocol — wire shapes of the 2025-11-25 tasks utility and of the
// io.modelcontextprotocol/tasks extension (SEP-2663) for newer versions, the mapping from
// journal states to task statuses, ttl and pollInterval — and nothing else: every answer
// comes from a Backend that reads the journal, so tasks survive a restart of the server.
//
// Invariants: a task id is an execution id, and is visible only to the actor whose
// execution it is (the Backend answers "not found" otherwise, indistinguishable from an id
// that never existed); a task status is a pure function of the journal record (StatusOf), and
// a terminal status never changes because the journal states it maps from are terminal;
// creating a task never counts as delivering its result — only a tasks/result response
// does, and the Backend decides on what evidence.
package tasks

// Status is an MCP task status.
type Status string

// Task statuses (2025-11-25 and the extension use the same five).
const (
	Working       Status = "working"
	InputRequired Status = "input_required"
	Completed     Status = "completed"
	Failed        Status = "failed"
	Cancelled     Status = "cancelled"
)

// Terminal reports whether s is final: completed, failed or cancelled.
func (s Status) Terminal() bool { return s == Completed || s == Failed || s == Cancelled }

// Dialect is the shape of tasks a client negotiated.
type Dialect int

const (
	// None: the protocol version has no tasks (before 2025-11-25): task metadata is ignored.
	None Dialect = iota
	// Spec20251125 is the experimental tasks utility of protocol 2025-11-25.
	Spec20251125
	// Extension is io.modelcontextprotocol/tasks (SEP-2663), for protocol versions after
	// 2025-11-25.
	Extension
)

// DialectFor returns the dialect of a negotiated protocol version.
func DialectFor(protocolVersion string) Dialect {
	switch {
	case protocolVersion == "2025-11-25":
		return Spec20251125
	case protocolVersion > "2025-11-25":
		return Extension
	}
	return None
}

// Facts are what a task's status is decided from: one execution's journal record.
type Facts struct {
	// State is the journal state (markers.JournalGraph): accepted, authorized, awaiting_approval,
	// rejected, dispatched, running, unknown, completed, failed, cancelled, timed_out.
	State string
	// IsError: the outcome was a failure (non-zero exit, signal, HTTP error status).
	IsError bool
	// ReviewRequired: an unknown outcome that only an operator's review settles.
	ReviewRequired bool
	// Queued: authorized and waiting for the actor's max_concurrent slot.
	Queued bool
}

// StatusOf maps an execution to its task status and a status message, for dialect d (the
// table in the README's "Tasks" section, tested from a table in status_test.go).
//
// Why unknown is not terminal: a task's terminal status must never change, and an unknown
// outcome still can (reconciliation with the host, or an operator's review). While Postern
// is still asking the host it is working; when only an operator's review can settle it, it
// is input_required — waiting for input that is not the client's, as awaiting_approval is
// — and the message says so, so an agent is never told a blind "working" forever.
//
// Why a tool error is failed in 2025-11-25 but completed in the extension: that is what each
// says (2025-11-25: "failed … includes cases where the tool call result has isError set to
// true"; SEP-2663: completed "includes tool calls that returned results with isError: true",
// failed is only for JSON-RPC errors). Either way tasks/result (or the extension's inline
// result) carries the stored tool result with its isError.
func StatusOf(f Facts, d Dialect) (Status, string) {
	switch f.State {
	case "accepted", "authorized":
		if f.Queued {
			return Working, "authorized; queued until one of the actor's executions ends (max_concurrent)"
		}
		return Working, "accepted; not dispatched yet"
	case "dispatched":
		return Working, "dispatched"
	case "running":
		return Working, "running"
	case "awaiting_approval":
		return InputRequired, "awaiting approval: an operator decides with `postern approve` or `postern deny` (or the client's user, when asked by elicitation)"
	case "unknown":
		if f.ReviewRequired {
			return InputRequired, "outcome unknown, review required: Postern will neither ask the host nor send it again; only an operator's `postern review` settles it"
		}
		return Working, "outcome unknown: Postern is asking the host again; it is never re-sent blindly"
	case "completed":
		if f.IsError && d != Extension {
			return Failed, "completed with an error outcome (non-zero exit, signal or HTTP error status); tasks/result has the result"
		}
		return Completed, "completed"
	case "failed":
		if d == Extension {
			return Completed, "failed: it provably did not take effect"
		}
		return Failed, "failed: it provably did not take effect"
	case "timed_out":
		if d == Extension {
			return Completed, "timed out: killed at its timeout"
		}
		return Failed, "timed out: killed at its timeout"
	case "rejected":
		if d == Extension {
			return Completed, "rejected: by policy or an approver; it never ran"
		}
		return Failed, "rejected: by policy or an approver; it never ran"
	case "cancelled":
		return Cancelled, "cancelled"
	}
	// A state this build does not know (a newer journal): never claim an outcome.
	return Working, "state " + f.State
}
