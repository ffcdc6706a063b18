package api_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
)

// TestToolError: the message a caller reads starts with the stable code, and a wrapped
// ToolError is still found with errors.As.
func TestToolError(t *testing.T) {
	err := fmt.Errorf("exec: %w", &api.ToolError{Code: api.CodeNotFound, Message: "no execution ex_1", ExecutionID: "ex_1"})
	if got, want := err.Error(), "exec: not_found: no execution ex_1"; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
	var te *api.ToolError
	if !errors.As(err, &te) || te.Code != api.CodeNotFound || te.ExecutionID != "ex_1" {
		t.Errorf("errors.As = %+v; want the not_found ToolError of ex_1", te)
	}
}

// TestInvalid: an argument error is an invalid_argument ToolError with the formatted message
// and no execution.
func TestInvalid(t *testing.T) {
	err := api.Invalid("wait_s %d is negative", -1)
	var te *api.ToolError
	if !errors.As(err, &te) {
		t.Fatalf("Invalid() = %T; want *api.ToolError", err)
	}
	if got, want := *te, (api.ToolError{Code: api.CodeInvalidArgument, Message: "wait_s -1 is negative"}); got != want {
		t.Errorf("Invalid() = %+v; want %+v", got, want)
	}
	if got, want := err.Error(), "invalid_argument: wait_s -1 is negative"; got != want {
		t.Errorf("Error() = %q; want %q", got, want)
	}
}
