// Package datadriven runs data-driven tests of pure decisions, pebble style: a testdata file of
// blocks — comment and blank lines, a command line of key=value arguments and bare flags,
// "----", and the expected output up to the next blank line — each checked against what a
// function makes of its command. Run with -rewrite to write the current outputs back into the
// files after a deliberate change, and read the diff.
package datadriven

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of the data-driven test files from the current behaviour")

// Case is one block of a file.
type Case struct {
	// File and Line locate the command.
	File string
	Line int
	// Cmd is the command line; Name its first word.
	Cmd, Name string
	// Args are its key=value words; Flags its other words.
	Args  map[string]string
	Flags map[string]bool
	// Want is the expected output.
	Want string

	comment string // the lines before the command (comments, blank lines)
}

// Fatalf fails the test at the case's line.
func (c Case) Fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s:%d: %s", c.File, c.Line, fmt.Sprintf(format, args...))
}

// RunDir runs every file in dir as a subtest named after it (see RunFile).
func RunDir(t *testing.T, dir string, do func(t *testing.T, c Case) string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no data-driven files in %s: %v", dir, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { RunFile(t, file, do) })
	}
}

// RunFile checks every case of file against do's output for it, or with -rewrite writes do's
// outputs into the file.
func RunFile(t *testing.T, file string, do func(t *testing.T, c Case) string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cases, tail, err := parse(file, string(data))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, c := range cases {
		got := do(t, c)
		if !*rewrite && got != c.Want {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", file, c.Line, c.Cmd, got, c.Want)
		}
		fmt.Fprintf(&out, "%s%s\n----\n%s\n", c.comment, c.Cmd, got)
	}
	out.WriteString(tail)
	if *rewrite {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// parse reads the blocks of a file; tail is what follows the last one.
func parse(file, text string) (cases []Case, tail string, err error) {
	lines := strings.Split(text, "\n")
	var comment strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if line == "" || strings.HasPrefix(line, "#") {
			comment.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(line)
		c := Case{File: file, Line: i + 1, Cmd: line, Name: fields[0], comment: comment.String(),
			Args: map[string]string{}, Flags: map[string]bool{}}
		comment.Reset()
		for _, f := range fields[1:] {
			if k, v, ok := strings.Cut(f, "="); ok {
				c.Args[k] = v
			} else {
				c.Flags[f] = true
			}
		}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			return nil, "", fmt.Errorf("%s:%d: want ---- after the command", file, i+1)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		c.Want = strings.Join(want, "\n")
		// The blank line that ends the block belongs to the next block's comment.
		if i < len(lines) {
			comment.WriteString("\n")
		}
		cases = append(cases, c)
	}
	return cases, strings.TrimSuffix(comment.String(), "\n"), nil
}
