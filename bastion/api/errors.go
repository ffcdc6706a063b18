// Package api holds the wire types of the bastion's surfaces: the arguments and results of
// the MCP tools (what agents send and read), the operator API's views (what the postern CLI
// reads), and ToolError with its stable codes. They are what the engine returns and the
// surfaces encode; they are not storage types (markers.Record is the journal's).
package api

import (
	"errors"
	"fmt"
)

// ToolError is an error a caller can act on; Code is stable.
type ToolError struct {
	Code    string
	Message string
	// ExecutionID is set when the error concerns an existing execution.
	ExecutionID string
}

func (e *ToolError) Error() string { return e.Code + ": " + e.Message }

// Invalid is the error of an argument the caller must fix; nothing was journaled.
func Invalid(format string, args ...any) error {
	return &ToolError{Code: CodeInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// Error codes.
const (
	CodeInvalidArgument      = "invalid_argument"
	CodeUnknownHost          = "unknown_host"
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	// CodeIdempotencyKeyHeld: the key is held by another principal's execution, which the
	// error does not name.
	CodeIdempotencyKeyHeld = "idempotency_key_held"
	CodeNotFound           = "not_found"
	CodeJournalUnavailable = "journal_unavailable"
	// CodeExecutionRemoved: the call would replay an execution the journal's retention
	// removed, whose class is not run again blindly; nothing was dispatched.
	CodeExecutionRemoved = "execution_removed"
)

// Codes of calls refused by an actor's limits (nothing is journaled for them).
const (
	CodeQuotaExceeded    = "quota_exceeded"
	CodeConcurrencyLimit = "concurrency_limit"
)

// Codes of other refusals.
const (
	CodeUnauthenticated      = "unauthenticated"
	CodeShuttingDown         = "shutting_down"
	CodeUnknownEndpoint      = "unknown_endpoint"
	CodeHTTPUnavailable      = "http_unavailable"
	CodeTooManyWaits         = "too_many_waits"
	CodeNotOffered           = "not_offered"
	CodeOperatorApprovalOnly = "operator_approval_only"
	// CodeNotAnOperator: an approve or review from a uid an agent may run as.
	CodeNotAnOperator = "not_an_operator"
	CodeBastionDown   = "bastion_down"
	// CodeHeld: the bastion was started with --hold, so it sends nothing.
	CodeHeld = "held"
)

// ErrNoMarkers: nothing on the host records executions (guarantee level none).
var ErrNoMarkers = errors.New("bastion: the host keeps no markers")

// ErrNoHostagent: the host runs a stock sshd, so the hostagent's control operations
// (cancel, spooled output) do not exist there; a marker script's markers are read with its
// own commands instead (bastion/engine/scriptmarkers.go).
var ErrNoHostagent = errors.New("bastion: the host runs no hostagent")

// ErrNotAwaitingApproval: the execution is not waiting for a decision (it was decided, timed
// out, or never needed one).
var ErrNotAwaitingApproval = errors.New("bastion: execution is not awaiting approval")

// ErrNotReviewable: the execution's outcome is known, or Postern is still finding it out.
var ErrNotReviewable = errors.New("bastion: execution cannot be reviewed")
