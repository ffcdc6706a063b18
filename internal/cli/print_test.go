package cli

import (
	"bytes"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

func TestPrintTable(t *testing.T) {
	header := []string{"ID", "STATE", "COMMAND"}
	rows := [][]string{{"ex_1", "completed", "echo short"}, {"ex_22", "running", strings.Repeat("x", 100)}}
	tests := []struct {
		name  string
		width int
		want  string
	}{
		{"no limit", 0, "ID     STATE      COMMAND\nex_1   completed  echo short\nex_22  running    " + strings.Repeat("x", 100) + "\n"},
		{"fits width", 40, "ID     STATE      COMMAND\nex_1   completed  echo short\nex_22  running    " + strings.Repeat("x", 21) + "…\n"},
		{"last column keeps 20", 10, "ID     STATE      COMMAND\nex_1   completed  echo short\nex_22  running    " + strings.Repeat("x", 19) + "…\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := PrintTable(&b, tt.width, header, rows); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tt.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestPrintable(t *testing.T) {
	tests := []struct {
		name, in, want, wantBlock string
	}{
		{"plain", "echo hi", "echo hi", "echo hi"},
		{"unicode", "echo héllo → ✓", "echo héllo → ✓", "echo héllo → ✓"},
		{"newline and tab", "a\n\tb", `a\n\tb`, "a\n\tb"},
		{"terminal escape", "\x1b]0;pwned\x07red", `\x1b]0;pwned\ared`, `\x1b]0;pwned\ared`},
		{"carriage return", "ok\rfake", `ok\rfake`, `ok\rfake`},
		{"invalid UTF-8", "a\xffb", `a\xffb`, `a\xffb`},
		{"C1 control", "a\u009bb", `a\u009bb`, `a\u009bb`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Printable(tt.in); got != tt.want {
				t.Errorf("printable = %q; want %q", got, tt.want)
			}
			if got := PrintableBlock(tt.in); got != tt.wantBlock {
				t.Errorf("printableBlock = %q; want %q", got, tt.wantBlock)
			}
		})
	}
}

func FuzzPrintable(f *testing.F) {
	for _, s := range []string{"echo hi", "\x1b[31m", "a\xffb\n", "\u009b2J"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Printable(s)
		if !utf8.ValidString(out) {
			t.Fatalf("Printable(%q) = %q: invalid UTF-8", s, out)
		}
		for _, r := range out {
			if unicode.IsControl(r) {
				t.Fatalf("Printable(%q) = %q keeps control character %U", s, out, r)
			}
		}
	})
}

func TestCommandText(t *testing.T) {
	tests := []struct {
		name    string
		command []string
		want    string
	}{
		{"ssh_exec line", []string{"sh", "-c", "echo a | wc -l"}, "echo a | wc -l"},
		{"argv", []string{"/bin/bash", "-c", "true"}, "/bin/bash -c true"},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CommandText(&markers.Record{Command: tt.command}); got != tt.want {
				t.Fatalf("commandText = %q; want %q", got, tt.want)
			}
		})
	}
}

// TestWriteMarker: both CLIs print a marker with this one printer: the outcome as "exit N"
// and whatever the host or agent wrote escaped.
func TestWriteMarker(t *testing.T) {
	code := 0
	r := &hostproto.Marker{ID: "ex_1", State: hostproto.MarkerExited, ExitCode: &code,
		Command: []string{"sh", "-c", "echo \x1b]0;pwned\x07"}, Evidence: []string{"note\x1b[2J"}}
	var b bytes.Buffer
	if err := WriteMarker(&b, "db-1", r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"db-1", "exit 0", `echo \x1b]0;pwned\a`, `note\x1b[2J`} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteMarker:\n%s\nwant %q", out, want)
		}
	}
	if strings.ContainsRune(out, 0x1b) {
		t.Errorf("WriteMarker printed a raw escape:\n%q", out)
	}
}
