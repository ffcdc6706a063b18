package policy

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// anyRemaining is the final pattern word matching zero or more remaining arguments.
const anyRemaining = "**"

// MatchArgv reports whether argv matches pattern: space-separated words, each a glob over
// one argv word ('*' any run of characters, '?' exactly one character, everything else
// literal), and optionally a final "**" matching any remaining arguments (zero or more).
// Without "**" the argv must have exactly as many words as the pattern. An empty pattern
// or argv matches nothing.
func MatchArgv(pattern string, argv []string) bool {
	return matchLayer(pattern, Layer{Argv: argv}, true)
}

// token is an argv word as matching sees it.
type token struct {
	word string
	kind tokenKind
}

type tokenKind int

const (
	literalToken tokenKind = iota
	unknownToken           // one word, any value
	spreadToken            // any number of words (none included), any values
)

func tokens(l Layer) []token {
	ts := make([]token, 0, len(l.Argv)+1)
	for i, w := range l.Argv {
		kind := literalToken
		switch {
		case l.spread(i):
			kind = spreadToken
		case l.unknown(i):
			kind = unknownToken
		}
		ts = append(ts, token{w, kind})
	}
	if l.Open {
		ts = append(ts, token{kind: spreadToken})
	}
	return ts
}

// matchLayer is MatchArgv for a layer whose words may be known only at run time (Unknown,
// Spread, Open). could: whether some value of those words matches (an unknown word matches
// any pattern word, a spread word any number of them). !could: whether every value does
// (an unknown word matches only a pattern word of '*'s; a spread word only a final "**"
// that covers it).
func matchLayer(pattern string, l Layer, could bool) bool {
	words := strings.Fields(pattern)
	if len(words) == 0 || len(l.Argv) == 0 {
		return false
	}
	rest := words[len(words)-1] == anyRemaining
	if rest {
		words = words[:len(words)-1]
	}
	ts := tokens(l)
	if could {
		return couldMatch(words, rest, ts)
	}
	n := len(words)
	for i, t := range ts {
		if t.kind == spreadToken {
			// Every number of words, none included, must match: only a "**" that starts at or
			// before this word can take them all.
			if !rest || i < n {
				return false
			}
			ts = ts[:i]
			break
		}
	}
	if len(ts) < n || (!rest && len(ts) != n) {
		return false
	}
	for i, w := range words {
		switch ts[i].kind {
		case literalToken:
			if !globMatch(w, ts[i].word) {
				return false
			}
		case unknownToken:
			if strings.Trim(w, "*") != "" {
				return false
			}
		}
	}
	return true
}

// couldMatch reports whether some value of the tokens matches the pattern words (and a
// final "**" when rest): a memoized walk over (pattern word, token) positions.
func couldMatch(words []string, rest bool, ts []token) bool {
	seen := make(map[[2]int]bool)
	var match func(w, t int) bool
	match = func(w, t int) bool {
		key := [2]int{w, t}
		if done, ok := seen[key]; ok {
			return done
		}
		seen[key] = false
		var ok bool
		switch {
		case w == len(words) && (rest || t == len(ts)):
			ok = true
		case w == len(words): // only spread tokens, each making no word, may remain
			ok = ts[t].kind == spreadToken && match(w, t+1)
		case t == len(ts):
			ok = false
		case ts[t].kind == spreadToken:
			ok = match(w, t+1) || match(w+1, t) // no more words from it, or one more
		case ts[t].kind == unknownToken:
			ok = match(w+1, t+1)
		default:
			ok = globMatch(words[w], ts[t].word) && match(w+1, t+1)
		}
		seen[key] = ok
		return ok
	}
	return match(0, 0)
}

// matchWrite reports whether a file a redirection writes could be one pattern matches: a
// glob over the cleaned path ('*' crossing '/'). A path only known at run time could be any
// file; a relative path is under a directory the policy does not know (the account's home,
// or wherever cd went), so it matches when some directory would make it match ("/etc/**"
// matches "passwd").
func matchWrite(pattern string, f File) bool {
	if f.Unknown {
		return true
	}
	p := f.Path
	if strings.HasPrefix(p, "/") {
		return globMatch(pattern, path.Clean(p))
	}
	rel := path.Clean(p)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return true // above the unknown directory: anywhere
	}
	suffix := "/" + rel
	if rel == "." {
		suffix = "/"
	}
	for k := 0; k <= len(pattern); k++ {
		if globMatch(pattern[k:], suffix) {
			return true
		}
	}
	return false
}

// validatePattern reports why pattern can never be what its author meant.
func validatePattern(pattern string) error {
	words := strings.Fields(pattern)
	if len(words) == 0 {
		return fmt.Errorf("empty command pattern")
	}
	for i, w := range words {
		if strings.Contains(w, anyRemaining) && (w != anyRemaining || i != len(words)-1) {
			return fmt.Errorf("command pattern %q: %q is only allowed as the whole last word", pattern, anyRemaining)
		}
		for _, r := range w {
			if r < 0x20 || r == 0x7f {
				return fmt.Errorf("command pattern %q: control character", pattern)
			}
		}
	}
	if w := words[0]; w != anyRemaining && !plainCommandName(strings.NewReplacer("*", "x", "?", "x").Replace(w)) {
		return fmt.Errorf("command pattern %q: a command name is printable ASCII (non-ASCII names never parse as safe)", pattern)
	}
	return nil
}

// globMatch matches s against pattern per character (rune): '*' is any run, '?' one
// character. Iterative with a single backtrack point: linear-ish, never exponential.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		if p < len(pattern) {
			pc, pw := utf8.DecodeRuneInString(pattern[p:])
			sc, sw := utf8.DecodeRuneInString(s[i:])
			switch {
			case pc == '*':
				star, mark = p, i
				p++
				continue
			case pc == '?' || pc == sc:
				p += pw
				i += sw
				continue
			}
		}
		if star < 0 {
			return false
		}
		_, sw := utf8.DecodeRuneInString(s[mark:])
		mark += sw
		p, i = star+1, mark
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// groupPrefix marks a host pattern that matches the host's inventory groups.
const groupPrefix = "group:"

// matchHost reports whether host (or one of its groups, for "group:<glob>") matches any
// pattern; an empty list matches every host.
func matchHost(patterns []string, host string, groups []string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if g, ok := strings.CutPrefix(p, groupPrefix); ok {
			for _, group := range groups {
				if globMatch(g, group) {
					return true
				}
			}
		} else if host != "" && globMatch(p, host) {
			return true
		}
	}
	return false
}

// matchName reports whether name matches any glob; an empty list matches every name.
func matchName(patterns []string, name string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if globMatch(p, name) {
			return true
		}
	}
	return false
}

// validateWritePattern reports why a writes pattern can never be what its author meant.
func validateWritePattern(pattern string) error {
	switch {
	case strings.TrimSpace(pattern) != pattern || pattern == "":
		return fmt.Errorf("writes pattern %q: empty or padded with spaces", pattern)
	case pattern[0] != '/' && pattern[0] != '*':
		return fmt.Errorf("writes pattern %q: an absolute path glob (/etc/**) or one starting with * (*.conf)", pattern)
	}
	for _, r := range pattern {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("writes pattern %q: control character", pattern)
		}
	}
	return nil
}

func validateGlob(kind, p string) error {
	name := strings.TrimPrefix(p, groupPrefix)
	if strings.TrimSpace(name) != name || name == "" {
		return fmt.Errorf("%s pattern %q: empty or padded with spaces", kind, p)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%s pattern %q: control character", kind, p)
		}
	}
	return nil
}
