package version

import "testing"

func TestInfoString(t *testing.T) {
	tests := []struct {
		name string
		info Info
		want string
	}{
		{"tagged", Info{Module: "v0.3.0", Revision: "384a9f6c1d2e3f40", Go: "go1.26.8"}, "v0.3.0 (rev 384a9f6c1d2e, go1.26.8)"},
		{"dirty", Info{Module: "(devel)", Revision: "384a9f6", Modified: true, Go: "go1.26.8"}, "(devel) (rev 384a9f6+dirty, go1.26.8)"},
		{"no vcs", Info{Module: "(devel)", Go: "go1.26.8"}, "(devel) (no vcs revision, go1.26.8)"},
	}
	for _, tt := range tests {
		if got := tt.info.String(); got != tt.want {
			t.Errorf("%s: got = %q; want %q", tt.name, got, tt.want)
		}
	}
}

func TestGetNamesAToolchain(t *testing.T) {
	if got := Get(); got.Go == "" || got.Module == "" {
		t.Fatalf("got = %+v; want a module version and a toolchain", got)
	}
}
