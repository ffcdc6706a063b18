package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/anmitsu/go-shlex"
)

// The product's documentation is README.md (the front door) and the pages under docs/; the
// tests keep both true: the commands they show parse, the repository paths they name exist,
// and their links between pages (anchors included) resolve.

// Page is one markdown page of the documentation.
type Page struct {
	Path string // relative to the module root, slash-separated: "README.md", "docs/design.md"
	Text string
}

// ModuleRoot is the directory of the module under test.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("find module root: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// README is the module's README.md (the product's front door, which its tests keep true).
func README(t testing.TB) (root, text string) {
	t.Helper()
	root = ModuleRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return root, string(b)
}

// DocPages returns README.md and every docs/*.md of the module, README first, then the docs
// pages by name.
func DocPages(t testing.TB) (root string, pages []Page) {
	t.Helper()
	root, text := README(t)
	pages = []Page{{Path: "README.md", Text: text}}
	names, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, Page{Path: "docs/" + filepath.Base(name), Text: string(b)})
	}
	return root, pages
}

var (
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// Shell operators that end one command of a line.
	shellOps = map[string]bool{"&&": true, "||": true, ";": true, "|": true, "&": true}
)

// Command is one invocation of a binary a page shows: the argument list after the binary.
type Command struct {
	Page string
	Args []string
}

// Commands returns the invocations of binary (its name, a path ending in it, or `go run
// ./cmd/NAME`) the pages show: in ```sh blocks, and in inline code spans that are a whole
// command with no placeholders for alternatives ([optional], a|b, <name>).
func Commands(pages []Page, binary string) []Command {
	var cmds []Command
	for _, p := range pages {
		for _, args := range pageCommands(p.Text, binary) {
			cmds = append(cmds, Command{Page: p.Path, Args: args})
		}
	}
	return cmds
}

func pageCommands(text, binary string) [][]string {
	var lines []string
	inSh := false
	var cont string
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(l, "```"):
			inSh = false
			continue
		}
		if !inSh {
			continue
		}
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.Index(l, "  #"); i >= 0 { // an aligned trailing comment
			l = strings.TrimSpace(l[:i])
		}
		if strings.HasSuffix(l, "\\") {
			cont += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		lines = append(lines, cont+l)
		cont = ""
	}
	for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
		if !strings.ContainsAny(m[1], "[|<") {
			lines = append(lines, m[1])
		}
	}
	var cmds [][]string
	for _, l := range lines {
		words, err := shlex.Split(l, true)
		if err != nil {
			continue
		}
		for _, c := range splitCommands(words) {
			if len(c) >= 3 && c[0] == "go" && c[1] == "run" {
				c = c[2:]
			}
			if len(c) > 0 && c[0] == "claude" { // claude mcp add NAME -- COMMAND…
				for i, w := range c {
					if w == "--" {
						c = c[i+1:]
						break
					}
				}
			}
			if len(c) > 0 && path.Base(c[0]) == binary {
				cmds = append(cmds, c[1:])
			}
		}
	}
	return cmds
}

func splitCommands(words []string) [][]string {
	var cmds [][]string
	var cur []string
	for _, w := range words {
		if shellOps[w] {
			cmds, cur = append(cmds, cur), nil
			continue
		}
		cur = append(cur, strings.TrimSuffix(w, ";"))
	}
	return append(cmds, cur)
}

// CommandProblems runs every invocation of binary the pages show through run — the binary's
// in-process entry, returning its exit status and stderr — with -h appended, so parsing stops
// at help and nothing runs: a command a page shows must exist and every flag it shows must be
// defined. Placeholder ids (ID, ex_…) become well-formed ones, since an id is checked before
// -h is reached. It returns how many invocations it checked and what did not parse.
func CommandProblems(pages []Page, binary string, run func(args []string) (code int, stderr string)) (checked int, problems []string) {
	for _, c := range Commands(pages, binary) {
		if len(c.Args) == 0 { // the binary named in prose
			continue
		}
		try := make([]string, 0, len(c.Args)+1)
		for _, a := range c.Args {
			if a == "ID" || strings.HasPrefix(a, "ex_…") {
				a = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW"
			}
			try = append(try, a)
		}
		if len(try) != 1 || try[0] != "--version" { // --version is whole as it is
			try = append(try, "-h")
		}
		checked++
		if code, stderr := run(try); code == 2 || strings.Contains(stderr, "not defined") {
			problems = append(problems, fmt.Sprintf("%s shows `%s %s`, which does not parse (exit %d):\n%s",
				c.Page, binary, strings.Join(c.Args, " "), code, stderr))
		}
	}
	return checked, problems
}

// CheckDocCommands fails t for every invocation of binary in README.md and docs/*.md that
// does not parse (CommandProblems), and when the pages show fewer than min of them — a
// threshold that keeps the check from passing on pages it no longer finds commands in.
func CheckDocCommands(t *testing.T, binary string, min int, run func(args []string) (code int, stderr string)) {
	t.Helper()
	_, pages := DocPages(t)
	checked, problems := CommandProblems(pages, binary, run)
	for _, p := range problems {
		t.Error(p)
	}
	if checked < min {
		t.Fatalf("found only %d %s commands in README.md and docs/ (want at least %d): %q", checked, binary, min, Commands(pages, binary))
	}
}

// repoPath is what a path into this repository looks like on a page.
var repoPath = regexp.MustCompile(`^(\./)?((bastion|hostagent|markers|plugins|cmd|integration|internal|scripts|packaging|tools|docs|\.ci)(/[A-Za-z0-9_.\-]+)*/?|[A-Za-z0-9_\-]+\.md)$`)

// PathRef is a repository path a page names.
type PathRef struct {
	Page string
	Path string // as written: relative to the module root (code spans) or to the page (a bare name.md)
}

// Paths returns the paths into the repository the pages name in code spans and commands
// (bastion/match.go, scripts/test, docs/design.md…), and the bare .md names of their prose.
func Paths(pages []Page) []PathRef {
	var refs []PathRef
	for _, p := range pages {
		seen := map[string]bool{}
		add := func(w string) {
			if !seen[w] {
				seen[w] = true
				refs = append(refs, PathRef{Page: p.Path, Path: w})
			}
		}
		for _, m := range codeSpan.FindAllStringSubmatch(p.Text, -1) {
			for _, w := range strings.Fields(m[1]) {
				if repoPath.MatchString(w) {
					add(w)
				}
			}
		}
		for _, l := range strings.Split(p.Text, "\n") {
			for _, w := range strings.Fields(l) {
				if w = strings.Trim(w, "()`,.:;"); strings.HasSuffix(w, ".md") && repoPath.MatchString(w) {
					add(w)
				}
			}
		}
	}
	return refs
}

// MissingPaths reports every path of Paths(pages) that is not in the repository at root. A
// path names a file from the module root; a bare name.md may also name one next to its page.
func MissingPaths(root string, pages []Page) []string {
	var problems []string
	for _, r := range Paths(pages) {
		p := strings.TrimPrefix(r.Path, "./")
		candidates := []string{filepath.Join(root, p)}
		if !strings.Contains(p, "/") {
			candidates = append(candidates, filepath.Join(root, filepath.Dir(r.Page), p))
		}
		found := false
		for _, c := range candidates {
			if _, err := os.Stat(c); err == nil {
				found = true
				break
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s names %s, which is not in the repository", r.Page, r.Path))
		}
	}
	return problems
}

// mdLink is an inline markdown link or image: [text](target) or [text](target "title").
var mdLink = regexp.MustCompile(`\[[^\]\n]*\]\(([^)\s]+)(?:\s+"[^"\n]*")?\)`)

// Link is one relative link a page makes.
type Link struct {
	Page   string
	Target string // as written: a path relative to the page, with an optional #anchor
}

// Links returns the relative links of the pages (not http:, https: or mailto:), outside
// fenced code blocks and code spans.
func Links(pages []Page) []Link {
	var links []Link
	for _, p := range pages {
		for _, l := range proseLines(p.Text) {
			l = codeSpan.ReplaceAllString(l, "")
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links = append(links, Link{Page: p.Path, Target: target})
			}
		}
	}
	return links
}

// BrokenLinks reports every relative link of the pages whose file is not in the repository
// at root, or whose #anchor is not a heading of the markdown page it points to.
func BrokenLinks(root string, pages []Page) []string {
	byPath := map[string]Page{}
	for _, p := range pages {
		byPath[p.Path] = p
	}
	var problems []string
	for _, l := range Links(pages) {
		file, anchor, _ := strings.Cut(l.Target, "#")
		target := l.Page
		if file != "" {
			target = path.Join(path.Dir(l.Page), file)
		}
		if strings.HasPrefix(target, "../") || path.IsAbs(target) {
			problems = append(problems, fmt.Sprintf("%s links to %s, outside the repository", l.Page, l.Target))
			continue
		}
		page, ok := byPath[target]
		if !ok {
			b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(target)))
			if err != nil {
				if _, serr := os.Stat(filepath.Join(root, filepath.FromSlash(target))); serr != nil {
					problems = append(problems, fmt.Sprintf("%s links to %s, which is not in the repository", l.Page, l.Target))
					continue
				}
			}
			page = Page{Path: target, Text: string(b)}
		}
		if anchor == "" {
			continue
		}
		if !strings.HasSuffix(target, ".md") {
			problems = append(problems, fmt.Sprintf("%s links to %s: an anchor into a file that is not markdown", l.Page, l.Target))
			continue
		}
		if !slices.Contains(Anchors(page.Text), anchor) {
			problems = append(problems, fmt.Sprintf("%s links to %s, but %s has no heading with anchor #%s", l.Page, l.Target, target, anchor))
		}
	}
	return problems
}

// proseLines are the lines of a markdown text outside fenced code blocks.
func proseLines(text string) []string {
	var out []string
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, l)
		}
	}
	return out
}

var heading = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*#*\s*$`)

// Anchors returns the anchors GitHub makes for the headings of a markdown text: lower case,
// punctuation and symbols dropped (letters, digits, spaces, '-' and '_' kept), spaces as '-',
// and a repeated anchor numbered (-1, -2, …).
func Anchors(text string) []string {
	var anchors []string
	count := map[string]int{}
	for _, l := range proseLines(text) {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := count[a]; n > 0 {
			anchors = append(anchors, fmt.Sprintf("%s-%d", a, n))
		} else {
			anchors = append(anchors, a)
		}
		count[a]++
	}
	return anchors
}
