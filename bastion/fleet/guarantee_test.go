package fleet

import (
	"strings"
	"testing"
)

func TestCheckGuarantee(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name      string
		guarantee Guarantee
		digest    string
		wantErr   bool
	}{
		{"default", "", "", false},
		{"hostagent", GuaranteeHostagent, "", false},
		{"none", GuaranteeNone, "", false},
		{"marker script", GuaranteeMarkerScript, digest, false},
		{"marker script without digest", GuaranteeMarkerScript, "", true},
		{"marker script with a short digest", GuaranteeMarkerScript, "abc", true},
		{"digest without the marker script", GuaranteeNone, digest, true},
		{"unknown level", "agent", "", true},
	} {
		if err := checkGuarantee(tc.guarantee, tc.digest); (err != nil) != tc.wantErr {
			t.Errorf("%s: checkGuarantee = %v; want error %v", tc.name, err, tc.wantErr)
		}
	}
}
