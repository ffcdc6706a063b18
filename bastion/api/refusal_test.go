package api_test

import (
	"testing"

	"github.com/postern-dev/postern/bastion/api"
)

// TestRefusal: every refusal reads as its code, the reason with what decided, the repair and
// the next step, each a sentence; as a tool error it keeps its code.
func TestRefusal(t *testing.T) {
	tests := []struct {
		name string
		r    api.Refusal
		want string
	}{
		{"all parts", api.Refusal{Code: "denied", Rule: `rules[0] "no-rm"`, Reason: "a deny rule matches this call", Repair: "change the command", Next: "Nothing ran"},
			`denied: a deny rule matches this call (rules[0] "no-rm"). Change the command. Nothing ran.`},
		{"no rule, sentences already ended", api.Refusal{Code: "quota_exceeded", Reason: "used its quota.", Repair: "Wait until tomorrow!"},
			`quota_exceeded: used its quota. Wait until tomorrow!`},
		{"reason only", api.Refusal{Code: "unknown_host", Reason: `there is no host "x"`},
			`unknown_host: there is no host "x".`},
	}
	for _, tt := range tests {
		if got := tt.r.Text(); got != tt.want {
			t.Errorf("%s: Text = %q; want %q", tt.name, got, tt.want)
		}
		if err := tt.r.Err(); err.Code != tt.r.Code || err.Error() != tt.want || err.ExecutionID != "" {
			t.Errorf("%s: Err = %+v; want code %s and the same text", tt.name, err, tt.r.Code)
		}
	}
}
