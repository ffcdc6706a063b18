package engine

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
)

// TestOperatorRefusal: who may approve or review, from the operator socket's peer uid: with
// [approvals] operators, those named and no other; by default anyone but a uid an agent may
// run as, the execution's caller first.
func TestOperatorRefusal(t *testing.T) {
	agents := map[int]string{1000: "the bastion's own user", 1001: "the uid of local actor ci"}
	for _, tc := range []struct {
		name   string
		uid    int
		named  []int
		caller int
		want   string // a phrase of the refusal; "" to be taken
	}{
		{"root, nothing named", 0, nil, -1, ""},
		{"another user", 1002, nil, -1, ""},
		{"the bastion's user", 1000, nil, -1, "the bastion's own user"},
		{"a local actor's uid", 1001, nil, -1, "local actor ci"},
		{"the caller", 1002, nil, 1002, "does not approve its own call"},
		{"unreadable uid", -1, nil, -1, "could not be read"},
		{"named", 1000, []int{1000}, -1, ""},
		{"named, and the caller", 1000, []int{1000}, 1000, ""},
		{"not named", 0, []int{1000}, -1, "not one of [approvals] operators"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := operatorRefusal(api.Operator{Name: "operator:x", UID: tc.uid}, tc.named, tc.caller, agents)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("operatorRefusal = %q; want %q", got, tc.want)
			}
		})
	}
}
