package datadriven

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRunFile: a file's blocks reach the function with their arguments and flags, and what
// the file expects is what it is checked against; comments and the layout survive a rewrite.
func TestRunFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "table")
	text := "# a comment\nadd a=1 b=2\n----\n3\n\n# negated\nadd a=1 b=2 neg\n----\n-3\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var seen []string
	RunFile(t, file, func(t *testing.T, c Case) string {
		seen = append(seen, c.Name+"@"+strconv.Itoa(c.Line))
		a, errA := strconv.Atoi(c.Args["a"])
		b, errB := strconv.Atoi(c.Args["b"])
		if errA != nil || errB != nil {
			c.Fatalf(t, "args %v", c.Args)
		}
		if c.Flags["neg"] {
			return strconv.Itoa(-(a + b))
		}
		return strconv.Itoa(a + b)
	})
	if strings.Join(seen, ",") != "add@2,add@7" {
		t.Errorf("commands seen %q; want add at lines 2 and 7", seen)
	}
	cases, tail, err := parse(file, text)
	if err != nil || len(cases) != 2 || tail != "" || cases[1].comment != "\n# negated\n" || cases[1].Want != "-3" {
		t.Errorf("parse = %+v, %q, %v", cases, tail, err)
	}
	if _, _, err := parse(file, "add a=1\n3\n"); err == nil {
		t.Error("a command without ---- parsed")
	}
}
