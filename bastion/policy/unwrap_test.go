package policy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/parse.json and testdata/unwrap.json with what Parse returns now")

type scriptCase struct {
	Command string `json:"command"`
	Why     string `json:"why,omitempty"`
	// Known: every program is known (Script.Known). Unknowable is then "", else the word
	// of the first unknowable (or "-" when it names none).
	Known      bool     `json:"known"`
	Unknowable string   `json:"unknowable,omitempty"`
	Layers     []string `json:"layers"`
	Writes     []string `json:"writes,omitempty"`
	Reads      []string `json:"reads,omitempty"`
}

// layerLine is a layer as the testdata shows it: "DEPTH[ VIA]: WORDS".
func layerLine(l Layer) string {
	if l.Via == "" {
		return fmt.Sprintf("%d: %s", l.Depth, l)
	}
	return fmt.Sprintf("%d %s: %s", l.Depth, l.Via, l)
}

// fileLine is a file as the testdata shows it: the path, ‹…› when only known at run time.
func fileLine(f File) string {
	if f.Unknown {
		return "‹" + f.Path + "›"
	}
	return f.Path
}

func scriptResult(c scriptCase) scriptCase {
	s := Parse(c.Command)
	got := scriptCase{Command: c.Command, Why: c.Why, Known: s.Known(), Layers: []string{}}
	if !s.Known() {
		got.Unknowable = s.Unknowable[0].Word
		if got.Unknowable == "" {
			got.Unknowable = "-"
		}
	}
	for _, l := range s.Layers {
		got.Layers = append(got.Layers, layerLine(l))
	}
	for _, f := range s.Writes {
		got.Writes = append(got.Writes, fileLine(f))
	}
	for _, f := range s.Reads {
		got.Reads = append(got.Reads, fileLine(f))
	}
	return got
}

// runScriptCases runs a testdata file of command lines: each, parsed, gives the layers,
// files and knowability listed (go test -run 'TestParse|TestUnwrap' -rewrite regenerates).
func runScriptCases(t *testing.T, file string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cases []scriptCase
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cases); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for i, tc := range cases {
		got := scriptResult(tc)
		if *rewrite {
			cases[i] = got
			continue
		}
		if got.Known != tc.Known || got.Unknowable != tc.Unknowable || strings.Join(got.Layers, "\n") != strings.Join(tc.Layers, "\n") ||
			strings.Join(got.Writes, "\n") != strings.Join(tc.Writes, "\n") || strings.Join(got.Reads, "\n") != strings.Join(tc.Reads, "\n") {
			t.Errorf("%q (%s):\ngot  known=%v unknowable=%q layers=%q writes=%q reads=%q\nwant known=%v unknowable=%q layers=%q writes=%q reads=%q",
				tc.Command, tc.Why, got.Known, got.Unknowable, got.Layers, got.Writes, got.Reads, tc.Known, tc.Unknowable, tc.Layers, tc.Writes, tc.Reads)
		}
	}
	if *rewrite {
		var b bytes.Buffer
		b.WriteString("[\n")
		for i, c := range cases {
			line, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(line)
			if i < len(cases)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString("]\n")
		if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUnwrap runs testdata/unwrap.json: the wrappers, seen through.
func TestUnwrap(t *testing.T) { runScriptCases(t, "testdata/unwrap.json") }

// TestParse runs testdata/parse.json: shell syntax — which programs are known, and the
// files redirections open.
func TestParse(t *testing.T) { runScriptCases(t, "testdata/parse.json") }
