package testutil

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestAnchors(t *testing.T) {
	text := "# Postern\n" +
		"## Result delivery: what counts as evidence\n" +
		"## The journal and markers store (`markers/`)\n" +
		"## Intent scope and the matching rule\n" +
		"```sh\n# not a heading\n```\n" +
		"### Hosts — without the hostagent\n" +
		"## Tools\n## Tools\n"
	got := Anchors(text)
	want := []string{
		"postern",
		"result-delivery-what-counts-as-evidence",
		"the-journal-and-markers-store-markers",
		"intent-scope-and-the-matching-rule",
		"hosts--without-the-hostagent",
		"tools", "tools-1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Anchors = %q; want %q", got, want)
	}
}

// docsRepo is a repository of two pages and one source file, for the checks to judge.
func docsRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{"bastion/match.go", "docs/design.md"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte("# Design\n## The matching rule\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestMissingPaths: a page that names a file the repository lacks fails; one that names
// files it has passes.
func TestMissingPaths(t *testing.T) {
	good := Page{Path: "docs/good.md", Text: "The rule is `bastion/match.go`; see design.md and `docs/design.md`.\n"}
	bad := Page{Path: "docs/bad.md", Text: "The rule is `bastion/nomatch.go`, designed in PLANS.md.\n"}
	root := docsRepo(t)
	if p := MissingPaths(root, []Page{good}); len(p) != 0 {
		t.Errorf("MissingPaths(good) = %q; want none", p)
	}
	p := MissingPaths(root, []Page{bad})
	if len(p) != 2 || !strings.Contains(p[0], "bastion/nomatch.go") || !strings.Contains(p[1], "PLANS.md") {
		t.Errorf("MissingPaths(bad) = %q; want bastion/nomatch.go and PLANS.md", p)
	}
}

// TestBrokenLinks: links to a missing page, to a missing anchor, or out of the repository
// fail; links to pages, headings and files that exist pass. Code is not prose: a link
// shown in a code span or block is not followed.
func TestBrokenLinks(t *testing.T) {
	root := docsRepo(t)
	readme := Page{Path: "README.md", Text: "# Postern\n## Read on\n" +
		"[design](docs/design.md), [the rule](docs/design.md#the-matching-rule), [up](#read-on), " +
		"[code](bastion/match.go), [web](https://example.com/x.md).\n" +
		"`[not a link](nowhere.md)`\n```\n[not a link](nowhere.md)\n```\n"}
	design := Page{Path: "docs/design.md", Text: "# Design\n## The matching rule\nBack to [the README](../README.md#postern).\n"}
	if p := BrokenLinks(root, []Page{readme, design}); len(p) != 0 {
		t.Errorf("BrokenLinks(good) = %q; want none", p)
	}
	bad := Page{Path: "docs/bad.md", Text: "[a](missing.md) [b](design.md#no-such-heading) [c](#nowhere) [d](../../etc/passwd)\n"}
	p := BrokenLinks(root, []Page{readme, design, bad})
	for i, want := range []string{"missing.md", "#no-such-heading", "#nowhere", "outside the repository"} {
		if i >= len(p) || !strings.Contains(p[i], want) {
			t.Errorf("BrokenLinks(bad) = %q; want a problem naming %q at %d", p, want, i)
		}
	}
	if len(p) != 4 {
		t.Errorf("BrokenLinks(bad) found %d problems; want 4: %q", len(p), p)
	}
}

// TestCommands: commands are found in sh blocks (continued lines, trailing comments, go run,
// claude mcp add) and in whole inline code spans, and a command that does not parse is
// reported with its page.
func TestCommands(t *testing.T) {
	page := Page{Path: "docs/x.md", Text: "```sh\n" +
		"go run ./cmd/postern up --listen 127.0.0.1:7410   # the daemon\n" +
		"claude mcp add postern -- postern mcp\n" +
		"postern executions list \\\n  --state running\n" +
		"```\n" +
		"Run `postern executions show ID`, not `postern approve ID [--note]` (a usage line).\n"}
	got := Commands([]Page{page}, "postern")
	want := [][]string{{"up", "--listen", "127.0.0.1:7410"}, {"mcp"}, {"executions", "list", "--state", "running"}, {"executions", "show", "ID"}}
	if len(got) != len(want) {
		t.Fatalf("Commands = %q; want %q", got, want)
	}
	for i := range want {
		if got[i].Page != "docs/x.md" || !reflect.DeepEqual(got[i].Args, want[i]) {
			t.Errorf("Commands[%d] = %q; want %q", i, got[i], want[i])
		}
	}
	// A run that knows only `up` and `mcp`: the others are reported, with the page.
	checked, problems := CommandProblems([]Page{page}, "postern", func(args []string) (int, string) {
		if args[0] == "up" || args[0] == "mcp" {
			return 0, ""
		}
		return 2, "unknown command"
	})
	if checked != 4 || len(problems) != 2 || !strings.HasPrefix(problems[0], "docs/x.md shows `postern executions list --state running`") {
		t.Errorf("CommandProblems = %d, %q; want 4 checked, 2 problems from docs/x.md", checked, problems)
	}
}
