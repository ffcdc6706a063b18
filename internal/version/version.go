// Package version names the build a Postern binary came from: one version string (stamped
// by scripts/package, else the module's), the VCS revision Go stamped into it
// (debug.ReadBuildInfo) and the toolchain, so every binary's --version, the packages, the
// MCP server's serverInfo and every version a daemon reports to another come from one place.
package version

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// release is the version a release build carries, stamped by scripts/package (go build
// -ldflags "-X github.com/postern-dev/postern/internal/version.release=VERSION") with the
// version it gives the .deb packages, so the packages, --version and the MCP server's
// serverInfo.version say the same.
var release string

// devel is the version of a build that was neither stamped nor built from a tagged module.
const devel = "0.0.0-devel"

// Info is what a binary knows about its own build.
type Info struct {
	// Version is the one version string of the build, everywhere it is shown (Number).
	Version string `json:"version"`
	// Module is the main module's version: a tag, a pseudo-version, or "(devel)" for a build
	// from a work tree.
	Module string `json:"module"`
	// Revision is the VCS commit the binary was built from, empty when Go recorded none
	// (go run, go test, or a build outside a checkout).
	Revision string `json:"revision,omitempty"`
	// Modified reports uncommitted changes in the work tree at build time.
	Modified bool `json:"modified,omitempty"`
	// Go is the toolchain that built the binary.
	Go string `json:"go"`
}

// Get reads the running binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: versionOf(release, ""), Module: "(unknown)"}
	}
	info := Info{Module: bi.Main.Version, Go: bi.GoVersion}
	if info.Module == "" {
		info.Module = "(devel)"
	}
	info.Version = versionOf(release, info.Module)
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// versionOf is the version of a build stamped with stamped ("" when not) from module (the
// build info's main module version): the stamp, else a module version without its "v" (as
// packages write versions), else devel.
func versionOf(stamped, module string) string {
	switch {
	case stamped != "":
		return stamped
	case strings.HasPrefix(module, "v") && len(module) > 1 && module[1] >= '0' && module[1] <= '9':
		return module[1:]
	}
	return devel
}

// Number is the running binary's version: what its package is called, what --version
// prints after the name, and what the MCP server announces (serverInfo.version).
func Number() string { return Get().Version }

// String is the one-line form a --version prints after the name, e.g.
// "1.4.0 (rev 384a9f6c1d2e, go1.26.8)" or "0.0.0-devel (rev 384a9f6c1d2e+dirty, go1.26.8)".
func (i Info) String() string {
	rev := "no vcs revision"
	if i.Revision != "" {
		rev = "rev " + short(i.Revision)
		if i.Modified {
			rev += "+dirty"
		}
	}
	return fmt.Sprintf("%s (%s, %s)", i.Version, rev, i.Go)
}

// String is Get().String().
func String() string { return Get().String() }

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

// Line is what NAME --version prints: the binary's name and String(), e.g.
// "postern 1.4.0 (rev 384a9f6c1d2e, go1.26.8)".
func Line(name string) string { return name + " " + String() }
