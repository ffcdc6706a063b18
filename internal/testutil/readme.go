package testutil

import (
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/anmitsu/go-shlex"
)

// README is the module's README.md (the product's front door, which its tests keep true).
func README(t testing.TB) (root, text string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("find module root: %v", err)
	}
	root = strings.TrimSpace(string(out))
	b, err := os.ReadFile(root + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	return root, string(b)
}

var (
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// Shell operators that end one command of a line.
	shellOps = map[string]bool{"&&": true, "||": true, ";": true, "|": true, "&": true}
)

// READMECommands returns the invocations of binary (its name, a path ending in it, or `go run
// ./cmd/NAME`) the README shows: in ```sh blocks, and in inline code spans that are a whole
// command with no placeholders for alternatives ([optional], a|b). Each is the argument list
// after the binary.
func READMECommands(t testing.TB, binary string) [][]string {
	t.Helper()
	_, text := README(t)
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

// repoPath is what a README path into this repository looks like.
var repoPath = regexp.MustCompile(`^(\./)?((bastion|hostagent|markers|plugins|cmd|integration|internal|scripts|packaging|tools|\.ci)(/[A-Za-z0-9_.\-]+)*/?|[A-Za-z0-9_\-]+\.md)$`)

// READMEPaths returns the paths into the repository the README names in code spans and
// commands (bastion/match.go, scripts/test, STYLE.md…).
func READMEPaths(t testing.TB) []string {
	t.Helper()
	_, text := README(t)
	seen := map[string]bool{}
	var paths []string
	for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
		for _, w := range strings.Fields(m[1]) {
			if repoPath.MatchString(w) && !seen[w] {
				seen[w] = true
				paths = append(paths, w)
			}
		}
	}
	for _, l := range strings.Split(text, "\n") {
		for _, w := range strings.Fields(l) {
			if w = strings.Trim(w, "()`,.:"); strings.HasSuffix(w, ".md") && repoPath.MatchString(w) && !seen[w] {
				seen[w] = true
				paths = append(paths, w)
			}
		}
	}
	return paths
}

// CheckREADMECommands runs every README invocation of binary through run — the binary's
// in-process entry, returning its exit status and stderr — with -h appended, so parsing
// stops at help and nothing runs: a command the README shows must exist and every flag it
// shows must be defined. Placeholder ids (ID, ex_…) become well-formed ones, since an id is
// checked before -h is reached.
func CheckREADMECommands(t *testing.T, binary string, run func(args []string) (code int, stderr string)) {
	t.Helper()
	cmds := READMECommands(t, binary)
	checked := 0
	for _, args := range cmds {
		if len(args) == 0 { // the binary named in prose
			continue
		}
		try := make([]string, 0, len(args)+1)
		for _, a := range args {
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
			t.Errorf("README shows `%s %s`, which does not parse (exit %d):\n%s", binary, strings.Join(args, " "), code, stderr)
		}
	}
	if checked < 3 {
		t.Fatalf("found only %d %s commands in the README: %q", checked, binary, cmds)
	}
}
