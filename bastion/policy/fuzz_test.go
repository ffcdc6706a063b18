package policy

import (
	"slices"
	"strings"
	"testing"
)

// shellQuote single-quotes s so that any byte sequence (without NUL) reads back literally.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var parseSeeds = []string{
	"df -h", "df -h; rm -rf /", "'r'm -rf /", `r\m x`, `echo "a \$ b"`, "df $(id)", "df `id`",
	"a | b && c || d & e", "df 2>&1 >/dev/null", "find . -exec ls {} \\;", "[ -f x ]", "ｒｍ -rf /",
	"cat <<EOF\nx\nEOF", "(a)", "{ a; }", "f() { a; }", "x=1 a", "echo 'it'\\''s'", "df \\\n-h", "# only",
}

// FuzzParseCommand: the parser never panics, and what it calls safe is exactly the argv
// a shell would run: quoting every word and parsing again gives the same argvs.
func FuzzParseCommand(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, command string) {
		argvs, safe := ParseCommand(command)
		if !safe {
			return
		}
		lines := make([]string, 0, len(argvs))
		for _, argv := range argvs {
			if len(argv) == 0 || !plainCommandName(argv[0]) {
				t.Fatalf("ParseCommand(%q): safe with command name %q", command, argv)
			}
			words := make([]string, len(argv))
			for i, w := range argv {
				words[i] = shellQuote(w)
			}
			lines = append(lines, strings.Join(words, " "))
		}
		requoted := strings.Join(lines, "\n")
		again, safeAgain := ParseCommand(requoted)
		if !safeAgain || !slices.EqualFunc(argvs, again, slices.Equal) {
			t.Fatalf("ParseCommand(%q) = %q; requoted %q parses to %q (safe %v)", command, argvs, requoted, again, safeAgain)
		}
	})
}

var outcomeRank = map[Outcome]int{Authorized: 0, AwaitingApproval: 1, Rejected: 2}

// separators join a safe prefix to anything; the result must never be judged looser.
var separators = []string{"; ", " && ", " || ", " | ", " & ", "\n", " $(", " `", " >", " <<", " #", " ${", "\\\n"}

// FuzzDecide: a command with anything appended after a separator never gets a looser
// class or a looser outcome than its safe prefix alone.
func FuzzDecide(f *testing.F) {
	p, err := New([]Actor{{Name: "agent", TokenSHA256: strings.Repeat("ab", 32)}}, []Rule{
		{Class: ClassReadOnly, Commands: []string{"df **", "ls **", "echo **"}},
		{Class: ClassIdempotentWrite, Commands: []string{"systemctl restart *"}},
		{Class: ClassIrreversible, Commands: []string{"migrate **"}},
		{Class: "batch", Commands: []string{"run-job *"}},
		{Decision: DecisionDeny, Commands: []string{"rm **", "shutdown **"}},
		{Decision: DecisionApprove, Commands: []string{"psql **"}},
	}, []string{"batch"})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range parseSeeds {
		f.Add(s, uint8(0), "rm -rf /")
	}
	f.Add("systemctl restart x", uint8(1), "df -h")
	f.Add("migrate up", uint8(5), "ls")
	f.Add("df -h", uint8(12), "rm -rf /")
	f.Fuzz(func(t *testing.T, prefix string, sep uint8, suffix string) {
		base := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: prefix})
		if !parseForPolicy(prefix).safe {
			return
		}
		command := prefix + separators[int(sep)%len(separators)] + suffix
		d := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: command})
		if p.rank(d.Class) < p.rank(base.Class) {
			t.Fatalf("%q is %s, looser than its prefix %q (%s)", command, d.Class, prefix, base.Class)
		}
		if outcomeRank[d.Outcome] < outcomeRank[base.Outcome] {
			t.Fatalf("%q is %s, looser than its prefix %q (%s by %s)", command, d.Outcome, prefix, base.Outcome, base.Rule)
		}
	})
}
