package policy

import (
	"path"
	"slices"
	"strconv"
	"strings"
)

// Layer is one command an argv would run: the argv as written (depth 0), or what a wrapper
// it names runs (sudo rm → rm at depth 1). Some words may be known only at run time: find's
// {} and xargs -I's replacement (Unknown), and the words xargs reads from its input or find
// -exec … {} + appends (Open).
type Layer struct {
	Argv []string `json:"argv"`
	// Unknown are the indexes into Argv of words whose value is only known at run time.
	Unknown []int `json:"unknown,omitempty"`
	// Open: zero or more words only known at run time follow Argv.
	Open bool `json:"open,omitempty"`
	// Via is the wrapper (and how) that runs this layer: "sudo", "sh -c", "find -exec"; ""
	// for a command as written.
	Via string `json:"via,omitempty"`
	// Depth is 0 for a command as written and n for one run through n wrappers.
	Depth int `json:"depth"`
}

func (l Layer) unknown(i int) bool { return slices.Contains(l.Unknown, i) }

// String shows the layer as a shell would read it: words quoted where needed, a word known
// only at run time as ‹?›, and "…" for open trailing words.
func (l Layer) String() string {
	words := make([]string, 0, len(l.Argv)+1)
	for i, w := range l.Argv {
		if l.unknown(i) {
			w = "‹" + w + "›"
		} else {
			w = displayWord(w)
		}
		words = append(words, w)
	}
	if l.Open {
		words = append(words, "…")
	}
	return strings.Join(words, " ")
}

func displayWord(w string) string {
	if w != "" && strings.Trim(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:,=@%+-") == "" {
		return w
	}
	if strconv.CanBackquote(w) && !strings.ContainsRune(w, '\'') {
		return "'" + w + "'"
	}
	return strconv.Quote(w)
}

// sub is the layer a wrapper at l runs: l's words from i on.
func (l Layer) sub(i int, via string) Layer {
	inner := Layer{Argv: l.Argv[i:], Open: l.Open, Via: via, Depth: l.Depth + 1}
	for _, u := range l.Unknown {
		if u >= i {
			inner.Unknown = append(inner.Unknown, u-i)
		}
	}
	return inner
}

// Bounds on unwrapping: deeper or wider than this is never certain.
const (
	maxUnwrapDepth  = 16
	maxUnwrapLayers = 256
)

// Unwrap returns every command argv would run: argv itself, and, when its command is a
// wrapper this package knows (wrappers), the command that wrapper runs, unwrapped in turn
// (sudo env FOO=1 sh -c 'nice rm x' → five layers). certain is false when what runs cannot
// be known from the argv: an option or form of a wrapper it does not understand, one that
// runs a shell reading its input, an environment assignment a shell or the loader acts on,
// a word only known at run time where the wrapper parses its options or finds its command,
// a command name that is not plain ASCII, starts with '-' or names a builtin that
// reinterprets its arguments (env command rm), or more than 16 levels or 256 layers. When certain is false the layers are partial. Pure.
func Unwrap(argv []string) (layers []Layer, certain bool) {
	u := unwrapper{certain: true}
	u.add(Layer{Argv: argv})
	return u.layers, u.certain
}

type unwrapper struct {
	layers  []Layer
	certain bool
}

func (u *unwrapper) add(l Layer) {
	if len(u.layers) >= maxUnwrapLayers || l.Depth > maxUnwrapDepth || len(l.Argv) == 0 {
		u.certain = false
		return
	}
	u.layers = append(u.layers, l)
	name := path.Base(l.Argv[0])
	// A wrapper may run a program named like a builtin that reinterprets its arguments
	// (some systems ship /usr/bin/command): as unsure as the builtin itself.
	if l.unknown(0) || !plainCommandName(l.Argv[0]) || strings.HasPrefix(l.Argv[0], "-") || reinterpreting[name] {
		u.certain = false
		return
	}
	unwrap, ok := wrappers[name]
	if !ok {
		return
	}
	inner, certain := unwrap(l)
	if !certain {
		u.certain = false
	}
	for _, in := range inner {
		u.add(in)
	}
}

// wrappers are the commands known to run another command, by base name. Each returns the
// layers the wrapper at l runs (none: it runs no command) and whether that is certain.
var wrappers = map[string]func(l Layer) ([]Layer, bool){
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
	"time":   optionWrapper{short: "af:o:pqvV", long: longOpts("append", "format=", "output=", "portability", "quiet", "verbose", "help", "version")}.unwrap("time"),
	"chroot": optionWrapper{
		long:     longOpts("groups=", "userspec=", "skip-chdir", "help", "version"),
		operands: 1, // NEWROOT
		// Without a command chroot runs an interactive shell, which reads its input.
		commandRequired: true,
	}.unwrap("chroot"),
	"setsid":  optionWrapper{short: "cfw", long: longOpts("ctty", "fork", "wait", "help", "version")}.unwrap("setsid"),
	"pkexec":  optionWrapper{long: longOpts("user=", "disable-internal-agent", "keep-cwd", "help", "version")}.unwrap("pkexec"),
	"xargs":   unwrapXargs,
	"find":    unwrapFind,
	"busybox": unwrapBusybox,
	"sh":      unwrapShell,
	"bash":    unwrapShell,
	"dash":    unwrapShell,
	"zsh":     unwrapShell,
	"ash":     unwrapShell,
	"ksh":     unwrapShell,
	"mksh":    unwrapShell,
}

// WrapperNames lists the wrappers Unwrap sees through, sorted.
func WrapperNames() []string {
	names := make([]string, 0, len(wrappers))
	for n := range wrappers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

type argKind int

const (
	noArg       argKind = iota
	requiredArg         // --name=VALUE or --name VALUE
	optionalArg         // --name or --name=VALUE
)

// longOpts builds a long-option table: "name=" takes an argument, "name?" an optional one.
func longOpts(specs ...string) map[string]argKind {
	m := make(map[string]argKind, len(specs))
	for _, s := range specs {
		switch {
		case strings.HasSuffix(s, "="):
			m[strings.TrimSuffix(s, "=")] = requiredArg
		case strings.HasSuffix(s, "?"):
			m[strings.TrimSuffix(s, "?")] = optionalArg
		default:
			m[s] = noArg
		}
	}
	return m
}

type option struct{ name, value string }

// getopt parses options from l.Argv[i:] as GNU getopt_long does with a leading '+' (the
// wrappers above all stop at their first operand): short options from optstring ("u:"
// takes an argument, attached or the next word; "h::" one only attached), clusters (-nu
// root), long options by unique prefix, "--" ending options. It returns the options and the
// index of the first operand; ok is false for an option it does not know, a missing
// argument, or a word known only at run time where an option could be.
func getopt(l Layer, i int, optstring string, long map[string]argKind) (opts []option, next int, ok bool) {
	for i < len(l.Argv) {
		if l.unknown(i) {
			return nil, 0, false
		}
		w := l.Argv[i]
		switch {
		case w == "--":
			return opts, i + 1, true
		case len(w) < 2 || w[0] != '-':
			return opts, i, true
		case w[1] == '-':
			name, value, hasValue := strings.Cut(w[2:], "=")
			full, kind, found := lookupLong(long, name)
			if !found || (kind == noArg && hasValue) {
				return nil, 0, false
			}
			if kind == requiredArg && !hasValue {
				i++
				if i >= len(l.Argv) {
					return nil, 0, false
				}
				value = l.Argv[i]
			}
			opts = append(opts, option{full, value})
		default:
			for j := 1; j < len(w); j++ {
				c := w[j]
				at := strings.IndexByte(optstring, c)
				if at < 0 || c == ':' {
					return nil, 0, false
				}
				kind := noArg
				if at+1 < len(optstring) && optstring[at+1] == ':' {
					kind = requiredArg
					if at+2 < len(optstring) && optstring[at+2] == ':' {
						kind = optionalArg
					}
				}
				if kind == noArg {
					opts = append(opts, option{name: string(c)})
					continue
				}
				value := w[j+1:]
				if kind == requiredArg && value == "" {
					i++
					if i >= len(l.Argv) {
						return nil, 0, false
					}
					value = l.Argv[i]
				}
				opts = append(opts, option{string(c), value})
				break
			}
		}
		i++
	}
	return opts, i, true
}

// lookupLong finds a long option by its name or a unique prefix of it.
func lookupLong(long map[string]argKind, name string) (string, argKind, bool) {
	if kind, ok := long[name]; ok {
		return name, kind, true
	}
	found, kind, n := "", noArg, 0
	for full, k := range long {
		if name != "" && strings.HasPrefix(full, name) {
			found, kind, n = full, k, n+1
		}
	}
	return found, kind, n == 1
}

// optionWrapper is a wrapper of the form NAME [OPTIONS] [NAME=VALUE...] [OPERANDS] COMMAND...
type optionWrapper struct {
	short           string
	long            map[string]argKind
	unsure          []string // options after which what runs is not known from the argv
	assignments     bool     // NAME=VALUE words may precede the command (env, sudo)
	dashOption      bool     // a lone "-" is an option (env), not the command
	legacyNice      bool     // nice -10, nice --10: an adjustment before the options
	operands        int      // words between the options and the command (timeout DURATION)
	commandRequired bool     // without a command the wrapper runs one the argv does not show
}

func (w optionWrapper) unwrap(name string) func(Layer) ([]Layer, bool) {
	return func(l Layer) ([]Layer, bool) {
		i := 1
		if w.legacyNice {
			for i < len(l.Argv) && !l.unknown(i) && legacyAdjustment(l.Argv[i]) {
				i++
			}
		}
		if w.dashOption && i < len(l.Argv) && !l.unknown(i) && l.Argv[i] == "-" {
			i++
		}
		opts, i, ok := getopt(l, i, w.short, w.long)
		if !ok {
			return nil, false
		}
		for _, o := range opts {
			if slices.Contains(w.unsure, o.name) {
				return nil, false
			}
		}
		if w.assignments {
			for i < len(l.Argv) && !l.unknown(i) && strings.Contains(l.Argv[i], "=") {
				if !harmlessAssignment(l.Argv[i]) {
					return nil, false
				}
				i++
			}
		}
		i += w.operands
		switch {
		case i < len(l.Argv):
			return []Layer{l.sub(i, name)}, true
		case l.Open:
			return nil, false // the command would come from the words only known at run time
		default:
			return nil, !w.commandRequired
		}
	}
}

// legacyAdjustment reports whether w is nice's old-style adjustment: -N, --N, -+N.
func legacyAdjustment(w string) bool {
	rest, ok := strings.CutPrefix(w, "-")
	if !ok {
		return false
	}
	if len(rest) > 0 && (rest[0] == '-' || rest[0] == '+') {
		rest = rest[1:]
	}
	return rest != "" && allDigits(rest)
}

// riskyVariables are environment variables a shell, the dynamic loader or a common program
// reads to find or run other code; an assignment to one through a wrapper makes what runs
// uncertain (env PS4='$(rm x)' SHELLOPTS=xtrace bash -c ls runs rm).
var riskyVariables = map[string]bool{
	"PATH": true, "BASH_ENV": true, "ENV": true, "SHELLOPTS": true, "BASHOPTS": true, "PS4": true,
	"IFS": true, "HOME": true, "ZDOTDIR": true, "CDPATH": true, "GLOBIGNORE": true, "PROMPT_COMMAND": true,
	"GCONV_PATH": true, "LOCPATH": true, "NLSPATH": true, "HOSTALIASES": true, "PAGER": true, "MANPAGER": true,
	"EDITOR": true, "VISUAL": true, "SUDO_EDITOR": true, "SUDO_ASKPASS": true, "SSH_ASKPASS": true,
	"GIT_SSH_COMMAND": true, "GIT_PAGER": true, "GIT_EDITOR": true, "LESSOPEN": true, "LESSCLOSE": true,
	"PERL5OPT": true, "PERL5LIB": true, "PYTHONPATH": true, "PYTHONSTARTUP": true, "PYTHONHOME": true,
	"RUBYOPT": true, "RUBYLIB": true, "NODE_OPTIONS": true, "BROWSER": true,
}

var riskyPrefixes = []string{"LD_", "DYLD_", "BASH_FUNC_"}

// harmlessAssignment reports whether NAME=VALUE names a plain variable that changes no code
// that runs.
func harmlessAssignment(w string) bool {
	name, _, _ := strings.Cut(w, "=")
	if !identifier(name) || riskyVariables[name] {
		return false
	}
	for _, p := range riskyPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

func identifier(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}

// unwrapXargs: xargs [OPTIONS] [COMMAND [ARGS]] runs COMMAND (default echo) with words read
// from its input appended — or, with -I R / -i[R] / --replace[=R], in place of R.
func unwrapXargs(l Layer) ([]Layer, bool) {
	opts, i, ok := getopt(l, 1, "0a:d:E:e::I:i::L:l::n:oP:prs:tx", longOpts("null", "arg-file=", "delimiter=",
		"eof?", "replace?", "max-lines?", "max-args=", "open-tty", "max-procs=", "interactive", "no-run-if-empty",
		"max-chars=", "verbose", "exit", "show-limits", "process-slot-var=", "help", "version"))
	if !ok {
		return nil, false
	}
	replace := ""
	for _, o := range opts {
		switch o.name {
		case "I", "i", "replace":
			replace = o.value
			if replace == "" {
				replace = "{}"
			}
		}
	}
	var inner Layer
	switch {
	case i < len(l.Argv):
		inner = l.sub(i, "xargs")
	case l.Open:
		return nil, false
	default:
		inner = Layer{Argv: []string{"echo"}, Via: "xargs", Depth: l.Depth + 1}
	}
	inner.Open = true
	if replace != "" {
		for j, w := range inner.Argv {
			if strings.Contains(w, replace) && !inner.unknown(j) {
				inner.Unknown = append(inner.Unknown, j)
			}
		}
	}
	return []Layer{inner}, true
}

// unwrapFind: every -exec, -execdir, -ok and -okdir clause of a find expression runs its
// words up to ";" (each {} a file name) or up to "{} +" (file names appended). Every
// occurrence of those words starts a clause, even where find would read it as another
// test's argument (find . -name -exec ! -exec rm {} ;): seeing too many commands is safe.
func unwrapFind(l Layer) ([]Layer, bool) {
	if l.Open || len(l.Unknown) > 0 {
		return nil, false // run-time words could be -exec clauses
	}
	var inner []Layer
	for i := 1; i < len(l.Argv); i++ {
		switch l.Argv[i] {
		case "-exec", "-execdir", "-ok", "-okdir":
		default:
			continue
		}
		if len(inner) == maxUnwrapLayers {
			return nil, false // more clauses than layers: never certain, and the scan stays linear
		}
		via := "find " + l.Argv[i]
		end := -1
		open := false
		for k := i + 1; k < len(l.Argv); k++ {
			if l.Argv[k] == ";" {
				end = k
				break
			}
			if l.Argv[k] == "+" && k > i+1 && l.Argv[k-1] == "{}" {
				end, open = k-1, true
				break
			}
		}
		if end <= i+1 {
			return nil, false // no command or no terminator: find refuses it, but be sure
		}
		c := Layer{Argv: l.Argv[i+1 : end], Open: open, Via: via, Depth: l.Depth + 1}
		for j, w := range c.Argv {
			if strings.Contains(w, "{}") {
				c.Unknown = append(c.Unknown, j)
			}
		}
		inner = append(inner, c)
	}
	return inner, true
}

// unwrapBusybox: busybox APPLET ARGS runs APPLET.
func unwrapBusybox(l Layer) ([]Layer, bool) {
	switch {
	case len(l.Argv) < 2:
		return nil, !l.Open
	case l.unknown(1):
		return nil, false
	}
	switch l.Argv[1] {
	case "--list", "--list-full", "--help":
		return nil, true
	}
	if strings.HasPrefix(l.Argv[1], "-") {
		return nil, false
	}
	return []Layer{l.sub(1, "busybox")}, true
}

// shellFlags are the single-letter shell options that take no argument in every shell
// unwrapShell knows (bash's set flags, -l, -r); -o and -O take the next word.
const shellFlags = "abefhklmnprtuvxBCEHPT"

// shellLongOptions are the long options of bash (zsh and the others have none the
// unwrapper accepts) that take no argument; --rcfile and --init-file take one.
var shellLongOptions = longOpts("login", "norc", "noprofile", "posix", "restricted", "verbose", "noediting",
	"debugger", "dump-strings", "dump-po-strings", "help", "version", "pretty-print", "rcfile=", "init-file=")

// unwrapShell: sh -c STRING (and bash, dash, zsh, ash, ksh, mksh) runs STRING, parsed by
// ParseCommand and unwrapped in turn; it must be plain literal words. A shell without -c
// given a file runs that script (judged as the shell running a program, like ./script);
// one given neither reads commands from its input, which the argv does not show; so do
// interactive shells (-i, -s).
func unwrapShell(l Layer) ([]Layer, bool) {
	name := path.Base(l.Argv[0])
	script := false
	i := 1
options:
	for ; i < len(l.Argv); i++ {
		if l.unknown(i) {
			return nil, false
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
				return nil, false
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
			default: // -i, -s (read the input), and letters some shell gives an argument (ksh -R)
				return nil, false
			}
		}
	}
	switch {
	case i >= len(l.Argv):
		return nil, false // reads its input, or the string would be a run-time word
	case !script:
		return nil, true
	case l.unknown(i):
		return nil, false
	}
	argvs, safe := ParseCommand(l.Argv[i])
	if !safe || len(argvs) == 0 {
		return nil, false
	}
	inner := make([]Layer, 0, len(argvs))
	for _, argv := range argvs {
		inner = append(inner, Layer{Argv: argv, Via: name + " -c", Depth: l.Depth + 1})
	}
	return inner, true
}
