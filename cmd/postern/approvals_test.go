package main

import (
	"strings"
	"testing"
)

// TestDecisionFlags: approve takes a note, deny a required reason, and each -h lists only
// its own.
func TestDecisionFlags(t *testing.T) {
	approve := runCLI(t, "", "approve", "-h").stderr
	if !strings.Contains(approve, "-note") || strings.Contains(approve, "-reason") {
		t.Errorf("approve -h:\n%s\nwant -note, not -reason", approve)
	}
	deny := runCLI(t, "", "deny", "-h").stderr
	if !strings.Contains(deny, "-reason") || !strings.Contains(deny, "required") || strings.Contains(deny, "-note") {
		t.Errorf("deny -h:\n%s\nwant -reason (required), not -note", deny)
	}
}
