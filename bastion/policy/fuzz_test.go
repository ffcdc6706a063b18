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

// wrapperChain are ways to wrap an argv; each takes the argv and returns the wrapped one.
var wrapperChain = []func(argv []string) []string{
	prefixed("sudo"), prefixed("sudo", "-u", "root"), prefixed("sudo", "-nE", "--"), prefixed("sudo", "FOO=1"),
	prefixed("doas", "-u", "root"), prefixed("env"), prefixed("env", "FOO=1", "BAR=x y"), prefixed("env", "-i", "-u", "HOME"),
	prefixed("env", "--"), prefixed("nice"), prefixed("nice", "-n", "5"), prefixed("nice", "-10"),
	prefixed("ionice", "-c", "3"), prefixed("nohup"), prefixed("timeout", "5"), prefixed("timeout", "-k", "1", "-s", "KILL", "5"),
	prefixed("timeout", "--signal=TERM", "--", "5"), prefixed("stdbuf", "-oL"), prefixed("time"), prefixed("/usr/bin/time", "-p"),
	prefixed("chroot", "/"), prefixed("setsid", "-f"), prefixed("xargs"), prefixed("xargs", "-0", "-n", "1"),
	prefixed("busybox"), prefixed("pkexec"), prefixed("/usr/bin/sudo"),
	shellString("sh"), shellString("bash", "-e"), shellString("dash"), shellString("zsh"), shellString("/bin/sh"),
	func(argv []string) []string { return append(append([]string{"find", "/", "-exec"}, argv...), ";") },
	func(argv []string) []string {
		return append(append([]string{"find", ".", "-execdir"}, argv...), "{}", "+")
	},
}

func prefixed(words ...string) func([]string) []string {
	return func(argv []string) []string { return append(slices.Clone(words), argv...) }
}

func shellString(shell string, options ...string) func([]string) []string {
	return func(argv []string) []string {
		return append(append(append([]string{shell}, options...), "-c"), quoteLine(argv))
	}
}

func quoteLine(argv []string) string {
	words := make([]string, len(argv))
	for i, w := range argv {
		words[i] = shellQuote(w)
	}
	return strings.Join(words, " ")
}

// FuzzUnwrapDeny: any chain of known wrappers around a command is judged at least as
// strictly as the command alone — a denied command stays denied, and neither the class
// nor the outcome gets looser.
func FuzzUnwrapDeny(f *testing.F) {
	p, err := New([]Actor{{Name: "agent", TokenSHA256: strings.Repeat("ab", 32)}}, []Rule{
		{Class: ClassReadOnly, Commands: []string{"df **", "ls **", "echo **"}},
		{Class: ClassIdempotentWrite, Commands: []string{"systemctl restart *"}},
		{Class: ClassIrreversible, Commands: []string{"migrate **"}},
		{Decision: DecisionDeny, Commands: []string{"rm **", "shred **", "psql * -c DROP*"}},
		{Decision: DecisionApprove, Commands: []string{"pg_dump **"}},
	}, nil)
	if err != nil {
		f.Fatal(err)
	}
	inner := [][]string{
		{"rm", "-rf", "/x"}, {"/bin/rm", "x"}, {"shred", "-u", "/dev/sda"}, {"psql", "app", "-c", "DROP TABLE t"},
		{"df", "-h"}, {"systemctl", "restart", "nginx"}, {"migrate", "up"}, {"pg_dump", "app"}, {"ls"},
	}
	f.Add([]byte{0, 28}, uint8(0), "")
	f.Add([]byte{3, 7, 27, 11}, uint8(0), "-rf /srv")
	f.Add([]byte{22, 32}, uint8(4), "")
	f.Add([]byte{33, 30, 1}, uint8(3), "a;b '' {} +")
	f.Fuzz(func(t *testing.T, chain []byte, which uint8, args string) {
		if len(chain) > 8 {
			chain = chain[:8]
		}
		argv := slices.Clone(inner[int(which)%len(inner)])
		for _, w := range strings.Fields(args) {
			if len(argv) < 12 {
				argv = append(argv, w)
			}
		}
		alone := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: quoteLine(argv)})
		wrapped := argv
		for _, c := range chain {
			wrapped = wrapperChain[int(c)%len(wrapperChain)](wrapped)
		}
		command := quoteLine(wrapped)
		d := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: command})
		if alone.Outcome == Rejected && d.Outcome != Rejected {
			t.Fatalf("%q is %s (%s), but %q alone is rejected by %s\nsteps:\n  %s", command, d.Outcome, d.Rule, quoteLine(argv), alone.Rule, strings.Join(d.Steps, "\n  "))
		}
		if outcomeRank[d.Outcome] < outcomeRank[alone.Outcome] {
			t.Fatalf("%q is %s, looser than %q alone (%s)", command, d.Outcome, quoteLine(argv), alone.Outcome)
		}
		if p.rank(d.Class) < p.rank(alone.Class) {
			t.Fatalf("%q is %s, looser than %q alone (%s)", command, d.Class, quoteLine(argv), alone.Class)
		}
	})
}

// FuzzUnwrap: unwrapping any command line never panics, stays within its bounds, and a
// certain result names every command: each layer has a plain command name.
func FuzzUnwrap(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	for _, s := range []string{"sudo -u root env FOO=1 sh -c 'nice rm x'", "xargs -I % sh -c 'rm %'", "find . -exec {} +",
		"timeout -k 1 --sig=KILL 5 busybox sh -c \"sudo -- rm x\"", "env - -u X -- nice -5 ionice -c3 rm", "bash -o -c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, command string) {
		cmd := parseForPolicy(command)
		if len(cmd.layers) > maxUnwrapLayers*max(cmd.simple, 1) {
			t.Fatalf("%q: %d layers", command, len(cmd.layers))
		}
		for _, l := range cmd.layers {
			if l.Depth > maxUnwrapDepth {
				t.Fatalf("%q: layer %v deeper than %d", command, l, maxUnwrapDepth)
			}
			if cmd.safe && (len(l.Argv) == 0 || l.unknown(0) || !plainCommandName(l.Argv[0]) || strings.HasPrefix(l.Argv[0], "-")) {
				t.Fatalf("%q: certain, with layer %q", command, l)
			}
		}
	})
}
