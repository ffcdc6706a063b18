// Command postern-supervisor is the per-host supervisor the hostagent hands its commands to
// (`postern-supervisor supervise`, see supervisor.Main): one long-lived process, apart from
// the SSH-facing agent, that forks each command. It is built on its own so that starting it
// does not pay for the agent's package initialization; the hostagent uses it when it sits
// next to the agent binary and falls back to re-executing itself. Both must come from the
// same build.
//
// The package also installs it as postern-shim, the name a hostagent of the previous release
// starts (`postern-shim shim`) while its package is upgraded under it; that name goes with
// the per-command mode (supervisor's percommand.go).
package main

import (
	"fmt"
	"os"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/version"
)

func main() {
	if supervisor.Invoked(os.Args) {
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	if len(os.Args) == 2 && cli.IsVersionFlag(os.Args[1]) {
		fmt.Println(version.Line("postern-supervisor"))
		return
	}
	fmt.Fprintln(os.Stderr, "usage: postern-supervisor "+supervisor.Subcommand+" (started by postern-hostagent, not by people) | postern-supervisor --version")
	os.Exit(2)
}
