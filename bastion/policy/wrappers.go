package policy

import (
	"path"
	"regexp"
	"slices"
	"strings"
)

// A wrapper returns the layers the wrapper at l runs (none: it runs no command, or it
// added them itself) and why that is not certain, if it is not. at is l's index.
type unwrapFunc func(l Layer, u *unwrapper, at int) ([]Layer, *unsure)

// wrappers are the commands known to run another command, by base name. Assigned in init:
// the shell wrappers parse strings whose commands are unwrapped in turn.
var wrappers map[string]unwrapFunc

func init() {
	wrappers = map[string]unwrapFunc{
		"sudo": optionWrapper{
			short: "Aa:BbC:c:D:Eeg:Hh::iKklNnPp:R:r:SsT:t:U:u:Vv",
			long: longOpts("askpass", "auth-type=", "background", "bell", "close-from=", "login-class=", "chdir=",
				"preserve-env?", "edit", "group=", "set-home", "help", "host=", "login", "remove-timestamp",
				"reset-timestamp", "list", "no-update", "non-interactive", "preserve-groups", "prompt=", "chroot=",
				"role=", "stdin", "shell", "type=", "command-timeout=", "other-user=", "user=", "version", "validate"),
			// -i and -s hand the words to a shell (which expands $IFS and the like) or read
			// commands from the input; -e edits files with an editor from the environment.
			unsure:      []string{"i", "s", "e", "login", "shell", "edit"},
			assignments: true,
		}.unwrap("sudo"),
		"doas": optionWrapper{short: "a:C:Lnsu:", unsure: []string{"s"}}.unwrap("doas"),
		"env": optionWrapper{
			short: "0a:C:iP:S:u:v",
			long: longOpts("argv0=", "chdir=", "ignore-environment", "null", "split-string=", "unset=", "debug",
				"block-signal?", "default-signal?", "ignore-signal?", "list-signal-handling", "help", "version"),
			unsure:      []string{"S", "split-string"}, // -S splits a string into words its own way
			assignments: true,
			dashOption:  true, // "env - cmd" is env -i
		}.unwrap("env"),
		"nice":   optionWrapper{short: "n:", long: longOpts("adjustment=", "help", "version"), legacyNice: true}.unwrap("nice"),
		"ionice": optionWrapper{short: "c:n:p:P:tu:Vh", long: longOpts("class=", "classdata=", "pid=", "pgid=", "ignore", "uid=", "version", "help")}.unwrap("ionice"),
		"nohup":  optionWrapper{long: longOpts("help", "version")}.unwrap("nohup"),
		"timeout": optionWrapper{
			short:    "fk:ps:v",
			long:     longOpts("foreground", "kill-after=", "preserve-status", "signal=", "verbose", "help", "version"),
			operands: 1, // DURATION
		}.unwrap("timeout"),
		"stdbuf": optionWrapper{short: "e:i:o:", long: longOpts("error=", "input=", "output=", "help", "version")}.unwrap("stdbuf"),
		// The shell's time keyword runs builtins too: what it runs stays in the shell.
		"time": optionWrapper{short: "af:o:pqvV", long: longOpts("append", "format=", "output=", "portability", "quiet", "verbose", "help", "version"), keepsShell: true}.unwrap("time"),
		"chroot": optionWrapper{
			long:     longOpts("groups=", "userspec=", "skip-chdir", "help", "version"),
			operands: 1, // NEWROOT
			// Without a command chroot runs an interactive shell, which reads its input.
			commandRequired: true,
		}.unwrap("chroot"),
		"setsid": optionWrapper{short: "cfw", long: longOpts("ctty", "fork", "wait", "help", "version")}.unwrap("setsid"),
		"pkexec": optionWrapper{long: longOpts("user=", "disable-internal-agent", "keep-cwd", "help", "version")}.unwrap("pkexec"),
		// Shell builtins that run a command: command NAME (never a function), builtin NAME,
		// exec NAME (replacing the shell); zsh's precommand modifiers.
		"command":   unwrapCommand,
		"builtin":   unwrapBuiltin,
		"exec":      optionWrapper{short: "cla:"}.unwrap("exec"),
		"noglob":    optionWrapper{keepsShell: true}.unwrap("noglob"),
		"nocorrect": optionWrapper{keepsShell: true}.unwrap("nocorrect"),
		"repeat":    optionWrapper{operands: 1, keepsShell: true}.unwrap("repeat"), // zsh's repeat N COMMAND
		"xargs":     unwrapXargs,
		"find":      unwrapFind,
		"busybox":   unwrapBusybox,
		"sh":        unwrapShell,
		"bash":      unwrapShell,
		"dash":      unwrapShell,
		"zsh":       unwrapShell,
		"ash":       unwrapShell,
		"ksh":       unwrapShell,
		"mksh":      unwrapShell,
		"su":        unwrapSu,
		"runuser":   unwrapSu,
		"sg":        unwrapSg,
		"setpriv": optionWrapper{
			short: "dhV",
			long: longOpts("dump", "nnp", "no-new-privs", "inh-caps=", "ambient-caps=", "list-caps", "ruid=", "euid=",
				"rgid=", "egid=", "reuid=", "regid=", "clear-groups", "keep-groups", "init-groups", "groups=",
				"bounding-set=", "securebits=", "pdeathsig=", "ptracer=", "selinux-label=", "apparmor-profile=",
				"landlock-access=", "landlock-rule=", "landlock-support", "list-landlock-access", "list-landlock-rights=",
				"seccomp-filter=", "help", "reset-env", "version"),
			exits: []string{"d", "dump", "list-caps", "landlock-support", "list-landlock-access", "list-landlock-rights", "h", "help", "V", "version"},
		}.unwrap("setpriv"),
		"flock":       unwrapFlock,
		"systemd-run": unwrapSystemdRun,
		"script":      unwrapScript,
		"watch":       unwrapWatch,
		"parallel":    unwrapParallel,
		"nsenter": optionWrapper{
			short: "ahVt:m::u::i::n::N:p::C::U::T::S:G:r::w::W::ecFZ",
			long: longOpts("all", "help", "version", "target=", "mount?", "uts?", "ipc?", "net?", "net-socket=", "pid?",
				"user?", "cgroup?", "time?", "setuid=", "setgid=", "root?", "wd?", "wdns?", "env", "no-fork",
				"join-cgroup", "preserve-credentials", "keep-caps", "user-parent", "follow-context"),
			exits:           []string{"h", "help", "V", "version"},
			commandRequired: true, // without a program nsenter runs $SHELL, which reads its input
		}.unwrap("nsenter"),
		"unshare": optionWrapper{
			short: "fhVmuinpCTUrR:w:S:G:cl:",
			long: longOpts("help", "version", "mount?", "uts?", "ipc?", "net?", "pid?", "user?", "cgroup?", "time?",
				"fork", "kill-child?", "forward-signals", "mount-proc?", "mount-binfmt?", "map-user=", "map-users=",
				"map-group=", "map-groups=", "map-root-user", "map-current-user", "map-auto", "map-subids", "owner=",
				"propagation=", "setgroups=", "keep-caps", "setuid=", "setgid=", "root=", "wd=", "monotonic=",
				"boottime=", "load-interp=", "clear-env", "whitelist-env="),
			// An interpreter registered in the namespace runs every program it matches.
			unsure:          []string{"l", "load-interp", "mount-binfmt"},
			exits:           []string{"h", "help", "V", "version"},
			commandRequired: true, // without a program unshare runs $SHELL, which reads its input
		}.unwrap("unshare"),
		"chrt":    unwrapChrt,
		"taskset": unwrapTaskset,
		"cgexec":  optionWrapper{short: "g:sh", long: longOpts("sticky", "help"), exits: []string{"h", "help"}}.unwrap("cgexec"),
		"capsh":   unwrapCapsh,
	}
}

// WrapperNames lists the wrappers the policy sees through, sorted.
func WrapperNames() []string {
	names := make([]string, 0, len(wrappers))
	for n := range wrappers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// unwrapCommand: command [-p] NAME ARGS runs NAME (a builtin or a program, never a
// function); -v and -V only say what NAME is.
func unwrapCommand(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	opts, i, bad := getopt("command", l, 1, "pVv", nil)
	if bad != nil {
		return nil, bad
	}
	if _, ok := hasOption(opts, "v", "V"); ok {
		return nil, nil
	}
	return runsRest("command", l, i, l.shell)
}

// unwrapBuiltin: builtin NAME ARGS runs the shell builtin NAME.
func unwrapBuiltin(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	return runsRest("builtin", l, 1, true)
}

// runsRest is the layer of l's words from i on, when they are a command.
func runsRest(name string, l Layer, i int, shell bool) ([]Layer, *unsure) {
	if s, ok := l.spreadBefore(min(i, len(l.Argv))); ok {
		return nil, runTimeWord(name, l.Argv[s])
	}
	switch {
	case i < len(l.Argv):
		inner := l.sub(i, name)
		inner.shell = shell
		return []Layer{inner}, nil
	case l.Open:
		return nil, runTimeWord(name, "…")
	}
	return nil, nil
}

// unwrapXargs: xargs [OPTIONS] [COMMAND [ARGS]] runs COMMAND (default echo) with words read
// from its input appended — or, with -I R / -i[R] / --replace[=R], in place of R.
func unwrapXargs(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	opts, i, bad := getopt("xargs", l, 1, "0a:d:E:e::I:i::L:l::n:oP:prs:tx", longOpts("null", "arg-file=", "delimiter=",
		"eof?", "replace?", "max-lines?", "max-args=", "open-tty", "max-procs=", "interactive", "no-run-if-empty",
		"max-chars=", "verbose", "exit", "show-limits", "process-slot-var=", "help", "version"))
	if bad != nil {
		return nil, bad
	}
	replace := ""
	if o, ok := hasOption(opts, "I", "i", "replace"); ok {
		if o.at >= 0 && l.unknown(o.at) {
			return nil, runTimeWord("xargs", l.Argv[o.at])
		}
		replace = o.value
		if replace == "" {
			replace = "{}"
		}
	}
	var inner Layer
	switch {
	case i < len(l.Argv):
		inner = l.sub(i, "xargs")
	case l.Open:
		return nil, runTimeWord("xargs", "…")
	default:
		inner = Layer{Argv: []string{"echo"}, Via: "xargs", Depth: l.Depth + 1}
	}
	inner.Open = true
	if replace != "" {
		for j, w := range inner.Argv {
			if strings.Contains(w, replace) {
				inner.mark(j, false)
			}
		}
	}
	return []Layer{inner}, nil
}

// unwrapFind: every -exec, -execdir, -ok and -okdir clause of a find expression runs its
// words up to ";" (each {} a file name) or up to "{} +" (file names appended). Every
// occurrence of those words starts a clause, even where find would read it as another
// test's argument (find . -name -exec ! -exec rm {} ;): seeing too many commands is safe.
// A word known only at run time outside the clauses could itself be -exec: find is then
// uncertain when a terminator follows it.
func unwrapFind(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	if l.Open {
		return nil, runTimeWord("find", "…") // run-time words could be -exec clauses
	}
	var inner []Layer
	inClause := make([]bool, len(l.Argv))
	for i := 1; i < len(l.Argv); i++ {
		if l.unknown(i) {
			continue
		}
		switch l.Argv[i] {
		case "-exec", "-execdir", "-ok", "-okdir":
		default:
			continue
		}
		if len(inner) == maxUnwrapLayers {
			return nil, &unsure{"find", "find has more -exec clauses than the policy judges", "split the command"}
		}
		via := "find " + l.Argv[i]
		end := -1
		open := false
		for k := i + 1; k < len(l.Argv); k++ {
			if l.unknown(k) {
				continue
			}
			if l.Argv[k] == ";" {
				end = k
				break
			}
			if l.Argv[k] == "+" && k > i+1 && l.Argv[k-1] == "{}" && !l.unknown(k-1) {
				end, open = k-1, true
				break
			}
		}
		if end <= i+1 {
			return nil, &unsure{l.Argv[i], "find's " + l.Argv[i] + " has no command or no terminator (; or {} +)", "end the clause with \\; or {} +"}
		}
		c := l.slice(i+1, end, open, via)
		for j, w := range c.Argv {
			if strings.Contains(w, "{}") {
				c.mark(j, false)
			}
		}
		for k := i + 1; k <= end; k++ {
			inClause[k] = true
		}
		inner = append(inner, c)
	}
	for i := 1; i < len(l.Argv); i++ {
		switch {
		case !l.unknown(i):
		case l.spread(i):
			return nil, &unsure{l.Argv[i], "find: " + l.Argv[i] + " may become several words, -exec and a command among them", "quote it (\"$F\") so it stays one word"}
		case !inClause[i] && !startsLiteral(l.Argv[i]) && terminatorAfter(l, i):
			return nil, &unsure{l.Argv[i], "find: " + l.Argv[i] + " is only known when it runs and could be -exec, starting a command the words do not show",
				"start it with ./ or / (find ./\"$DIR\" …) so that it cannot be an option"}
		}
	}
	return inner, nil
}

// startsLiteral reports whether a word known only at run time, as written, begins with a
// literal character other than '-' (./"$DIR", "/srv/$X"): its value cannot be an option.
func startsLiteral(text string) bool {
	text = strings.TrimPrefix(text, `"`)
	return text != "" && strings.IndexByte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./", text[0]) >= 0
}

// terminatorAfter reports whether a word after i could end an -exec clause.
func terminatorAfter(l Layer, i int) bool {
	for k := i + 1; k < len(l.Argv); k++ {
		if l.unknown(k) || l.Argv[k] == ";" || l.Argv[k] == "+" {
			return true
		}
	}
	return false
}

// unwrapBusybox: busybox APPLET ARGS runs APPLET.
func unwrapBusybox(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	switch {
	case len(l.Argv) < 2:
		if l.Open {
			return nil, runTimeWord("busybox", "…")
		}
		return nil, nil
	case l.unknown(1):
		return nil, runTimeWord("busybox", l.Argv[1])
	}
	switch l.Argv[1] {
	case "--list", "--list-full", "--help":
		return nil, nil
	}
	if strings.HasPrefix(l.Argv[1], "-") {
		return nil, unknownOption("busybox", l.Argv[1])
	}
	return []Layer{l.sub(1, "busybox")}, nil
}

// shellFlags are the single-letter shell options that take no argument in every shell
// unwrapShell knows (bash's set flags, -l, -r); -o and -O take the next word.
const shellFlags = "abefhklmnprtuvxBCEHPT"

// shellLongOptions are the long options of bash (zsh and the others have none the
// unwrapper accepts) that take no argument; --rcfile and --init-file take one.
var shellLongOptions = longOpts("login", "norc", "noprofile", "posix", "restricted", "verbose", "noediting",
	"debugger", "dump-strings", "dump-po-strings", "help", "version", "pretty-print", "rcfile=", "init-file=")

// unwrapShell: sh -c STRING (and bash, dash, zsh, ash, ksh, mksh) runs STRING, parsed as a
// script whose commands are layers of the shell. A shell without -c given a file runs
// that script (judged as the shell running a program, like ./script); one given neither
// reads commands from its input, which the argv does not show; so do interactive shells
// (-i, -s).
func unwrapShell(l Layer, u *unwrapper, at int) ([]Layer, *unsure) {
	name := path.Base(l.Argv[0])
	script := false
	i := 1
options:
	for ; i < len(l.Argv); i++ {
		if l.unknown(i) && script {
			break // the string
		}
		if l.unknown(i) {
			return nil, runTimeWord(name, l.Argv[i])
		}
		w := l.Argv[i]
		switch {
		case w == "--" || w == "-":
			i++
			break options
		case len(w) < 2 || (w[0] != '-' && w[0] != '+'):
			break options
		case strings.HasPrefix(w, "--"):
			kind, known := shellLongOptions[w[2:]]
			if !known || name != "bash" {
				return nil, unknownOption(name, w)
			}
			if kind == requiredArg {
				i++
			}
			continue
		}
		for _, c := range w[1:] {
			switch {
			case c == 'c' && w[0] == '-':
				script = true
			case c == 'o' || c == 'O':
				i++ // the option's name
			case strings.ContainsRune(shellFlags, c):
			case c == 'i' || c == 's':
				return nil, &unsure{w, name + " " + w + " reads its commands from the input, which the policy does not see", "pass the commands as " + name + " -c 'STRING'"}
			default: // letters some shell gives an argument (ksh -R)
				return nil, unknownOption(name, w)
			}
		}
	}
	switch {
	case i >= len(l.Argv) && script:
		return nil, &unsure{name + " -c", name + " -c without a string", "give " + name + " -c the commands as a string"}
	case i >= len(l.Argv):
		return nil, &unsure{name, name + " without -c or a script file reads its commands from the input (… | " + name + "), which the policy does not see",
			"pass the commands as " + name + " -c 'STRING', with a literal string"}
	case !script:
		if l.spread(i) {
			return nil, runTimeWord(name, l.Argv[i])
		}
		return nil, nil
	case l.unknown(i):
		return nil, &unsure{l.Argv[i], name + " -c runs a string that is only known when it runs", "give " + name + " -c a literal string"}
	}
	u.p.script(l.Argv[i], scope{via: name + " -c", depth: l.Depth + 1, u: u, layer: at})
	return nil, nil
}

// unwrapSu: su [OPTIONS] [-] [USER [ARGS]] and runuser in the same form run USER's shell
// (-s SHELL, else the user's login shell: judged as sh), with -c COMMAND and ARGS; runuser
// -u USER [--] COMMAND runs COMMAND itself. Options may come anywhere before "--".
func unwrapSu(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	name := path.Base(l.Argv[0])
	short := "c:fg:G:lmpPTs:hVw:"
	long := longOpts("command=", "session-command=", "fast", "login", "preserve-environment", "pty", "no-pty", "shell=",
		"group=", "supp-group=", "whitelist-environment=", "help", "version")
	if name == "runuser" {
		short += "u:"
		long["user"] = requiredArg
	}
	opts, operands, _, bad := getoptPermute(name, l, 1, short, long)
	if bad != nil {
		return nil, bad
	}
	if _, ok := hasOption(opts, "h", "help", "V", "version"); ok {
		return nil, nil
	}
	for _, s := range operands {
		if l.spread(s) {
			return nil, runTimeWord(name, l.Argv[s])
		}
	}
	command, hasCommand := hasOption(opts, "c", "command", "session-command")
	shellOpt, hasShell := hasOption(opts, "s", "shell")
	_, fast := hasOption(opts, "f", "fast")
	_, login := hasOption(opts, "l", "login")
	if _, ok := hasOption(opts, "u", "user"); ok {
		if hasCommand || hasShell || fast || login {
			return nil, &unsure{"-u", "runuser -u excludes -c, -s, -f and -l", "use runuser -u USER -- COMMAND"}
		}
		if len(operands) == 0 {
			return nil, nil // runuser refuses: no command
		}
		return []Layer{l.pick(operands, name)}, nil
	}
	if len(operands) > 0 && l.Argv[operands[0]] == "-" {
		operands = operands[1:]
	}
	if len(operands) > 0 {
		operands = operands[1:] // the user
	}
	shell := Layer{Argv: []string{"sh"}, Via: name, Depth: l.Depth + 1}
	if hasShell {
		shell.Argv[0] = shellOpt.value
		if shellOpt.at >= 0 && l.unknown(shellOpt.at) {
			shell.Unknown = []int{0}
		}
	}
	if fast {
		shell.Argv = append(shell.Argv, "-f")
	}
	if hasCommand {
		shell.Via = name + " -c"
		shell.Argv = append(shell.Argv, "-c", command.value)
		if command.at >= 0 && l.unknown(command.at) {
			shell.Unknown = append(shell.Unknown, len(shell.Argv)-1)
		}
	}
	rest := l.pick(operands, "")
	for _, u := range rest.Unknown {
		shell.Unknown = append(shell.Unknown, u+len(shell.Argv))
	}
	shell.Argv = append(shell.Argv, rest.Argv...)
	return []Layer{shell}, nil
}

// unwrapSg: sg [-] GROUP [-c] COMMAND runs COMMAND with /bin/sh -c.
func unwrapSg(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	for i := range l.Argv {
		if l.spread(i) {
			return nil, runTimeWord("sg", l.Argv[i])
		}
	}
	i := 1
	if i < len(l.Argv) && !l.unknown(i) && (l.Argv[i] == "-" || l.Argv[i] == "-l") {
		i++
	}
	if i < len(l.Argv) && (l.unknown(i) || strings.HasPrefix(l.Argv[i], "-")) {
		return nil, runTimeWord("sg", l.Argv[i])
	}
	i++ // the group
	if i < len(l.Argv) && !l.unknown(i) && l.Argv[i] == "-c" {
		i++
	}
	switch {
	case l.Open:
		return nil, runTimeWord("sg", "…")
	case i >= len(l.Argv):
		return nil, readsInput("sg")
	case i+1 < len(l.Argv):
		return nil, &unsure{l.Argv[i+1], "sg runs one string with sh -c; the words after it are ignored by some versions and not by others", "quote the whole command as one string"}
	}
	return []Layer{l.shellString("sh", i, "sg")}, nil
}

// unwrapFlock: flock [OPTIONS] FILE COMMAND [ARGS], flock [OPTIONS] FILE -c STRING,
// flock [OPTIONS] -c STRING and flock --fd N COMMAND run COMMAND, or STRING with sh -c;
// flock [OPTIONS] FD runs nothing.
func unwrapFlock(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	long := longOpts("shared", "exclusive", "unlock", "nonblocking", "nb", "timeout=", "wait=", "conflict-exit-code=",
		"close", "no-fork", "verbose", "fcntl", "start=", "length=", "fd=", "help", "version")
	var opts []option
	commandOption := false
	i := 1
	for i < len(l.Argv) {
		if l.unknown(i) {
			return nil, runTimeWord("flock", l.Argv[i])
		}
		w := l.Argv[i]
		if w == "-c" || w == "--command" {
			commandOption = true
			i++
			continue
		}
		if w == "--" {
			i++
			break
		}
		if len(w) < 2 || w[0] != '-' {
			break
		}
		parsed, after, bad := parseOption("flock", l, i, "sexnoFuw:E:hV", long)
		if bad != nil {
			return nil, bad
		}
		opts = append(opts, parsed...)
		i = after
	}
	if _, ok := hasOption(opts, "h", "help", "V", "version"); ok {
		return nil, nil
	}
	if s, ok := l.spreadBefore(min(i+2, len(l.Argv))); ok {
		return nil, runTimeWord("flock", l.Argv[s])
	}
	_, fd := hasOption(opts, "fd")
	rest := len(l.Argv) - i
	switch {
	case l.Open:
		return nil, runTimeWord("flock", "…")
	case commandOption:
		if rest != 1 {
			return nil, &unsure{"-c", "flock -c takes exactly one command string", "quote the command as one string"}
		}
		return []Layer{l.shellString("sh", i, "flock -c")}, nil
	case fd:
		return runsRest("flock", l, i, false)
	case rest >= 2:
		if l.unknown(i + 1) {
			return nil, runTimeWord("flock", l.Argv[i+1])
		}
		if w := l.Argv[i+1]; w == "-c" || w == "--command" {
			if rest != 3 {
				return nil, &unsure{w, "flock " + w + " takes exactly one command string", "quote the command as one string"}
			}
			return []Layer{l.shellString("sh", i+2, "flock -c")}, nil
		}
		return []Layer{l.sub(i+1, "flock")}, nil
	}
	return nil, nil // a descriptor to lock, or an error: nothing runs
}

// unwrapSystemdRun: systemd-run [OPTIONS] COMMAND [ARGS] runs COMMAND as a transient unit
// (now, or when a timer, path or socket triggers it). Properties that run or reconfigure
// commands (Exec*=, Environment*=), --shell and unsafe --setenv assignments make it
// uncertain; systemd expands $VAR in the arguments, so a word holding '$' is known only at
// run time.
func unwrapSystemdRun(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	const name = "systemd-run"
	opts, i, bad := getopt(name, l, 1, "hrC:H:M:E:p:tPqGdSu:", longOpts("help", "version", "user", "system", "capsule=",
		"scope", "unit=", "description=", "slice=", "slice-inherit", "remain-after-exit", "expand-environment=",
		"send-sighup", "host=", "machine=", "service-type=", "wait", "uid=", "gid=", "nice=", "setenv=", "property=",
		"tty", "pty", "pipe", "quiet", "on-active=", "on-boot=", "on-startup=", "on-unit-active=", "on-unit-inactive=",
		"on-calendar=", "on-timezone-change", "on-clock-change", "timer-property=", "path-property=", "socket-property=",
		"no-block", "no-ask-password", "collect", "working-directory=", "same-dir", "shell", "job-mode=",
		"ignore-failure", "background=", "json="))
	if bad != nil {
		return nil, bad
	}
	for _, o := range opts {
		valueKnown := o.at < 0 || !l.unknown(o.at)
		switch o.name {
		case "h", "help", "version":
			return nil, nil
		case "S", "shell":
			return nil, readsInput(name + " --shell")
		case "E", "setenv":
			if !valueKnown || (strings.Contains(o.value, "=") && !harmlessAssignment(o.value)) {
				return nil, &unsure{o.value, name + " --setenv " + o.value + " may change which program runs or what it runs", "drop the assignment"}
			}
		case "p", "property", "timer-property", "path-property", "socket-property":
			property, _, _ := strings.Cut(o.value, "=")
			if !valueKnown || strings.HasPrefix(property, "Exec") || strings.HasPrefix(property, "Environment") || property == "PassEnvironment" {
				return nil, &unsure{o.value, name + " property " + o.value + " runs commands or changes their environment", "drop the property"}
			}
		}
	}
	if s, ok := l.spreadBefore(i); ok {
		return nil, runTimeWord(name, l.Argv[s])
	}
	if i >= len(l.Argv) {
		if l.Open {
			return nil, runTimeWord(name, "…")
		}
		return nil, nil
	}
	inner := l.sub(i, name)
	if strings.Contains(inner.Argv[0], "$") {
		return nil, &unsure{inner.Argv[0], name + " expands $VARIABLES: the program is only known when it runs", "name the program literally"}
	}
	for j, w := range inner.Argv {
		if strings.Contains(w, "$") {
			inner.mark(j, true)
		}
	}
	return []Layer{inner}, nil
}

// unwrapScript: script [OPTIONS] [FILE] -c COMMAND runs COMMAND with the shell's -c;
// without -c it runs an interactive shell, which reads its input. Versions differ on
// "script -- COMMAND" (a command, or the typescript file), so a "--" is uncertain.
func unwrapScript(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	opts, operands, dashdash, bad := getoptPermute("script", l, 1, "aB:c:eE:fI:O:o:qm:T:t::Vh", longOpts("append",
		"command=", "echo=", "return", "flush", "force", "log-in=", "log-out=", "log-io=", "log-timing=",
		"logging-format=", "output-limit=", "quiet", "timing?", "version", "help"))
	switch {
	case bad != nil:
		return nil, bad
	case dashdash:
		return nil, &unsure{"--", "script -- COMMAND runs COMMAND in some versions and names the typescript file in others", "use script -c 'COMMAND'"}
	case len(operands) > 1:
		return nil, &unsure{l.Argv[operands[1]], "script takes one file; a second word is an error in some versions and a command in others", "use script -c 'COMMAND' [FILE]"}
	}
	if _, ok := hasOption(opts, "V", "version", "h", "help"); ok {
		return nil, nil
	}
	command, ok := hasOption(opts, "c", "command")
	if !ok {
		return nil, readsInput("script")
	}
	inner := Layer{Argv: []string{"sh", "-c", command.value}, Via: "script -c", Depth: l.Depth + 1}
	if command.at >= 0 && l.unknown(command.at) {
		inner.Unknown = []int{2}
	}
	return []Layer{inner}, nil
}

// unwrapWatch: watch [OPTIONS] COMMAND... runs the words joined with spaces by sh -c, or,
// with -x, the words themselves.
func unwrapWatch(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	opts, i, bad := getopt("watch", l, 1, "bCcefd::ghq:n:prs:twvx", longOpts("color", "no-color", "differences?", "help",
		"interval=", "beep", "errexit", "follow", "chgexit", "equexit=", "exec", "precise", "no-rerun", "shotsdir=",
		"no-title", "no-wrap", "version"))
	if bad != nil {
		return nil, bad
	}
	if _, ok := hasOption(opts, "h", "help", "v", "version"); ok {
		return nil, nil
	}
	if _, ok := hasOption(opts, "x", "exec"); ok {
		return runsRest("watch", l, i, false)
	}
	if l.Open {
		return nil, runTimeWord("watch", "…")
	}
	if i >= len(l.Argv) {
		return nil, nil
	}
	for j := i; j < len(l.Argv); j++ {
		if l.unknown(j) {
			return nil, &unsure{l.Argv[j], "watch joins its words into one string for sh -c, and " + l.Argv[j] + " is only known when it runs: it could be any shell code",
				"write the command literally, or use watch -x"}
		}
	}
	return []Layer{{Argv: []string{"sh", "-c", strings.Join(l.Argv[i:], " ")}, Via: "watch", Depth: l.Depth + 1}}, nil
}

// unwrapChrt: chrt [OPTIONS] [PRIORITY] COMMAND [ARGS] runs COMMAND; with -p (a process),
// -m or --help it runs nothing.
func unwrapChrt(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	opts, i, bad := getopt("chrt", l, 1, "abdD:efiphmoOP:T:rRU:X:GvV", longOpts("all-tasks", "batch", "clamp-min=",
		"clamp-max=", "deadline", "deadline-overrun", "ext", "fifo", "idle", "pid", "help", "max", "other", "rr",
		"sched-runtime=", "sched-period=", "sched-deadline=", "reset-on-fork", "reclaim-grub", "verbose", "version"))
	if bad != nil {
		return nil, bad
	}
	if _, ok := hasOption(opts, "p", "pid", "m", "max", "h", "help", "V", "version"); ok {
		return nil, nil
	}
	if len(l.Argv)-i >= 2 {
		if l.unknown(i) {
			return nil, runTimeWord("chrt", l.Argv[i]) // a priority or the command
		}
		if allDigits(l.Argv[i]) {
			i++
		}
	}
	return runsRest("chrt", l, i, false)
}

// unwrapTaskset: taskset [OPTIONS] MASK COMMAND [ARGS] runs COMMAND; with -p it runs
// nothing.
func unwrapTaskset(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	opts, i, bad := getopt("taskset", l, 1, "apchV", longOpts("all-tasks", "pid", "cpu-list", "help", "version"))
	if bad != nil {
		return nil, bad
	}
	if _, ok := hasOption(opts, "p", "pid", "h", "help", "V", "version"); ok {
		return nil, nil
	}
	return runsRest("taskset", l, i+1, false) // after the mask
}

// capshOptions are capsh's options without a value; capshValues those of the form
// --name=VALUE. capsh matches them exactly, in order.
var (
	capshOptions = []string{"--quiet", "--has-ambient", "--noamb", "--noenv", "--strict", "--modes", "--mode", "--print",
		"--no-new-privs", "--has-no-new-privs", "--license", "--current"}
	capshValues = []string{"--drop=", "--dropped=", "--addamb=", "--delamb=", "--inh=", "--caps=", "--mode=", "--inmode=",
		"--keep=", "--chroot=", "--secbits=", "--forkfor=", "--killit=", "--uid=", "--cap-uid=", "--gid=", "--groups=",
		"--user=", "--decode=", "--supports=", "--has-p=", "--has-i=", "--has-a=", "--has-b=", "--is-uid=", "--is-gid=",
		"--iab=", "--explain=", "--suggest=", "--shell="}
)

// unwrapCapsh: capsh [OPTIONS] -- ARGS runs the shell (/bin/bash, or --shell=) with ARGS;
// capsh [OPTIONS] == ARGS runs capsh again with ARGS; without them it runs nothing.
func unwrapCapsh(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
	shell := "/bin/bash"
	for i := 1; i < len(l.Argv); i++ {
		if l.unknown(i) {
			return nil, runTimeWord("capsh", l.Argv[i])
		}
		w := l.Argv[i]
		switch {
		case w == "--" || w == "-+":
			inner := l.sub(i, "capsh "+w)
			inner.Argv = append([]string{shell}, inner.Argv[1:]...)
			return []Layer{inner}, nil
		case w == "==" || w == "=+":
			inner := l.sub(i, "capsh "+w)
			inner.Argv = append([]string{"capsh"}, inner.Argv[1:]...)
			return []Layer{inner}, nil
		case strings.HasPrefix(w, "--shell="):
			shell = strings.TrimPrefix(w, "--shell=")
		case slices.Contains(capshOptions, w):
		case slices.ContainsFunc(capshValues, func(prefix string) bool { return strings.HasPrefix(w, prefix) }):
		default:
			return nil, unknownOption("capsh", w)
		}
	}
	if l.Open {
		return nil, runTimeWord("capsh", "…")
	}
	return nil, nil
}

// parallelReplacement matches GNU parallel's replacement strings: {} {.} {/} {//} {/.} {#}
// {%} and their numbered forms {1} {1.} …
var parallelReplacement = regexp.MustCompile(`\{[0-9]*(\.|/|//|/\.)?\}|\{#\}|\{%\}`)

// parallelArgument stands for an argument parallel puts into its command string, quoted as
// one word.
const parallelArgument = `"${PARALLEL_ARGUMENT}"`

// unwrapParallel: parallel [OPTIONS] COMMAND ::: ARGS (or :::: FILES, or arguments from the
// input) runs COMMAND once per argument: its words joined into a string for the shell,
// each replacement string ({}, {.}, …) replaced by the argument quoted as one word, or the
// argument appended. With -q the words are the command itself. A command string with
// quotes, a here-document, ${…} or {= … =} (Perl code) is uncertain: quoting an argument
// into it does not keep the argument one word.
func unwrapParallel(l Layer, u *unwrapper, at int) ([]Layer, *unsure) {
	const name = "parallel"
	if l.Open {
		return nil, runTimeWord(name, "…")
	}
	opts, i, bad := getopt(name, l, 1, "0kvqXmurj:n:N:P:I:C:d:a:", longOpts("null", "keep-order", "verbose", "quote",
		"xargs", "ungroup", "no-run-if-empty", "jobs=", "max-procs=", "max-args=", "colsep=", "delimiter=", "arg-file=",
		"will-cite", "group", "line-buffer", "lb", "tag", "dry-run", "bar", "progress", "eta", "halt=", "joblog=",
		"timeout=", "delay=", "retries=", "pipe", "block=", "shuf", "help", "version"))
	if bad != nil {
		return nil, bad
	}
	if _, ok := hasOption(opts, "help", "version"); ok {
		return nil, nil
	}
	replacement := parallelReplacement
	if o, ok := hasOption(opts, "I"); ok {
		if o.at >= 0 && l.unknown(o.at) {
			return nil, runTimeWord(name, l.Argv[o.at])
		}
		replacement = regexp.MustCompile(regexp.QuoteMeta(o.value) + "|" + parallelReplacement.String())
	}
	_, quote := hasOption(opts, "q", "quote")
	_, several := hasOption(opts, "X", "xargs", "m") // several arguments per replacement
	end := i
	for end < len(l.Argv) && (l.unknown(end) || !slices.Contains([]string{":::", "::::", ":::+", "::::+"}, l.Argv[end])) {
		end++
	}
	if end == i {
		return nil, &unsure{name, "parallel without a command runs its arguments or its input as commands", "give parallel the command to run"}
	}
	for j := i; j < end; j++ {
		switch {
		case l.spread(j):
			return nil, runTimeWord(name, l.Argv[j])
		case strings.Contains(l.Argv[j], "{="):
			return nil, &unsure{l.Argv[j], "parallel runs {= … =} as Perl code", "drop the {= … =} replacement"}
		}
	}
	if quote {
		inner := l.slice(i, end, false, name)
		found := false
		for j, w := range inner.Argv {
			if replacement.MatchString(w) {
				found = true
				inner.mark(j, several)
			}
		}
		inner.Open = !found
		return []Layer{inner}, nil
	}
	for j := i; j < end; j++ {
		if l.unknown(j) {
			return nil, &unsure{l.Argv[j], "parallel joins its command words into one string for the shell, and " + l.Argv[j] + " is only known when it runs: it could be any shell code",
				"write the command literally, or use parallel -q"}
		}
	}
	command := strings.Join(l.Argv[i:end], " ")
	if !replacement.MatchString(command) {
		command += " {}"
	}
	if strings.ContainsAny(command, "'\"\\`") || strings.Contains(command, "${") || strings.Contains(command, "<<") {
		return nil, &unsure{command, "parallel quotes each argument into the command string, and inside quotes, a here-document or ${…} the quoting breaks: an argument could become shell code",
			"use parallel -q, or write the command without quotes"}
	}
	argument := parallelArgument
	if several {
		argument = strings.Trim(argument, `"`)
	}
	first, firstUnknowable := len(u.p.s.Layers), len(u.p.s.Unknowable)
	u.p.script(replacement.ReplaceAllLiteralString(command, argument), scope{via: name, depth: l.Depth + 1, u: u, layer: at})
	for _, in := range u.p.s.Layers[first:] {
		for j, w := range in.Argv {
			in.Argv[j] = strings.ReplaceAll(w, argument, "{}")
		}
	}
	for j := firstUnknowable; j < len(u.p.s.Unknowable); j++ {
		u.p.s.Unknowable[j].Word = strings.ReplaceAll(u.p.s.Unknowable[j].Word, argument, "{}")
	}
	return nil, nil
}
