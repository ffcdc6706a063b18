package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// Bounds on unwrapping: deeper or wider than this is never certain.
const (
	maxUnwrapDepth  = 16
	maxUnwrapLayers = 256 // layers of one simple command as written, wrappers included
)

// unsure says why a wrapper's form leaves what runs uncertain.
type unsure struct{ word, reason, repair string }

// unwrapper adds the layers one simple command as written would run: itself and, when it
// names a wrapper this package knows (wrappers), the command that wrapper runs, unwrapped
// in turn (sudo env FOO=1 sh -c 'nice rm x' → five layers). What runs is unknowable when
// it cannot be known from the words: an option or form of a wrapper it does not
// understand, a shell reading its input, an environment assignment a shell or the loader
// acts on, a word only known at run time where the wrapper parses its options or finds its
// command, a command name that is not plain ASCII, starts with '-' or names a builtin that
// reinterprets its arguments (env eval …), or more than 16 levels or 256 layers.
type unwrapper struct {
	p *parser
	n int // layers added
}

// add adds l and what it runs, and returns l's index in the script's layers (-1 when the
// bounds stopped it).
func (u *unwrapper) add(l Layer) int {
	p := u.p
	if len(l.Argv) == 0 {
		return -1
	}
	if u.n >= maxUnwrapLayers || len(p.s.Layers) >= maxLayers || l.Depth > maxUnwrapDepth {
		p.unknowable(-1, l.Argv[0], "the command nests more than 16 wrappers or runs too many commands to judge", "send a plainer command")
		return -1
	}
	at := len(p.s.Layers)
	p.s.Layers = append(p.s.Layers, l)
	u.n++
	name := path.Base(l.Argv[0])
	switch {
	case l.unknown(0):
		p.unknowable(at, l.Argv[0], "the program is only known when the command runs (an expansion names it)", "name the program literally")
		return at
	case l.Argv[0] == "":
		p.unknowable(at, "''", "the program's name is empty", "name the program")
		return at
	case !plainCommandName(l.Argv[0]):
		p.unknowable(at, l.Argv[0], "the program's name is not plain ASCII: it only looks like another name", "use the program's plain ASCII name")
		return at
	case strings.HasPrefix(l.Argv[0], "-"):
		p.unknowable(at, l.Argv[0], "a program name starting with '-' reads as an option", "name the program by its path")
		return at
	}
	// A wrapper may run a program named like a builtin that reinterprets its arguments
	// (some systems ship /usr/bin/command): as unknowable as the builtin itself.
	if r, ok := reinterpreting[name]; ok {
		p.unknowable(at, name, r.reason, r.repair)
		return at
	}
	if l.shell && !l.checked {
		p.checkBuiltin(l, at)
	}
	unwrap, ok := wrappers[name]
	if !ok {
		return at
	}
	inner, why := unwrap(l, u, at)
	if why != nil {
		p.unknowable(at, why.word, why.reason, why.repair)
	}
	for _, in := range inner {
		u.add(in)
	}
	return at
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

// option is a parsed option: its name and value, and the index of the word that held the
// value when it was a word of its own (-1 when attached, or none).
type option struct {
	name, value string
	at          int
}

func hasOption(opts []option, names ...string) (option, bool) {
	for _, o := range opts {
		if slices.Contains(names, o.name) {
			return o, true
		}
	}
	return option{}, false
}

// unknownOption, runTimeWord and friends explain why a wrapper's words are uncertain.
func unknownOption(name, opt string) *unsure {
	return &unsure{opt, fmt.Sprintf("%s's option %s is not one the policy knows, so what %s runs is not certain", name, opt, name),
		fmt.Sprintf("drop %s, or ask an operator to judge it", opt)}
}

func runTimeWord(name, word string) *unsure {
	return &unsure{word, fmt.Sprintf("%s reads its options and its command from words, and %s is only known when it runs", name, word),
		fmt.Sprintf("write %s's options and command literally", name)}
}

func readsInput(name string) *unsure {
	return &unsure{name, name + " without a command runs a shell that reads its commands from the input, which the policy does not see",
		"give " + name + " the command to run"}
}

// getopt parses options from l.Argv[i:] as GNU getopt_long does with a leading '+' (stop
// at the first operand): short options from optstring ("u:" takes an argument, attached or
// the next word; "h::" one only attached), clusters (-nu root), long options by unique
// prefix, "--" ending options. It returns the options and the index of the first operand,
// or why it cannot be sure: an option it does not know, a missing argument, or a word known
// only at run time where an option or an option's argument could be.
func getopt(name string, l Layer, i int, optstring string, long map[string]argKind) (opts []option, next int, bad *unsure) {
	for i < len(l.Argv) {
		if l.unknown(i) {
			return nil, 0, runTimeWord(name, l.Argv[i])
		}
		w := l.Argv[i]
		switch {
		case w == "--":
			return opts, i + 1, nil
		case len(w) < 2 || w[0] != '-':
			return opts, i, nil
		}
		parsed, after, bad := parseOption(name, l, i, optstring, long)
		if bad != nil {
			return nil, 0, bad
		}
		opts = append(opts, parsed...)
		i = after
	}
	return opts, i, nil
}

// getoptPermute parses options as GNU getopt_long does without '+': options anywhere
// until "--", the other words being operands (their indexes). dashdash reports a "--".
func getoptPermute(name string, l Layer, i int, optstring string, long map[string]argKind) (opts []option, operands []int, dashdash bool, bad *unsure) {
	for i < len(l.Argv) {
		if l.unknown(i) {
			return nil, nil, false, runTimeWord(name, l.Argv[i])
		}
		w := l.Argv[i]
		switch {
		case w == "--":
			for j := i + 1; j < len(l.Argv); j++ {
				operands = append(operands, j)
			}
			return opts, operands, true, nil
		case len(w) < 2 || w[0] != '-':
			operands = append(operands, i)
			i++
			continue
		}
		parsed, after, bad := parseOption(name, l, i, optstring, long)
		if bad != nil {
			return nil, nil, false, bad
		}
		opts = append(opts, parsed...)
		i = after
	}
	if l.Open {
		return nil, nil, false, runTimeWord(name, "…")
	}
	return opts, operands, false, nil
}

// parseOption parses the option word at i (and the argument word after it, if it takes
// one) and returns the index after them.
func parseOption(name string, l Layer, i int, optstring string, long map[string]argKind) ([]option, int, *unsure) {
	w := l.Argv[i]
	// value returns the word after i as an option's argument.
	value := func(opt string) (string, int, *unsure) {
		if i+1 >= len(l.Argv) {
			if l.Open {
				return "", 0, runTimeWord(name, "…")
			}
			return "", 0, &unsure{opt, fmt.Sprintf("%s's option %s lacks its argument", name, opt), "give the option its argument"}
		}
		if l.spread(i + 1) {
			return "", 0, runTimeWord(name, l.Argv[i+1])
		}
		return l.Argv[i+1], i + 1, nil
	}
	if w[1] == '-' {
		optName, v, hasValue := strings.Cut(w[2:], "=")
		full, kind, found := lookupLong(long, optName)
		if !found || (kind == noArg && hasValue) {
			return nil, 0, unknownOption(name, w)
		}
		o := option{name: full, value: v, at: -1}
		if kind == requiredArg && !hasValue {
			val, at, bad := value(w)
			if bad != nil {
				return nil, 0, bad
			}
			o.value, o.at, i = val, at, at
		}
		return []option{o}, i + 1, nil
	}
	var opts []option
	for j := 1; j < len(w); j++ {
		c := w[j]
		at := strings.IndexByte(optstring, c)
		if at < 0 || c == ':' {
			return nil, 0, unknownOption(name, "-"+string(c))
		}
		kind := noArg
		if at+1 < len(optstring) && optstring[at+1] == ':' {
			kind = requiredArg
			if at+2 < len(optstring) && optstring[at+2] == ':' {
				kind = optionalArg
			}
		}
		if kind == noArg {
			opts = append(opts, option{name: string(c), at: -1})
			continue
		}
		o := option{name: string(c), value: w[j+1:], at: -1}
		if kind == requiredArg && o.value == "" {
			val, vat, bad := value("-" + string(c))
			if bad != nil {
				return nil, 0, bad
			}
			o.value, o.at, i = val, vat, vat
		}
		opts = append(opts, o)
		break
	}
	return opts, i + 1, nil
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
	exits           []string // options after which the wrapper runs nothing (--help, --dump)
	assignments     bool     // NAME=VALUE words may precede the command (env, sudo)
	dashOption      bool     // a lone "-" is an option (env), not the command
	legacyNice      bool     // nice -10, nice --10: an adjustment before the options
	operands        int      // words between the options and the command (timeout DURATION)
	commandRequired bool     // without a command the wrapper runs one the argv does not show
	keepsShell      bool     // what it runs is run by the shell (time, noglob): builtins stay builtins
}

func (w optionWrapper) unwrap(name string) unwrapFunc {
	return func(l Layer, _ *unwrapper, _ int) ([]Layer, *unsure) {
		i := 1
		if w.legacyNice {
			for i < len(l.Argv) && !l.unknown(i) && legacyAdjustment(l.Argv[i]) {
				i++
			}
		}
		if w.dashOption && i < len(l.Argv) && !l.unknown(i) && l.Argv[i] == "-" {
			i++
		}
		opts, i, bad := getopt(name, l, i, w.short, w.long)
		if bad != nil {
			return nil, bad
		}
		for _, o := range opts {
			if slices.Contains(w.unsure, o.name) {
				return nil, &unsure{optionText(o), fmt.Sprintf("%s with %s runs a shell, an editor or an interpreter the words do not show", name, optionText(o)),
					fmt.Sprintf("drop %s and name the command to run", optionText(o))}
			}
		}
		if _, ok := hasOption(opts, w.exits...); ok {
			return nil, nil
		}
		if w.assignments {
			for i < len(l.Argv) && !l.unknown(i) && strings.Contains(l.Argv[i], "=") {
				if !harmlessAssignment(l.Argv[i]) {
					return nil, &unsure{l.Argv[i], "the assignment " + l.Argv[i] + " changes which program runs or what it runs (a shell, the loader or the program reads it)",
						"drop the assignment; name the program by its full path"}
				}
				i++
			}
		}
		i += w.operands
		if s, ok := l.spreadBefore(min(i, len(l.Argv))); ok {
			return nil, runTimeWord(name, l.Argv[s])
		}
		switch {
		case i < len(l.Argv):
			inner := l.sub(i, name)
			inner.shell = w.keepsShell && l.shell
			return []Layer{inner}, nil
		case l.Open:
			return nil, runTimeWord(name, "…") // the command would come from the words only known at run time
		case w.commandRequired:
			return nil, readsInput(name)
		default:
			return nil, nil
		}
	}
}

func optionText(o option) string {
	if len(o.name) == 1 {
		return "-" + o.name
	}
	return "--" + o.name
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
// reads to find or run other code; an assignment to one makes what runs uncertain
// (env PS4='$(rm x)' SHELLOPTS=xtrace bash -c ls runs rm; PATH=/tmp/x; ls runs /tmp/x/ls).
var riskyVariables = map[string]bool{
	"PATH": true, "BASH_ENV": true, "ENV": true, "SHELLOPTS": true, "BASHOPTS": true, "PS4": true,
	"IFS": true, "HOME": true, "ZDOTDIR": true, "CDPATH": true, "GLOBIGNORE": true, "PROMPT_COMMAND": true,
	"GCONV_PATH": true, "LOCPATH": true, "NLSPATH": true, "HOSTALIASES": true, "PAGER": true, "MANPAGER": true,
	"EDITOR": true, "VISUAL": true, "SUDO_EDITOR": true, "SUDO_ASKPASS": true, "SSH_ASKPASS": true,
	"GIT_SSH_COMMAND": true, "GIT_PAGER": true, "GIT_EDITOR": true, "LESSOPEN": true, "LESSCLOSE": true,
	"PERL5OPT": true, "PERL5LIB": true, "PYTHONPATH": true, "PYTHONSTARTUP": true, "PYTHONHOME": true,
	"RUBYOPT": true, "RUBYLIB": true, "NODE_OPTIONS": true, "BROWSER": true,
	// The shell's own: aliases and the command hash as arrays, names PATH search skips,
	// prompts (expanded with substitutions), the shell su, flock and script start.
	"BASH_ALIASES": true, "BASH_CMDS": true, "EXECIGNORE": true, "BASH_LOADABLES_PATH": true,
	"PS0": true, "PS1": true, "PS2": true, "PS3": true, "SHELL": true,
	"PARALLEL": true, // GNU parallel's options, --rpl (Perl code) among them
}

var riskyPrefixes = []string{"LD_", "DYLD_", "BASH_FUNC_"}

func riskyName(name string) bool {
	if riskyVariables[name] {
		return true
	}
	for _, p := range riskyPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// harmlessAssignment reports whether NAME=VALUE, given to a program's environment, names
// a plain variable that changes no code that runs.
func harmlessAssignment(w string) bool {
	name, _, _ := strings.Cut(w, "=")
	return identifier(name) && !riskyName(name)
}

// scriptHarmlessName reports whether a script may set the variable name without changing
// what runs. IFS is fine in a script: the words it splits are expansions, which are known
// only at run time anyway, and bash ignores an inherited IFS.
func scriptHarmlessName(name string) bool {
	return name == "IFS" || !riskyName(name)
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
