package policy

import (
	"fmt"
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

// matchLayer is MatchArgv for a layer whose words may be known only at run time (Unknown,
// Open). could: whether some value of those words matches (an unknown word matches any
// glob; open words may fill the pattern's remaining words). !could: whether every value
// does (an unknown word matches only a glob of '*'s; open words only a final "**").
func matchLayer(pattern string, l Layer, could bool) bool {
	words := strings.Fields(pattern)
	argv := l.Argv
	if len(words) == 0 || len(argv) == 0 {
		return false
	}
	rest := words[len(words)-1] == anyRemaining
	if rest {
		words = words[:len(words)-1]
	}
	n := len(words)
	switch {
	case l.Open && !could:
		// Every number of appended words, zero included, must match.
		if !rest || len(argv) < n {
			return false
		}
	case l.Open: // could
		if !rest && len(argv) > n {
			return false
		}
	case rest:
		if len(argv) < n {
			return false
		}
	default:
		if len(argv) != n {
			return false
		}
	}
	for i, w := range words {
		if i >= len(argv) {
			break // open words fill the rest (could only: checked above)
		}
		switch {
		case !l.unknown(i):
			if !globMatch(w, argv[i]) {
				return false
			}
		case !could && strings.Trim(w, "*") != "":
			return false
		}
	}
	return true
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
