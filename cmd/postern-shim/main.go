// Command postern-shim is the supervisor the hostagent starts for each command (`postern-shim
// shim`, see shim.Main), built on its own so a start does not pay for the agent's package
// initialization (~4 ms of a ~7 ms re-exec). The hostagent uses it when it sits next to the
// agent binary and falls back to re-executing itself; both must come from the same build.
package main

import (
	"fmt"
	"os"

	"github.com/postern-dev/postern/hostagent/shim"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/version"
)

func main() {
	if len(os.Args) == 2 && cli.IsVersionFlag(os.Args[1]) {
		fmt.Println(version.Line("postern-shim"))
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "shim" {
		fmt.Fprintln(os.Stderr, "usage: postern-shim shim (started by postern-hostagent, not by people) | postern-shim --version")
		os.Exit(2)
	}
	os.Exit(shim.Main(os.Args[2:]))
}
