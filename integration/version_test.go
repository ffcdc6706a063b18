package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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

// TestOneVersionString: a build stamped as scripts/package stamps the packages says the one
// version everywhere — in --version after its name, and as the MCP server's
// serverInfo.version.
func TestOneVersionString(t *testing.T) {
	const stamp = "9.8.7~test"
	bin := filepath.Join(t.TempDir(), "postern")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/postern-dev/postern/internal/version.release="+stamp, "-o", bin, "../cmd/postern")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "postern "+stamp+" (") {
		t.Fatalf("--version = %q, %v; want postern %s (…)", out, err, stamp)
	}
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey)
	b.Bin = bin
	b.Start(t)
	cs := b.Connect(t, "agent", nil)
	if got := cs.InitializeResult().ServerInfo.Version; got != stamp {
		t.Errorf("serverInfo.version = %q; want %q, as --version says", got, stamp)
	}
}
