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

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/unwrap.json with what Unwrap returns now")

type unwrapCase struct {
	Command string   `json:"command"`
	Why     string   `json:"why,omitempty"`
	Certain bool     `json:"certain"`
	Layers  []string `json:"layers"`
}

// layerLine is a layer as testdata/unwrap.json shows it: "DEPTH[ VIA]: WORDS".
func layerLine(l Layer) string {
	if l.Via == "" {
		return fmt.Sprintf("%d: %s", l.Depth, l)
	}
	return fmt.Sprintf("%d %s: %s", l.Depth, l.Via, l)
}

// TestUnwrap runs testdata/unwrap.json: each command line, parsed and unwrapped, gives the
// layers listed and is as certain as listed (go test -run TestUnwrap -rewrite regenerates).
func TestUnwrap(t *testing.T) {
	raw, err := os.ReadFile("testdata/unwrap.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []unwrapCase
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cases); err != nil {
		t.Fatalf("testdata/unwrap.json: %v", err)
	}
	for i, tc := range cases {
		cmd := parseForPolicy(tc.Command)
		got := unwrapCase{Command: tc.Command, Why: tc.Why, Certain: cmd.safe, Layers: []string{}}
		for _, l := range cmd.layers {
			got.Layers = append(got.Layers, layerLine(l))
		}
		if *rewrite {
			cases[i] = got
			continue
		}
		if got.Certain != tc.Certain || strings.Join(got.Layers, "\n") != strings.Join(tc.Layers, "\n") {
			t.Errorf("%q:\ngot  certain=%v layers=%q\nwant certain=%v layers=%q", tc.Command, got.Certain, got.Layers, tc.Certain, tc.Layers)
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
		if err := os.WriteFile("testdata/unwrap.json", b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
