package integration

import (
	"os/exec"
	"regexp"
	"testing"

	"github.com/postern-dev/postern/internal/testutil/harness"
)

// TestEveryBinaryPrintsItsVersion runs each built binary with --version (and the version
// subcommand where the CLI has subcommands): one line, its name, the module version, the VCS
// revision Go stamped into a build from a checkout, and the toolchain — exit 0, nothing else
// started (the plugin does not wait for a go-plugin handshake, the supervisor supervises nothing).
func TestEveryBinaryPrintsItsVersion(t *testing.T) {
	for _, tt := range []struct {
		bin  string
		args [][]string
	}{
		{"postern", [][]string{{"--version"}, {"version"}}},
		{"postern-hostagent", [][]string{{"--version"}, {"version"}}},
		{"postern-plugin-http", [][]string{{"--version"}}},
		{"postern-supervisor", [][]string{{"--version"}}},
	} {
		bin := harness.Binary(t, tt.bin)
		want := regexp.MustCompile(`^` + regexp.QuoteMeta(tt.bin) + ` \S+ \((rev [0-9a-f]{7,12}(\+dirty)?|no vcs revision), go[0-9.]+\S*\)\n$`)
		for _, args := range tt.args {
			out, err := exec.Command(bin, args...).CombinedOutput()
			if err != nil || !want.Match(out) {
				t.Errorf("%s %v = %q, %v; want one line matching %s", tt.bin, args, out, err, want)
			}
		}
	}
}
