package engine

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
)

// TestCheckStockCallKeepsTheWrapperAtHome: the variables a stock sshd refuses are exported
// at the head of the line, before the wrapper runs, so HOME would move the marker script
// and its markers away from where the bastion reads them (`~/.postern/run status` finds no
// marker, "never started"): refused on a marker-script host, before anything is journaled.
func TestCheckStockCallKeepsTheWrapperAtHome(t *testing.T) {
	script := fleet.Host{Name: "h1", Guarantee: fleet.GuaranteeMarkerScript, ScriptSHA256: strings.Repeat("ab", 32)}
	for _, tc := range []struct {
		name    string
		host    fleet.Host
		env     map[string]string
		wantErr bool
	}{
		{"marker script, HOME", script, map[string]string{"HOME": "/tmp/elsewhere"}, true},
		{"marker script, other env", script, map[string]string{"LANG": "C.UTF-8"}, false},
		{"level none, HOME", fleet.Host{Name: "h1", Guarantee: fleet.GuaranteeNone}, map[string]string{"HOME": "/tmp/elsewhere"}, false},
		{"hostagent, HOME", fleet.Host{Name: "h1"}, map[string]string{"HOME": "/tmp/elsewhere"}, false},
	} {
		err := checkAgentlessCall(tc.host, api.ExecArgs{Command: "true", Env: tc.env}, "")
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: checkStockCall = %v; want error %v", tc.name, err, tc.wantErr)
		}
	}
}
