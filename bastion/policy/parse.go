package policy

import (
	"path"
	"strings"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"
)

// MaxCommandBytes bounds what Parse reads; a longer command is unknowable.
const MaxCommandBytes = 64 << 10

// maxOpeners bounds the bytes that can open a nested construct — ( { [ ` — before the
// parser sees them: its cost grows faster than linearly with nesting depth (60000 '('
// take seconds), and no plain command needs that many.
const maxOpeners = 1024

// Bounds on what one command line may hold before it is unknowable as a whole.
const (
	maxLayers     = 4096 // layers of the whole line
	maxUnknowable = 64   // unknowables recorded (the first decides the explanation)
)

// Script is a command line as the rules see it (Parse).
type Script struct {
	// Layers are the commands the line would run: every simple command (in lists, pipes,
	// loops, conditionals, function bodies, command and process substitutions and here-
	// documents alike) and, through the wrappers Unwrap knows, what each runs.
	Layers []Layer
	// Simple counts the simple commands written in the line (wrapped commands excluded).
	Simple int
	// Writes are the files the shell's redirections write (> >> >| &> &>> <> and >&NAME),
	// /dev/null excepted; Reads the files they read (< <>).
	Writes []File
	Reads  []File
	// Unknowable lists where a program cannot be known before the line runs; empty when
	// every program is known.
	Unknowable []Unknowable
}

// Known reports whether every program the line would run is known before it runs.
func (s Script) Known() bool { return len(s.Unknowable) == 0 }

// File is a file a redirection opens.
type File struct {
	// Path is the target as written: the literal path, or the shell text ($F, "$(mktemp)")
	// when it is only known at run time (Unknown).
	Path    string `json:"path"`
	Unknown bool   `json:"unknown,omitempty"`
	// Layer is the index into Script.Layers of the simple command the redirection belongs
	// to; -1 for one on a compound command or on no command.
	Layer int `json:"layer"`
}

// Unknowable is a place in a command line where a program cannot be known before it runs.
type Unknowable struct {
	Word   string `json:"word,omitempty"` // the word in question, as written ("$CMD", "eval", "--frobnicate")
	Reason string `json:"reason"`         // why, in plain words
	Repair string `json:"repair"`         // what to write instead
	Layer  int    `json:"layer"`          // index into Script.Layers, -1 when no layer
}

// Parse parses command as bash would and returns every command it would run (Script).
// Words the shell expands — parameters, command and arithmetic substitutions, globs,
// braces, tildes — keep the program known when they are arguments: they are kept as words
// known only at run time (Layer.Unknown; Layer.Spread when they may split into several
// words or none). A program is unknowable where the shell decides it at run time or runs
// text the line does not show: an expansion in the command position, eval, source, alias,
// trap and the like, a shell reading its input (… | sh), a wrapper the unwrapper cannot
// read with certainty, an assignment to a variable that changes what runs (PATH, LD_*,
// BASH_ENV, …), bash arithmetic over a variable or a name with a subscript (its value
// a[$(cmd)] runs cmd), a parse error, or a line over MaxCommandBytes, with a NUL byte,
// invalid UTF-8 or more than 1024 of the bytes ( { [ `. Pure.
func Parse(command string) Script {
	p := &parser{}
	seen := 0
	if n := p.script(command, scope{layer: -1, seen: &seen}); n == 0 {
		p.unknowable(-1, "", "the command is empty: there is nothing to judge", "send the command to run")
	}
	return p.s
}

type parser struct {
	s Script
}

// scope is where a script being walked runs: at the top of the command line, or as the
// string a shell wrapper runs (sh -c 'STRING'), whose commands are layers of that wrapper.
type scope struct {
	src   string     // the script's source, for quoting words as written
	via   string     // Layer.Via of its simple commands
	depth int        // Layer.Depth of its simple commands
	u     *unwrapper // the unwrapper of the wrapper running it; nil at the top
	layer int        // the layer running it; -1 at the top
	seen  *int       // code-running nodes walked, checked against countRunning
}

// unknowable records that a program cannot be known (bounded: the first ones explain).
func (p *parser) unknowable(layer int, word, reason, repair string) {
	if len(p.s.Unknowable) < maxUnknowable {
		p.s.Unknowable = append(p.s.Unknowable, Unknowable{Word: clip(word, maxWordNote), Reason: reason, Repair: repair, Layer: layer})
	}
}

// maxWordNote bounds a word quoted in an explanation.
const maxWordNote = 128

// script parses src and walks its statements; it returns how many there were (-1 when it
// did not parse).
func (p *parser) script(src string, sc scope) int {
	if len(src) > MaxCommandBytes || !utf8.ValidString(src) || strings.ContainsRune(src, 0) || countOpeners(src) > maxOpeners {
		p.unknowable(sc.layer, "", "the command is over 64 KiB, is not valid UTF-8, holds a NUL byte or nests more than 1024 brackets",
			"send a shorter, plainer command")
		return -1
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(src), "")
	if err != nil {
		p.unknowable(sc.layer, "", "the command does not parse as a shell script ("+err.Error()+")", "fix its shell syntax")
		return -1
	}
	sc.src = src
	seen := 0
	sc.seen = &seen
	for _, st := range f.Stmts {
		p.stmt(st, sc)
	}
	// Every node that runs code must have been walked; anything else is syntax this walk
	// does not know, which must never pass unjudged.
	if want := countRunning(f); seen != want {
		p.unknowable(sc.layer, "", "the command uses shell syntax the policy does not judge", "write it with plainer shell syntax")
	}
	return len(f.Stmts)
}

// countRunning counts the nodes that run commands: simple commands and substitutions.
func countRunning(f *syntax.File) int {
	n := 0
	syntax.Walk(f, func(node syntax.Node) bool {
		switch node.(type) {
		case *syntax.CallExpr, *syntax.CmdSubst, *syntax.ProcSubst:
			n++
		}
		return true
	})
	return n
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

// text is a node as written in the script's source.
func (sc scope) text(n syntax.Node) string {
	from, to := int(n.Pos().Offset()), int(n.End().Offset())
	if from < 0 || to > len(sc.src) || from > to {
		return ""
	}
	return sc.src[from:to]
}

func (p *parser) stmts(list []*syntax.Stmt, sc scope) {
	for _, s := range list {
		p.stmt(s, sc)
	}
}

func (p *parser) stmt(s *syntax.Stmt, sc scope) {
	if s == nil {
		return
	}
	layer := p.command(s.Cmd, sc)
	for _, r := range s.Redirs {
		p.redirect(r, sc, layer)
	}
}

// command walks one command and returns the index of the layer its redirections belong to
// (a simple command's), or -1.
func (p *parser) command(cmd syntax.Command, sc scope) int {
	switch c := cmd.(type) {
	case nil:
	case *syntax.CallExpr:
		return p.call(c, sc, nil)
	case *syntax.BinaryCmd: // a && b, a || b, a | b, a |& b
		p.stmt(c.X, sc)
		p.stmt(c.Y, sc)
	case *syntax.Block:
		p.stmts(c.Stmts, sc)
	case *syntax.Subshell:
		p.stmts(c.Stmts, sc)
	case *syntax.IfClause:
		for ic := c; ic != nil; ic = ic.Else {
			p.stmts(ic.Cond, sc)
			p.stmts(ic.Then, sc)
		}
	case *syntax.WhileClause:
		p.stmts(c.Cond, sc)
		p.stmts(c.Do, sc)
	case *syntax.ForClause:
		switch loop := c.Loop.(type) {
		case *syntax.WordIter:
			p.bind(loop.Name.Value, loop.Name.Value, sc.layer)
			for _, w := range loop.Items {
				p.word(w, sc)
			}
		case *syntax.CStyleLoop:
			p.arith(loop.Init, sc, loop)
			p.arith(loop.Cond, sc, loop)
			p.arith(loop.Post, sc, loop)
		}
		p.stmts(c.Do, sc)
	case *syntax.CaseClause:
		p.word(c.Word, sc)
		for _, item := range c.Items {
			for _, pattern := range item.Patterns {
				p.word(pattern, sc)
			}
			p.stmts(item.Stmts, sc)
		}
	case *syntax.FuncDecl: // its body is judged where it is defined
		p.stmt(c.Body, sc)
	case *syntax.ArithmCmd:
		p.arith(c.X, sc, c)
	case *syntax.TestClause:
		p.test(c.X, sc)
	case *syntax.DeclClause:
		return p.decl(c, sc)
	case *syntax.LetClause:
		l := p.layer(sc, "let")
		for _, x := range c.Exprs {
			p.arith(x, sc, x)
			l.Argv = append(l.Argv, sc.text(x))
		}
		l.checked = true
		return p.run(l, sc)
	case *syntax.TimeClause: // the shell's time keyword: judged as the time wrapper
		prefix := []string{"time"}
		if c.PosixFormat {
			prefix = append(prefix, "-p")
		}
		if c.Stmt != nil {
			if call, ok := c.Stmt.Cmd.(*syntax.CallExpr); ok && len(call.Args) > 0 {
				layer := p.call(call, sc, prefix)
				for _, r := range c.Stmt.Redirs {
					p.redirect(r, sc, layer)
				}
				return -1
			}
		}
		l := p.layer(sc, prefix...)
		p.run(l, sc)
		p.stmt(c.Stmt, sc)
	case *syntax.CoprocClause:
		p.stmt(c.Stmt, sc)
	default: // bats' @test, and whatever a newer parser adds
		p.unknowable(sc.layer, sc.text(cmd), "shell syntax the policy does not judge", "write it with plainer shell syntax")
	}
	return -1
}

// layer starts a layer of this scope with the given literal words.
func (p *parser) layer(sc scope, words ...string) Layer {
	return Layer{Argv: append([]string(nil), words...), Via: sc.via, Depth: sc.depth, shell: true}
}

// run unwraps l into the layers it runs and returns the index of l, or -1 when the bounds
// stopped it.
func (p *parser) run(l Layer, sc scope) int {
	u := sc.u
	if u == nil {
		u = &unwrapper{p: p}
	}
	return u.add(l)
}

// call walks a simple command: its assignments, its words (the substitutions in them are
// commands too) and then the command itself, unwrapped. prefix are words the shell's time
// keyword puts before it.
func (p *parser) call(c *syntax.CallExpr, sc scope, prefix []string) (at int) {
	*sc.seen++
	first := len(p.s.Unknowable)
	for _, a := range c.Assigns {
		p.assign(a, sc)
	}
	if len(c.Args) == 0 {
		return -1
	}
	defer func() { p.attach(first, sc.layer, at) }()
	l := p.layer(sc, prefix...)
	for _, w := range c.Args {
		v := p.word(w, sc)
		i := len(l.Argv)
		l.Argv = append(l.Argv, v.text)
		if !v.known {
			l.Unknown = append(l.Unknown, i)
			if v.spread {
				l.Spread = append(l.Spread, i)
			}
		}
	}
	if sc.u == nil {
		p.s.Simple++
	}
	at = p.run(l, sc)
	return at
}

// attach points the unknowables recorded since first at the scope's layer to the simple
// command's layer at, which did not exist yet when its words were walked.
func (p *parser) attach(first, scopeLayer, at int) {
	if at < 0 {
		return
	}
	for i := first; i < len(p.s.Unknowable); i++ {
		if p.s.Unknowable[i].Layer == scopeLayer {
			p.s.Unknowable[i].Layer = at
		}
	}
}

// redirect records the file a redirection opens.
func (p *parser) redirect(r *syntax.Redirect, sc scope, layer int) {
	if r.N != nil && !allDigits(r.N.Value) { // {name}>file stores the descriptor in name
		name := strings.TrimSuffix(strings.TrimPrefix(r.N.Value, "{"), "}")
		p.bind(name, r.N.Value, layer)
	}
	if r.Hdoc != nil { // a here-document is input; the expansions in its body run
		p.word(r.Hdoc, sc)
	}
	if r.Word == nil {
		return
	}
	switch r.Op {
	case syntax.Hdoc, syntax.DashHdoc: // the word is the delimiter
		return
	case syntax.WordHdoc:
		p.word(r.Word, sc)
		return
	}
	v := p.word(r.Word, sc)
	f := File{Path: v.text, Unknown: !v.known, Layer: layer}
	if v.known && v.text == "/dev/null" {
		return
	}
	if (r.Op == syntax.RdrIn || r.Op == syntax.DplIn) && v.known &&
		(strings.HasPrefix(path.Clean(v.text), "/dev/tcp/") || strings.HasPrefix(path.Clean(v.text), "/dev/udp/")) {
		p.s.Writes = append(p.s.Writes, f) // bash opens a connection to read it: that sends too
	}
	switch r.Op {
	case syntax.DplIn, syntax.DplOut:
		if v.known && (v.text == "-" || allDigits(v.text)) {
			return // a descriptor duplicated or closed
		}
		if r.Op == syntax.DplIn {
			p.s.Reads = append(p.s.Reads, f)
			return
		}
		p.s.Writes = append(p.s.Writes, f) // >&word writes both streams to the file word names
	case syntax.RdrIn:
		p.s.Reads = append(p.s.Reads, f)
	case syntax.RdrInOut:
		p.s.Reads = append(p.s.Reads, f)
		p.s.Writes = append(p.s.Writes, f)
	default: // > >> >| &> &>> and zsh's clobbering forms
		p.s.Writes = append(p.s.Writes, f)
	}
}

// assign walks NAME=VALUE, NAME[I]=VALUE and NAME=(…).
func (p *parser) assign(a *syntax.Assign, sc scope) {
	if a.Name != nil {
		p.bind(a.Name.Value, sc.text(a), sc.layer)
	}
	p.arith(a.Index, sc, a)
	if a.Value != nil {
		p.word(a.Value, sc)
	}
	if a.Array != nil {
		for _, e := range a.Array.Elems {
			p.arith(e.Index, sc, e)
			if e.Value != nil {
				p.word(e.Value, sc)
			}
		}
	}
}

// bind checks a name the script assigns (NAME=, for NAME in, read NAME, printf -v NAME,
// {NAME}>file, ${NAME:=…}): a variable that changes what runs, or a name with a subscript,
// which bash evaluates as arithmetic.
func (p *parser) bind(name, word string, layer int) {
	switch {
	case strings.Contains(name, "["):
		p.unknowable(layer, word, "bash evaluates the subscript of "+name+" as arithmetic, and a subscript such as $(cmd) or a variable holding a[$(cmd)] runs cmd",
			"use a plain variable name")
	case !scriptHarmlessName(name):
		p.unknowable(layer, word, "setting "+name+" changes which program runs or what it runs",
			"do not set "+name+"; name programs by their full path instead")
	}
}

// decl walks declare, local, export, readonly, typeset and nameref.
func (p *parser) decl(c *syntax.DeclClause, sc scope) int {
	variant := c.Variant.Value
	l := p.layer(sc, variant)
	l.checked = true
	for _, a := range c.Args {
		i := len(l.Argv)
		l.Argv = append(l.Argv, sc.text(a))
		if a.Naked && a.Name == nil { // an option, or a word that expands to arguments
			v := p.word(a.Value, sc)
			switch {
			case !v.known:
				l.Unknown = append(l.Unknown, i)
				p.unknowable(sc.layer, v.text, variant+"'s argument is only known when it runs: it could set any variable (PATH=…) or an array element whose subscript runs code",
					"write the variable's name and value literally")
			case strings.HasPrefix(v.text, "-") || strings.HasPrefix(v.text, "+"):
				if strings.Contains(v.text[1:], "i") || (variant != "export" && strings.Contains(v.text[1:], "n")) || variant == "nameref" {
					p.unknowable(sc.layer, v.text, variant+" "+v.text+" makes later assignments arithmetic or names references, which bash evaluates (a[$(cmd)] runs cmd)",
						"drop -i and -n")
				}
			default:
				p.bind(strings.SplitN(v.text, "=", 2)[0], v.text, sc.layer)
			}
			continue
		}
		if variant == "nameref" {
			p.unknowable(sc.layer, sc.text(a), "nameref makes a name a reference, which bash resolves at run time", "use the variable itself")
		}
		p.assign(a, sc)
		if a.Value != nil || a.Array != nil {
			if _, ok := literalWord(a.Value); !ok {
				l.Unknown = append(l.Unknown, i)
			}
		}
	}
	return p.run(l, sc)
}

// wordVal is what the shell makes of a word: its literal value, or its text as written
// when it is only known at run time (and then whether it may split into several words or
// none).
type wordVal struct {
	text   string
	known  bool
	spread bool
}

// word walks a word: the commands in its substitutions are judged, and its value is
// literal or known only at run time.
func (p *parser) word(w *syntax.Word, sc scope) wordVal {
	if w == nil {
		return wordVal{}
	}
	if lit, ok := literalWord(w); ok {
		return wordVal{text: lit, known: true}
	}
	v := wordVal{text: sc.text(w)}
	p.parts(w.Parts, false, sc, &v)
	return v
}

func (p *parser) parts(parts []syntax.WordPart, quoted bool, sc scope, v *wordVal) {
	for _, part := range parts {
		switch x := part.(type) {
		case *syntax.Lit:
			if !quoted && expandsToWords(x.Value) {
				v.spread = true
			}
		case *syntax.SglQuoted:
		case *syntax.DblQuoted:
			p.parts(x.Parts, true, sc, v)
		case *syntax.ParamExp:
			p.param(x, quoted, sc, v)
		case *syntax.CmdSubst:
			*sc.seen++
			p.stmts(x.Stmts, sc)
			if !quoted {
				v.spread = true
			}
		case *syntax.ProcSubst: // a /dev/fd path: one word
			*sc.seen++
			p.stmts(x.Stmts, sc)
		case *syntax.ArithmExp:
			p.arith(x.X, sc, x)
			if !quoted {
				v.spread = true
			}
		case *syntax.ExtGlob:
			p.unknowable(sc.layer, sc.text(x), "an extended glob; under zsh a glob qualifier such as *(e:cmd:) runs cmd", "use a plain glob or name the files")
			v.spread = true
		default: // brace expansions (only after syntax.SplitBraces) and newer parts
			v.spread = true
		}
	}
}

// param walks a parameter expansion.
func (p *parser) param(pe *syntax.ParamExp, quoted bool, sc scope, v *wordVal) {
	switch {
	case pe.Flags != nil || pe.NestedParam != nil || len(pe.Modifiers) > 0 || pe.Width || pe.IsSet ||
		pe.Split != syntax.OptUnset || pe.GlobSubst != syntax.OptUnset || pe.RcExpand != syntax.OptUnset:
		p.unknowable(sc.layer, sc.text(pe), "a zsh or mksh parameter form the policy does not judge", "use a plain $NAME")
	case pe.Excl && pe.Names == 0 && !allElements(pe.Index):
		p.unknowable(sc.layer, sc.text(pe), "${!NAME} reads the variable NAME's value names, and a name such as a[$(cmd)] runs cmd",
			"use the variable itself")
	}
	if !allElements(pe.Index) {
		p.arith(pe.Index, sc, pe)
	}
	if pe.Slice != nil {
		p.arith(pe.Slice.Offset, sc, pe)
		p.arith(pe.Slice.Length, sc, pe)
	}
	if pe.Repl != nil {
		p.word(pe.Repl.Orig, sc)
		p.word(pe.Repl.With, sc)
	}
	if pe.Exp != nil {
		switch pe.Exp.Op {
		case syntax.AssignUnset, syntax.AssignUnsetOrNull:
			if pe.Param != nil {
				p.bind(pe.Param.Value, sc.text(pe), sc.layer)
			}
		case syntax.OtherParamOps:
			if pe.Exp.Word != nil && strings.Contains(sc.text(pe.Exp.Word), "P") {
				p.unknowable(sc.layer, sc.text(pe), "${NAME@P} expands the value as a prompt, which can run commands", "use the variable itself")
			}
		}
		if pe.Exp.Word != nil {
			p.word(pe.Exp.Word, sc)
		}
	}
	switch {
	case numericParam(pe):
	case !quoted:
		v.spread = true
	case pe.Param != nil && pe.Param.Value == "@", isElement(pe.Index, "@"), pe.Names == syntax.NamesPrefixWords:
		v.spread = true
	}
}

// numericParam reports whether pe always expands to one number: $? $# $$ $! and ${#…}.
func numericParam(pe *syntax.ParamExp) bool {
	if pe.Param == nil || pe.Excl || pe.Slice != nil || pe.Repl != nil || pe.Exp != nil || pe.Names != 0 {
		return false
	}
	if pe.Length {
		return pe.Index == nil || allElements(pe.Index)
	}
	if pe.Index != nil {
		return false
	}
	switch pe.Param.Value {
	case "?", "#", "$", "!":
		return true
	}
	return false
}

// allElements reports whether a subscript is [@] or [*] (every element, not arithmetic).
func allElements(idx syntax.ArithmExpr) bool { return isElement(idx, "@") || isElement(idx, "*") }

func isElement(idx syntax.ArithmExpr, which string) bool {
	w, ok := idx.(*syntax.Word)
	if !ok || len(w.Parts) != 1 {
		return false
	}
	lit, ok := w.Parts[0].(*syntax.Lit)
	return ok && lit.Value == which
}

// arith records an unknowable when bash's arithmetic over x (in the construct in, which
// the explanation quotes) could run code: bash evaluates
// a variable's value as arithmetic in turn, and a value such as a[$(cmd)] runs cmd. Only
// numbers, operators and $? $# $$ $! ${#…} are known.
func (p *parser) arith(x syntax.ArithmExpr, sc scope, in syntax.Node) {
	if x == nil {
		return
	}
	if !p.arithKnown(x, sc) {
		p.unknowable(sc.layer, sc.text(in), "bash evaluates the variables in this arithmetic as arithmetic too, and a value such as a[$(cmd)] runs cmd",
			"use literal numbers, or compute with a program (seq, expr)")
	}
}

func (p *parser) arithKnown(x syntax.ArithmExpr, sc scope) bool {
	switch x := x.(type) {
	case *syntax.BinaryArithm:
		left := p.arithKnown(x.X, sc)
		return p.arithKnown(x.Y, sc) && left
	case *syntax.UnaryArithm:
		return p.arithKnown(x.X, sc)
	case *syntax.ParenArithm:
		return p.arithKnown(x.X, sc)
	case *syntax.Word:
		known := true
		for _, part := range x.Parts {
			switch pt := part.(type) {
			case *syntax.Lit:
				known = known && arithNumber(pt.Value)
			case *syntax.ParamExp:
				var v wordVal
				p.param(pt, true, sc, &v)
				known = known && numericParam(pt)
			default:
				var v wordVal
				p.parts([]syntax.WordPart{part}, true, sc, &v)
				known = false
			}
		}
		return known
	default:
		return false
	}
}

// arithNumber reports whether s is an arithmetic constant: 42, 0x2a, 052, 16#2a.
func arithNumber(s string) bool {
	s = strings.TrimSpace(s)
	if base, digits, ok := strings.Cut(s, "#"); ok {
		return allDigits(base) && digits != "" && strings.Trim(digits, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_") == ""
	}
	if rest, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
		return rest != "" && strings.Trim(rest, "0123456789abcdef") == ""
	}
	return allDigits(s)
}

// test walks [[ … ]]: -eq and the other arithmetic comparisons evaluate their operands as
// arithmetic, -v and -R evaluate a name's subscript.
func (p *parser) test(x syntax.TestExpr, sc scope) {
	switch x := x.(type) {
	case *syntax.BinaryTest:
		switch x.Op {
		case syntax.TsEql, syntax.TsNeq, syntax.TsLeq, syntax.TsGeq, syntax.TsLss, syntax.TsGtr:
			for _, operand := range []syntax.TestExpr{x.X, x.Y} {
				if w, ok := operand.(*syntax.Word); ok {
					p.arith(w, sc, x)
				} else {
					p.test(operand, sc)
				}
			}
			return
		}
		p.test(x.X, sc)
		p.test(x.Y, sc)
	case *syntax.UnaryTest:
		if x.Op == syntax.TsVarSet || x.Op == syntax.TsRefVar {
			if w, ok := x.X.(*syntax.Word); ok {
				v := p.word(w, sc)
				if !v.known {
					p.unknowable(sc.layer, v.text, "[[ -v ]] evaluates the subscript of the name it is given, and a[$(cmd)] runs cmd", "test a literal name")
				} else {
					p.bind(v.text, v.text, sc.layer)
				}
				return
			}
		}
		p.test(x.X, sc)
	case *syntax.ParenTest:
		p.test(x.X, sc)
	case *syntax.Word:
		p.word(x, sc)
	}
}

// expandsToWords reports whether unquoted source text s holds a glob or a brace expansion,
// which may make several words or none.
func expandsToWords(s string) bool {
	if strings.ContainsAny(s, "*?[") {
		return true
	}
	return strings.Contains(s, "{") && (strings.Contains(s, ",") || strings.Contains(s, ".."))
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
	if lit, ok := word.Parts[0].(*syntax.Lit); ok && len(word.Parts) == 1 && lit.Value == "[" {
		return lit.Value, true // the test command, not a glob
	}
	// zsh (an account's shell may be zsh) expands an unquoted =cmd to cmd's path.
	if lit, ok := word.Parts[0].(*syntax.Lit); ok && len(lit.Value) > 1 && lit.Value[0] == '=' {
		return "", false
	}
	braces := false // whether an unquoted part holds a , or .. that makes { } an expansion
	for _, part := range word.Parts {
		if lit, ok := part.(*syntax.Lit); ok && (strings.Contains(lit.Value, ",") || strings.Contains(lit.Value, "..")) {
			braces = true
		}
	}
	var b strings.Builder
	for _, part := range word.Parts {
		switch p := part.(type) {
		case *syntax.Lit:
			if !unquotedLiteral(&b, p.Value, braces) {
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
// character; a backslash-newline vanishes), refusing characters the shell would expand:
// globs, tildes, and braces when the word holds a , or .. (brace expansion).
func unquotedLiteral(b *strings.Builder, s string, braces bool) bool {
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
		if strings.IndexByte("*?[~$`", c) >= 0 || (braces && (c == '{' || c == '}')) {
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
