package policy

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// shellQuote single-quotes s so that any byte sequence (without NUL) reads back literally;
// a word starting with rawWord is written as it is (a shell expansion).
func shellQuote(s string) string {
	if raw, ok := strings.CutPrefix(s, rawWord); ok {
		return raw
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// rawWord marks a word the fuzz tests put into a command line unquoted.
const rawWord = "\x00"

var parseSeeds = []string{
	"df -h", "df -h; rm -rf /", "'r'm -rf /", `r\m x`, `echo "a \$ b"`, "df $(id)", "df `id`",
	"a | b && c || d & e", "df 2>&1 >/dev/null", "find . -exec ls {} \\;", "[ -f x ]", "ｒｍ -rf /",
	"cat <<EOF\nx\nEOF", "(a)", "{ a; }", "f() { a; }", "x=1 a", "echo 'it'\\''s'", "df \\\n-h", "# only",
	"for f in *.log; do gzip \"$f\"; done", "date >> /tmp/f", "echo $((i+1))", "[[ $x -eq 1 ]]", "eval x",
	"sudo -u root env FOO=1 sh -c 'nice rm x'", "xargs -I % sh -c 'rm %'", "find . -exec {} +",
	"timeout -k 1 --sig=KILL 5 busybox sh -c \"sudo -- rm x\"", "env - -u X -- nice -5 ionice -c3 rm", "bash -o -c",
	"runuser -u app -- flock /tmp/l -c 'rm x'", "parallel 'rm {}' ::: a", "su - root -c \"watch -x rm x\"",
	"capsh -- -c 'systemd-run --wait rm x'", "declare -i x=1", "printf -v 'a[$(id)]' x", "${x@P}",
}

// FuzzParse: the parser never panics and stays within its bounds; a known script names
// every program plainly; and the simple commands of a known script whose words are all
// literal, quoted word by word and parsed again, are the same.
func FuzzParse(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, command string) {
		s := Parse(command)
		if len(s.Layers) > maxLayers || len(s.Unknowable) > maxUnknowable {
			t.Fatalf("%q: %d layers, %d unknowables", command, len(s.Layers), len(s.Unknowable))
		}
		plain := true
		var lines []string
		var top [][]string
		for _, l := range s.Layers {
			if l.Depth > maxUnwrapDepth+1 {
				t.Fatalf("%q: layer %v deeper than %d", command, l, maxUnwrapDepth)
			}
			if !s.Known() {
				continue
			}
			if len(l.Argv) == 0 || l.unknown(0) || !plainCommandName(l.Argv[0]) || strings.HasPrefix(l.Argv[0], "-") {
				t.Fatalf("%q: known, with layer %q", command, l)
			}
			if l.Depth > 0 {
				continue
			}
			if len(l.Unknown) > 0 || l.Open || slices.Contains([]string{"declare", "local", "export", "readonly", "typeset", "nameref", "let", "time"}, l.Argv[0]) {
				plain = false
				continue
			}
			words := make([]string, len(l.Argv))
			for i, w := range l.Argv {
				words[i] = shellQuote(w)
			}
			lines = append(lines, strings.Join(words, " "))
			top = append(top, l.Argv)
		}
		if !s.Known() || !plain || len(top) == 0 {
			return
		}
		requoted := strings.Join(lines, "\n")
		again := Parse(requoted)
		var againTop [][]string
		for _, l := range again.Layers {
			if l.Depth == 0 {
				againTop = append(againTop, l.Argv)
			}
		}
		if !again.Known() || !slices.EqualFunc(top, againTop, slices.Equal) {
			t.Fatalf("Parse(%q) = %q; requoted %q parses to %q (known %v)", command, top, requoted, againTop, again.Known())
		}
	})
}

var outcomeRank = map[Outcome]int{Authorized: 0, AwaitingApproval: 1, Rejected: 2}

// separators join a known prefix to anything; the result must never be judged looser.
var separators = []string{"; ", " && ", " || ", " | ", " & ", "\n", " $(", " `", " >", " <<", " #", " ${"}

func fuzzPolicy(f *testing.F) *Policy {
	p, err := New([]Actor{{Name: "agent", TokenSHA256: strings.Repeat("ab", 32)}}, []Rule{
		{Class: ClassReadOnly, Commands: []string{"df **", "ls **", "echo **"}},
		{Class: ClassIdempotentWrite, Commands: []string{"systemctl restart *"}},
		{Class: ClassIrreversible, Commands: []string{"migrate **"}},
		{Class: "batch", Commands: []string{"run-job *"}},
		{Class: ClassConditionalWrite, Writes: []string{"/etc/**"}},
		{Decision: DecisionDeny, Commands: []string{"rm **", "shutdown **", "shred **", "psql * -c DROP*"}},
		{Decision: DecisionDeny, Writes: []string{"/boot/**"}},
		{Decision: DecisionApprove, Commands: []string{"psql **", "pg_dump **"}},
	}, []string{"batch"})
	if err != nil {
		f.Fatal(err)
	}
	return p
}

// notLooser fails the test when d is looser than base: a looser outcome or class, or a
// rejection lost.
func notLooser(t *testing.T, p *Policy, d, base Decision, command, baseCommand string) {
	t.Helper()
	if outcomeRank[d.Outcome] < outcomeRank[base.Outcome] {
		t.Fatalf("%q is %s (%s), looser than %q (%s by %s)\nsteps:\n  %s", command, d.Outcome, d.Rule, baseCommand, base.Outcome, base.Rule, strings.Join(d.Steps, "\n  "))
	}
	if p.rank(d.Class) < p.rank(base.Class) {
		t.Fatalf("%q is %s, looser than %q (%s)\nsteps:\n  %s", command, d.Class, baseCommand, base.Class, strings.Join(d.Steps, "\n  "))
	}
}

// FuzzDecide: a command with anything appended after a separator never gets a looser
// class or a looser outcome than its known prefix alone.
func FuzzDecide(f *testing.F) {
	p := fuzzPolicy(f)
	for _, s := range parseSeeds {
		f.Add(s, uint8(0), "rm -rf /")
	}
	f.Add("systemctl restart x", uint8(1), "df -h")
	f.Add("migrate up", uint8(5), "ls")
	f.Add("df -h", uint8(8), "/etc/x")
	f.Add("ls", uint8(13), ".log")
	f.Fuzz(func(t *testing.T, prefix string, sep uint8, suffix string) {
		if s := Parse(prefix); !s.Known() || len(s.Layers) == 0 || strings.HasSuffix(prefix, `\`) {
			// A prefix that runs nothing has the default class, which a command appended may
			// loosen; a trailing backslash would join the separator to the prefix's last word.
			return
		}
		base := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: prefix})
		command := prefix + separators[int(sep)%len(separators)] + suffix
		d := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: command})
		notLooser(t, p, d, base, command, prefix)
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
	prefixed("command"), prefixed("exec"), prefixed("noglob"),
	prefixed("runuser", "-u", "app", "--"), // without --, runuser would take the command's options as its own
	stringAfter("su", "-c"), stringAfter("su", "-", "root", "-c"), stringAfter("runuser", "-l", "app", "-c"),
	prefixed("setpriv", "--nnp", "--reuid=1000"), prefixed("flock", "/tmp/lock"), prefixed("flock", "-n", "-w", "5", "/tmp/lock"),
	stringAfter("flock", "/tmp/lock", "-c"), prefixed("systemd-run", "--wait", "-p", "Nice=5"), prefixed("systemd-run", "--scope", "--"),
	func(argv []string) []string { return []string{"script", "-q", "-c", quoteLine(argv), "/dev/null"} },
	prefixed("watch", "-x"), stringAfter("watch", "-n", "5"),
	func(argv []string) []string { return append(append([]string{"parallel", "-q"}, argv...), ":::", "a") },
	prefixed("nsenter", "-t", "1", "-m", "-n"), prefixed("unshare", "-n", "-r", "--"), prefixed("chrt", "-f", "10"),
	prefixed("taskset", "-c", "0-3"), prefixed("cgexec", "-g", "cpu:batch"),
	stringAfter("capsh", "--drop=cap_net_raw", "--", "-c"), stringAfter("sg", "staff", "-c"),
}

func prefixed(words ...string) func([]string) []string {
	return func(argv []string) []string { return append(slices.Clone(words), argv...) }
}

func shellString(shell string, options ...string) func([]string) []string {
	return stringAfter(append(append([]string{shell}, options...), "-c")...)
}

// stringAfter wraps the argv as one shell string after the given words (sh -c STRING).
func stringAfter(words ...string) func([]string) []string {
	return func(argv []string) []string { return append(slices.Clone(words), quoteLine(argv)) }
}

func quoteLine(argv []string) string {
	words := make([]string, len(argv))
	for i, w := range argv {
		words[i] = shellQuote(w)
	}
	return strings.Join(words, " ")
}

var wrapInner = [][]string{
	{"rm", "-rf", "/x"}, {"/bin/rm", "x"}, {"shred", "-u", "/dev/sda"}, {"psql", "app", "-c", "DROP TABLE t"},
	{"df", "-h"}, {"systemctl", "restart", "nginx"}, {"migrate", "up"}, {"pg_dump", "app"}, {"ls"},
}

// wrap builds the inner argv (with extra words) and wraps it in the chain.
func wrap(chain []byte, which uint8, args string) (inner, wrapped []string) {
	inner = slices.Clone(wrapInner[int(which)%len(wrapInner)])
	for _, w := range strings.Fields(args) {
		if len(inner) < 12 {
			inner = append(inner, w)
		}
	}
	return inner, wrapWith(chain, inner)
}

// FuzzUnwrapDeny: any chain of known wrappers around a command is judged at least as
// strictly as the command alone — a denied command stays denied, and neither the class
// nor the outcome gets looser.
func FuzzUnwrapDeny(f *testing.F) {
	p := fuzzPolicy(f)
	f.Add([]byte{0, 28}, uint8(0), "")
	f.Add([]byte{3, 7, 27, 11}, uint8(0), "-rf /srv")
	f.Add([]byte{22, 32}, uint8(4), "")
	f.Add([]byte{33, 30, 1}, uint8(3), "a;b '' {} +")
	for i := range wrapperChain {
		f.Add([]byte{byte(i)}, uint8(0), "")
		f.Add([]byte{byte(i), 0}, uint8(3), "")
	}
	f.Fuzz(func(t *testing.T, chain []byte, which uint8, args string) {
		inner, wrapped := wrap(chain, which, args)
		alone := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: quoteLine(inner)})
		command := quoteLine(wrapped)
		d := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: command})
		if alone.Outcome == Rejected && d.Outcome != Rejected {
			t.Fatalf("%q is %s (%s), but %q alone is rejected by %s\nsteps:\n  %s", command, d.Outcome, d.Rule, quoteLine(inner), alone.Rule, strings.Join(d.Steps, "\n  "))
		}
		notLooser(t, p, d, alone, command, quoteLine(inner))
	})
}

// nonLiterals are expansions an argument may be written as.
var nonLiterals = []string{`"$X"`, `$X`, `*`, `*.log`, `"$(true)"`, `$(true)`, `~`, `{a,b}`, `"${X:-x}"`, `$'x'`, "`true`", `<(true)`, `"$@"`}

// FuzzNonLiteral: writing an argument as an expansion (a variable, a glob, a substitution)
// under any chain of wrappers never makes a decision looser than the literal argument.
func FuzzNonLiteral(f *testing.F) {
	p := fuzzPolicy(f)
	f.Add([]byte{}, uint8(0), "", uint8(1), uint8(0))
	f.Add([]byte{0}, uint8(3), "", uint8(1), uint8(1))
	f.Add([]byte{28}, uint8(4), "", uint8(1), uint8(2))
	f.Add([]byte{33}, uint8(5), "", uint8(2), uint8(4))
	f.Add([]byte{22}, uint8(7), "x", uint8(1), uint8(6))
	f.Fuzz(func(t *testing.T, chain []byte, which uint8, args string, at, form uint8) {
		if !utf8.ValidString(args) || strings.ContainsRune(args, 0) {
			return // a literal that is not UTF-8 or holds NUL makes the command unparsable, its expansion may not
		}
		inner, wrapped := wrap(chain, which, args)
		if len(inner) < 2 {
			return
		}
		i := 1 + int(at)%(len(inner)-1)
		expanded := slices.Clone(inner)
		expanded[i] = rawWord + nonLiterals[int(form)%len(nonLiterals)]
		expandedWrapped := wrapWith(chain, expanded)
		literal := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: quoteLine(wrapped)})
		command := quoteLine(expandedWrapped)
		d := p.Decide(Request{Actor: "agent", Tool: ToolSSHExec, Host: "h", Command: command})
		notLooser(t, p, d, literal, command, quoteLine(wrapped))
	})
}

func wrapWith(chain []byte, argv []string) []string {
	if len(chain) > 8 {
		chain = chain[:8]
	}
	for _, c := range chain {
		argv = wrapperChain[int(c)%len(wrapperChain)](argv)
	}
	return argv
}
