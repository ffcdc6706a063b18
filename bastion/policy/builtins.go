package policy

import "strings"

// reinterpreting are builtins that run their arguments as shell code or change what a
// command name means (eval "rm -rf /", alias df=rm; df): their argv says nothing about what
// will run.
var reinterpreting = map[string]struct{ reason, repair string }{
	"eval":    {"eval runs a string as shell code", "write the command itself instead of a string for eval"},
	"source":  {"source runs the commands of a file, which the policy does not read", "write the commands, or run the file as a program (bash FILE)"},
	".":       {". runs the commands of a file, which the policy does not read", "write the commands, or run the file as a program (bash FILE)"},
	"alias":   {"alias changes what a command name runs", "call the command directly"},
	"unalias": {"unalias changes what a command name runs", "call the command directly"},
	"enable":  {"enable loads or switches off builtins, changing what a command name runs", "call the command directly"},
	"trap":    {"trap runs a string as shell code when a signal or event comes", "write the commands where they should run"},
	"fc":      {"fc runs commands from the shell's history", "write the commands"},
	"bind":    {"bind -x runs a string as shell code", "write the commands"},
	"compgen": {"compgen runs or expands the code it is given (-C, -F, -W)", "write the commands"},
	// zsh's (an account's shell may be zsh)
	"emulate":  {"zsh's emulate -c runs a string as shell code", "write the commands"},
	"sched":    {"zsh's sched runs a command string later", "write the commands"},
	"zmodload": {"zsh's zmodload loads modules that change what builtins do", "call the command directly"},
}

// checkBuiltin records what a bash builtin makes unknowable through its arguments: names
// with a subscript (bash evaluates NAME[sub] as arithmetic, and a[$(cmd)] runs cmd) or
// that change what runs (PATH), arithmetic over variables (let), remapped names (hash -p),
// callbacks (mapfile -C) and set -k. l is a command the shell runs itself; at its index.
func (p *parser) checkBuiltin(l Layer, at int) {
	args := l.Argv[1:]
	// name checks the word at index i of l, which the builtin takes as a variable's name.
	name := func(i int, what string) {
		if i >= len(l.Argv) {
			return
		}
		if l.unknown(i) {
			p.unknowable(at, l.Argv[i], what+" takes a variable's name, and "+l.Argv[i]+" is only known when it runs (a name such as a[$(cmd)] runs cmd)",
				"write the variable's name literally")
			return
		}
		p.bind(l.Argv[i], l.Argv[i], at)
	}
	switch l.Argv[0] {
	case "test", "[":
		for i, w := range args {
			if !l.unknown(i+1) && (w == "-v" || w == "-R") {
				name(i+2, l.Argv[0]+" "+w)
			}
		}
	case "printf":
		switch {
		case len(args) == 0:
		case l.spread(1):
			p.unknowable(at, args[0], "printf's first word could be -v NAME, and a name such as a[$(cmd)] runs cmd", "quote it (\"$F\")")
		case l.unknown(1):
			name(2, "printf -v") // the first word could be -v
		case args[0] == "-v":
			name(2, "printf -v")
		case strings.HasPrefix(args[0], "-v"):
			p.bind(args[0][2:], args[0], at)
		}
	case "read":
		p.optionNames(l, at, "ersa:d:i:n:N:p:t:u:", "a", name)
	case "mapfile", "readarray":
		if p.optionNames(l, at, "d:n:O:s:u:C:c:t", "", name) {
			for i, w := range args {
				if !l.unknown(i+1) && strings.HasPrefix(w, "-") && strings.Contains(w, "C") {
					p.unknowable(at, w, l.Argv[0]+" -C runs a string as shell code for each line", "read the lines and run the commands yourself")
				}
			}
		}
	case "getopts":
		name(2, "getopts")
	case "wait":
		for i, w := range args {
			if !l.unknown(i+1) && strings.HasPrefix(w, "-") && strings.HasSuffix(w, "p") {
				name(i+2, "wait -p")
			}
		}
	case "unset", "declare", "typeset", "local", "export", "readonly":
		for i, w := range args {
			switch {
			case l.unknown(i + 1):
				p.unknowable(at, w, l.Argv[0]+"'s argument "+w+" is only known when it runs: it could name any variable, or an array element whose subscript runs code",
					"write the names literally")
			case strings.HasPrefix(w, "-") || strings.HasPrefix(w, "+"):
				if l.Argv[0] != "unset" && l.Argv[0] != "export" && strings.ContainsAny(w[1:], "in") {
					p.unknowable(at, w, l.Argv[0]+" "+w+" makes later assignments arithmetic or names references, which bash evaluates (a[$(cmd)] runs cmd)", "drop -i and -n")
				}
			default: // NAME or NAME=VALUE; unsetting PATH makes bash look for programs in the working directory
				n, _, _ := strings.Cut(w, "=")
				p.bind(n, w, at)
			}
		}
	case "let":
		for i, w := range args {
			if l.unknown(i+1) || strings.Trim(w, "0123456789+-*/%<>=!&|^~?:() \t") != "" {
				p.unknowable(at, w, "let evaluates its arguments as arithmetic, and a variable in it holding a[$(cmd)] runs cmd", "use literal numbers, or compute with a program (seq, expr)")
			}
		}
	case "hash":
		for i, w := range args {
			if l.unknown(i+1) || (strings.HasPrefix(w, "-") && strings.Contains(w, "p")) {
				p.unknowable(at, w, "hash -p makes a command name run another program", "call the program by its path")
				break
			}
		}
	case "set":
		for i := 1; i < len(l.Argv); i++ {
			w := l.Argv[i]
			switch {
			case l.unknown(i):
				p.unknowable(at, w, "set's option "+w+" is only known when it runs (set -k changes which words are assignments)", "write set's options literally")
				return
			case w == "--" || w == "-" || (w[0] != '-' && w[0] != '+'):
				return // the positional parameters follow
			case w == "-o" || w == "+o":
				if i+1 < len(l.Argv) && (l.unknown(i+1) || l.Argv[i+1] == "keyword") {
					p.unknowable(at, w+" "+l.Argv[i+1], "set -o keyword makes assignments anywhere in a command part of its environment", "drop it")
				}
				i++
			case strings.Contains(w[1:], "k"):
				p.unknowable(at, w, "set -k makes assignments anywhere in a command part of its environment", "drop -k")
			}
		}
	case "shopt":
		for i, w := range args {
			if l.unknown(i + 1) {
				p.unknowable(at, w, "shopt's option is only known when it runs", "write shopt's options literally")
			}
		}
	}
}

// optionNames walks the options of a builtin that takes variable names (read, mapfile):
// the option named nameOption and the operands are names. It reports whether the options
// could be read (a word known only at run time where an option could be is unknowable).
func (p *parser) optionNames(l Layer, at int, optstring, nameOption string, name func(int, string)) bool {
	what := l.Argv[0]
	i := 1
	for ; i < len(l.Argv); i++ {
		if l.unknown(i) {
			p.unknowable(at, l.Argv[i], what+" reads its options and variable names from words, and "+l.Argv[i]+" is only known when it runs (a name such as a[$(cmd)] runs cmd)",
				"write "+what+"'s options and names literally")
			return false
		}
		w := l.Argv[i]
		if w == "--" {
			i++
			break
		}
		if len(w) < 2 || w[0] != '-' {
			break
		}
		for j := 1; j < len(w); j++ {
			c := w[j]
			k := strings.IndexByte(optstring, c)
			if k < 0 || k+1 >= len(optstring) || optstring[k+1] != ':' {
				continue // a flag, or an option bash refuses
			}
			value := w[j+1:]
			if value == "" {
				i++
				if l.spread(i) {
					p.unknowable(at, l.Argv[i], what+"'s option -"+string(c)+" takes one word, and "+l.Argv[i]+" may become several", "quote it (\"$F\")")
					return false
				}
				if string(c) == nameOption {
					name(i, what+" -"+string(c))
				}
			} else if string(c) == nameOption {
				p.bind(value, w, at)
			}
			break
		}
	}
	for ; i < len(l.Argv); i++ {
		name(i, what)
	}
	return true
}
