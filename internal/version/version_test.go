package version

import "testing"

func TestInfoString(t *testing.T) {
	tests := []struct {
		name string
		info Info
		want string
	}{
		{"tagged", Info{Version: "0.3.0", Module: "v0.3.0", Revision: "384a9f6c1d2e3f40", Go: "go1.26.8"}, "0.3.0 (rev 384a9f6c1d2e, go1.26.8)"},
		{"dirty", Info{Version: devel, Module: "(devel)", Revision: "384a9f6", Modified: true, Go: "go1.26.8"}, "0.0.0-devel (rev 384a9f6+dirty, go1.26.8)"},
		{"no vcs", Info{Version: devel, Module: "(devel)", Go: "go1.26.8"}, "0.0.0-devel (no vcs revision, go1.26.8)"},
	}
	for _, tt := range tests {
		if got := tt.info.String(); got != tt.want {
			t.Errorf("%s: got = %q; want %q", tt.name, got, tt.want)
		}
	}
}

func TestGetNamesAToolchain(t *testing.T) {
	if got := Get(); got.Go == "" || got.Module == "" || got.Version == "" {
		t.Fatalf("got = %+v; want a module version and a toolchain", got)
	}
}

// TestVersionOf: a package's stamp wins; else a module version, as packages write it;
// else the devel version.
func TestVersionOf(t *testing.T) {
	tests := []struct{ stamped, module, want string }{
		{"1.4.0", "(devel)", "1.4.0"},
		{"0.0.0~git20261202093000.0ee6902", "v0.3.0", "0.0.0~git20261202093000.0ee6902"},
		{"", "v0.3.0", "0.3.0"},
		{"", "v0.0.0-20261202093000-0ee690212345", "0.0.0-20261202093000-0ee690212345"},
		{"", "(devel)", devel},
		{"", "", devel},
	}
	for _, tt := range tests {
		if got := versionOf(tt.stamped, tt.module); got != tt.want {
			t.Errorf("versionOf(%q, %q) = %q; want %q", tt.stamped, tt.module, got, tt.want)
		}
	}
	if got := Number(); got != Get().Version || got == "" {
		t.Errorf("Number = %q; want Get().Version", got)
	}
}
