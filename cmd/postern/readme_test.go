package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
)

// runForDocs runs the postern CLI in process, for the documentation checks.
func runForDocs(args []string) (int, string) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	return prog.ExitCode(err, &stderr), stderr.String()
}

// TestDocCommandsParse: every `postern …` command README.md and docs/*.md show (their shell
// blocks and whole inline commands) is one this binary accepts.
func TestDocCommandsParse(t *testing.T) {
	testutil.CheckDocCommands(t, "postern", 80, runForDocs)
}

// TestDocCommandsCheckFails: the check reports a page that shows a flag or a command this
// binary does not have.
func TestDocCommandsCheckFails(t *testing.T) {
	page := testutil.Page{Path: "docs/bad.md", Text: "```sh\n" +
		"postern executions list --state running\n" +
		"postern executions list --no-such-flag\n" +
		"postern no-such-command\n" +
		"```\n"}
	checked, problems := testutil.CommandProblems([]testutil.Page{page}, "postern", runForDocs)
	if checked != 3 || len(problems) != 2 {
		t.Fatalf("CommandProblems = %d checked, %q; want 3 checked, 2 problems", checked, problems)
	}
	if !strings.Contains(problems[0], "--no-such-flag") || !strings.Contains(problems[1], "no-such-command") {
		t.Errorf("problems = %q; want the bad flag, then the bad command", problems)
	}
}

// TestDocPathsExist: every file or directory of this repository README.md and docs/*.md name
// is in it.
func TestDocPathsExist(t *testing.T) {
	root, pages := testutil.DocPages(t)
	if refs := testutil.Paths(pages); len(refs) < 120 {
		t.Fatalf("found only %d repository paths in README.md and docs/: %q", len(refs), refs)
	}
	for _, p := range testutil.MissingPaths(root, pages) {
		t.Error(p)
	}
}

// TestDocLinksResolve: every relative link between README.md and the docs/ pages (anchors
// included) leads somewhere, the README links into docs/, and the docs index lists every page.
func TestDocLinksResolve(t *testing.T) {
	root, pages := testutil.DocPages(t)
	for _, p := range testutil.BrokenLinks(root, pages) {
		t.Error(p)
	}
	linked := map[string]map[string]bool{} // page → pages it links to
	for _, l := range testutil.Links(pages) {
		file, _, _ := strings.Cut(l.Target, "#")
		if linked[l.Page] == nil {
			linked[l.Page] = map[string]bool{}
		}
		linked[l.Page][file] = true
	}
	if !linked["README.md"]["docs/README.md"] {
		t.Error("README.md does not link to docs/README.md, the index of the docs")
	}
	for _, p := range pages {
		if name, ok := strings.CutPrefix(p.Path, "docs/"); ok && name != "README.md" && !linked["docs/README.md"][name] {
			t.Errorf("docs/README.md, the index, does not link to %s", p.Path)
		}
	}
}
