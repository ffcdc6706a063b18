// Package api holds the wire types of the bastion's surfaces: the arguments and results of
// the MCP tools (what agents send and read), the operator API's views (what the postern CLI
// reads), and ToolError with its stable codes. They are what the engine returns and the
// surfaces encode; they are not storage types (markers.Record is the journal's).
package api

import "fmt"

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
	CodeNotFound             = "not_found"
	CodeJournalUnavailable   = "journal_unavailable"
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
)
