package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/postern-dev/postern/bastion"
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
			if err := printTable(&b, tt.width, header, rows); err != nil {
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
			if got := printable(tt.in); got != tt.want {
				t.Errorf("printable = %q; want %q", got, tt.want)
			}
			if got := printableBlock(tt.in); got != tt.wantBlock {
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
		out := printable(s)
		if !utf8.ValidString(out) {
			t.Fatalf("printable(%q) = %q: invalid UTF-8", s, out)
		}
		for _, r := range out {
			if unicode.IsControl(r) {
				t.Fatalf("printable(%q) = %q keeps control character %U", s, out, r)
			}
		}
	})
}

func TestStateLabel(t *testing.T) {
	delivered := time.Now()
	tests := []struct {
		name string
		rec  markers.Record
		want string
	}{
		{"completed and delivered", markers.Record{State: markers.Completed, ResultDeliveredAt: &delivered}, "completed"},
		{"completed, not delivered", markers.Record{State: markers.Completed}, "completed (not delivered)"},
		{"running", markers.Record{State: markers.Running}, "running"},
		{"unknown", markers.Record{State: markers.Unknown}, "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stateLabel(&tt.rec); got != tt.want {
				t.Fatalf("stateLabel = %q; want %q", got, tt.want)
			}
		})
	}
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
			if got := commandText(&markers.Record{Command: tt.command}); got != tt.want {
				t.Fatalf("commandText = %q; want %q", got, tt.want)
			}
		})
	}
}

func TestLastLineWriter(t *testing.T) {
	const event, checkpoint = `{"type":"event","seq":1}`, `{"type":"checkpoint","note":"postern\n1\nabc\n"}`
	tests := []struct {
		name   string
		writes []string
		want   bool
	}{
		{"empty", nil, true},
		{"ends with a checkpoint", []string{event + "\n" + checkpoint + "\n"}, true},
		{"split anywhere", []string{event + "\n{\"ty", "pe\":\"checkp", "oint\",\"note\":\"x\"}", "\n"}, true},
		{"ends with an event", []string{checkpoint + "\n" + event + "\n"}, false},
		{"cut inside the checkpoint", []string{event + "\n" + checkpoint[:30]}, false},
		{"no final newline", []string{event + "\n" + checkpoint}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			w := &lastLineWriter{w: &out}
			for _, s := range tt.writes {
				if _, err := w.Write([]byte(s)); err != nil {
					t.Fatal(err)
				}
			}
			if got := w.endsSealed(); got != tt.want {
				t.Fatalf("endsSealed = %v; want %v", got, tt.want)
			}
			if out.String() != strings.Join(tt.writes, "") {
				t.Fatal("the writes were not passed through")
			}
		})
	}
}

// TestShowNamesThePreviousAttempt: `executions show` of a new attempt links it to the failed
// execution it retries, and a refused execution to the holder of its operation key.
func TestShowNamesThePreviousAttempt(t *testing.T) {
	r := &markers.Record{
		ID: "ex_01K0000000000000000000000B", State: markers.Failed, IdempotencyKey: "deploy-1",
		PreviousAttempt: "ex_01K0000000000000000000000A", OperationKey: "migration:7",
		OperationTakenBy: "ex_01K0000000000000000000000H",
	}
	var out strings.Builder
	if err := writeExecution(&out, &bastion.ExecutionDetail{Record: r}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"previous attempt    ex_01K0000000000000000000000A", "operation taken by  ex_01K0000000000000000000000H"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("show does not print %q:\n%s", want, out.String())
		}
	}
}

func TestEventStep(t *testing.T) {
	tests := []struct {
		ev   markers.Event
		want string
	}{
		{markers.Event{Kind: markers.KindCreate, To: markers.Accepted}, "→ accepted"},
		{markers.Event{Kind: markers.KindTransition, From: markers.Accepted, To: markers.Authorized}, "accepted → authorized"},
		{markers.Event{Kind: markers.KindUpdate, From: markers.Completed, To: markers.Completed}, "completed (update)"},
		{markers.Event{Kind: markers.KindDeliveryRevoked, From: markers.Completed, To: markers.Completed}, "completed (delivery revoked)"},
	}
	for _, tt := range tests {
		if got := eventStep(tt.ev); got != tt.want {
			t.Errorf("eventStep(%s) = %q; want %q", tt.ev.Kind, got, tt.want)
		}
	}
}
