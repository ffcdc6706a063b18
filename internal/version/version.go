// Package version names the build a Postern binary came from: the module version and the VCS
// revision Go stamped into it (debug.ReadBuildInfo), so every binary's --version and every
// version a daemon reports to another come from one place.
package version

import (
	"fmt"
	"runtime/debug"
)

// Info is what a binary knows about its own build.
type Info struct {
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
		return Info{Module: "(unknown)"}
	}
	info := Info{Module: bi.Main.Version, Go: bi.GoVersion}
	if info.Module == "" {
		info.Module = "(devel)"
	}
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

// String is the one-line form a --version prints, e.g.
// "v0.3.0 (rev 384a9f6c1d2e, go1.26.8)" or "(devel) (rev 384a9f6c1d2e+dirty, go1.26.8)".
func (i Info) String() string {
	rev := "no vcs revision"
	if i.Revision != "" {
		rev = "rev " + short(i.Revision)
		if i.Modified {
			rev += "+dirty"
		}
	}
	return fmt.Sprintf("%s (%s, %s)", i.Module, rev, i.Go)
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
// "postern v0.3.0 (rev 384a9f6c1d2e, go1.26.8)".
func Line(name string) string { return name + " " + String() }
