package policy

import (
	"strings"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"
)

// MaxCommandBytes bounds what ParseCommand reads; a longer command is never safe.
const MaxCommandBytes = 64 << 10

// maxOpeners bounds the bytes that can open a nested construct — ( { [ ` — before the
// parser sees them: its cost grows faster than linearly with nesting depth (60000 '('
// take seconds), and no plain command needs that many.
const maxOpeners = 1024

// reinterpreting are builtins that run their arguments as shell code or change what a
// command name means (eval "rm -rf /", hash -p /bin/rm df; df): their argv says nothing
// about what will run.
var reinterpreting = map[string]bool{
	"eval": true, "source": true, ".": true, "exec": true, "command": true, "builtin": true,
	"alias": true, "unalias": true, "hash": true, "enable": true, "shopt": true, "trap": true,
}

// ParseCommand parses command as a bash script and returns every simple command's argv
// with its words' literal values (quotes and backslashes removed: `'r'\m` is "rm"). safe
// is false when anything in the script is not a plain literal word, or it does not parse:
// parameter, command, arithmetic and process substitution, $'…' and $"…", unquoted glob,
// brace or tilde characters, an unquoted word starting with = (zsh's =cmd), assignments
// (PATH=… cmd), here-documents, redirections other than to /dev/null or to a file
// descriptor, subshells, blocks, functions, compound and declaration commands, coprocesses,
// builtins that reinterpret their arguments (eval, source, exec, command, hash, alias, ...),
// and a command name that is empty, not ASCII or holds a control character. Commands over
// MaxCommandBytes, with a NUL byte, invalid UTF-8 or more than 1024 of the bytes ( { [ `
// are not parsed and not safe. The shell's time keyword is read as the time program (time
// df → the argv time df). When safe is false argvs are partial and must not be trusted.
func ParseCommand(command string) (argvs [][]string, safe bool) {
	if len(command) > MaxCommandBytes || !utf8.ValidString(command) || strings.ContainsRune(command, 0) ||
		countOpeners(command) > maxOpeners {
		return nil, false
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(command), "")
	if err != nil {
		return nil, false
	}
	w := scriptWalker{safe: true}
	for _, st := range f.Stmts {
		w.stmt(st)
	}
	return w.argvs, w.safe
}

func countOpeners(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(', '{', '[', '`':
			n++
		}
	}
	return n
}

type scriptWalker struct {
	argvs [][]string
	safe  bool
}

func (w *scriptWalker) stmt(s *syntax.Stmt) {
	if s == nil || s.Coprocess || s.Disown {
		w.safe = false
		return
	}
	for _, r := range s.Redirs {
		if !harmlessRedirect(r) {
			w.safe = false
		}
	}
	switch c := s.Cmd.(type) {
	case *syntax.CallExpr:
		w.call(c)
	case *syntax.BinaryCmd: // a && b, a || b, a | b, a |& b
		w.stmt(c.X)
		w.stmt(c.Y)
	case *syntax.TimeClause: // the shell's time keyword: judged as the time wrapper
		timeWords := []string{"time"}
		if c.PosixFormat {
			timeWords = append(timeWords, "-p")
		}
		if c.Stmt == nil {
			w.safe = false
			return
		}
		n := len(w.argvs)
		w.stmt(c.Stmt)
		if _, simple := c.Stmt.Cmd.(*syntax.CallExpr); simple && len(w.argvs) == n+1 {
			w.argvs[n] = append(timeWords, w.argvs[n]...)
		} else {
			w.argvs = append(w.argvs, timeWords)
		}
	default: // subshells, blocks, if/while/for/case, functions, [[ ]], (( )), declare/export, let, time, ...
		w.safe = false
	}
}

func (w *scriptWalker) call(c *syntax.CallExpr) {
	if len(c.Assigns) > 0 || len(c.Args) == 0 {
		w.safe = false
		return
	}
	argv := make([]string, 0, len(c.Args))
	for _, word := range c.Args {
		lit, ok := literalWord(word)
		if !ok {
			w.safe = false
		}
		argv = append(argv, lit)
	}
	if !plainCommandName(argv[0]) || reinterpreting[argv[0]] {
		w.safe = false
	}
	w.argvs = append(w.argvs, argv)
}

// plainCommandName rejects names that only look like another command: non-ASCII
// (fullwidth ｒｍ, Cyrillic о) and control characters; and the empty name.
func plainCommandName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if b := name[i]; b < 0x21 || b > 0x7e {
			return false
		}
	}
	return true
}

// harmlessRedirect allows only redirections that cannot write or read a file an argv
// pattern does not show: to or from /dev/null, and fd duplication (2>&1, >&-).
func harmlessRedirect(r *syntax.Redirect) bool {
	if r.Hdoc != nil || (r.N != nil && !allDigits(r.N.Value)) {
		return false
	}
	target, ok := literalWord(r.Word)
	if !ok {
		return false
	}
	switch r.Op {
	case syntax.DplIn, syntax.DplOut:
		return target == "-" || allDigits(target)
	case syntax.RdrOut, syntax.AppOut, syntax.RdrIn, syntax.RdrAll, syntax.AppAll, syntax.RdrClob:
		return target == "/dev/null"
	default:
		return false
	}
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// literalWord returns a word's value if it is made only of literal text, single quotes
// and double quotes holding literal text.
func literalWord(word *syntax.Word) (string, bool) {
	if word == nil || len(word.Parts) == 0 {
		return "", false
	}
	// "{}" and "[" are literal (find -exec {} \;, [ -f x ]); elsewhere braces and brackets
	// are brace expansion and globs.
	if lit, ok := word.Parts[0].(*syntax.Lit); ok && len(word.Parts) == 1 && (lit.Value == "{}" || lit.Value == "[") {
		return lit.Value, true
	}
	// zsh (an account's shell may be zsh) expands an unquoted =cmd to cmd's path.
	if lit, ok := word.Parts[0].(*syntax.Lit); ok && len(lit.Value) > 1 && lit.Value[0] == '=' {
		return "", false
	}
	var b strings.Builder
	for _, part := range word.Parts {
		switch p := part.(type) {
		case *syntax.Lit:
			if !unquotedLiteral(&b, p.Value) {
				return "", false
			}
		case *syntax.SglQuoted:
			if p.Dollar {
				return "", false
			}
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			if p.Dollar {
				return "", false
			}
			for _, inner := range p.Parts {
				lit, ok := inner.(*syntax.Lit)
				if !ok || !doubleQuotedLiteral(&b, lit.Value) {
					return "", false
				}
			}
		default: // $x, ${x}, $(…), `…`, $((…)), <(…), extglobs
			return "", false
		}
	}
	return b.String(), true
}

// unquotedLiteral writes the value of unquoted source text s (backslash escapes the next
// character; a backslash-newline vanishes), refusing characters the shell would expand.
func unquotedLiteral(b *strings.Builder, s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' {
			if i+1 == len(s) {
				return false
			}
			i++
			if s[i] != '\n' {
				b.WriteByte(s[i])
			}
			continue
		}
		if strings.IndexByte("*?[{~$`", c) >= 0 {
			return false
		}
		b.WriteByte(c)
	}
	return true
}

// doubleQuotedLiteral is unquotedLiteral for text inside "…", where a backslash only
// escapes $ ` " \ and newline.
func doubleQuotedLiteral(b *strings.Builder, s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && strings.IndexByte("$`\"\\\n", s[i+1]) >= 0 {
			i++
			if s[i] != '\n' {
				b.WriteByte(s[i])
			}
			continue
		}
		if c == '$' || c == '`' {
			return false
		}
		b.WriteByte(c)
	}
	return true
}
