package policy

import (
	"slices"
	"strconv"
	"strings"
)

// Layer is one command a command line would run: a simple command as written (depth 0),
// or what a wrapper it names runs (sudo rm → rm at depth 1). Some words may be known only
// at run time: the shell's expansions ($F, *.log, "$(cat list)"), find's {}, xargs -I's
// replacement (Unknown; Spread when they may be several words or none), and the words
// xargs reads from its input or find -exec … {} + appends (Open).
type Layer struct {
	// Argv are the words: literal values, or the text as written for words known only at
	// run time.
	Argv []string `json:"argv"`
	// Unknown are the indexes into Argv of words whose value is only known at run time.
	Unknown []int `json:"unknown,omitempty"`
	// Spread are the indexes (among Unknown) of words that may become several words or none
	// (unquoted expansions, globs).
	Spread []int `json:"spread,omitempty"`
	// Open: zero or more words only known at run time follow Argv.
	Open bool `json:"open,omitempty"`
	// Via is the wrapper (and how) that runs this layer: "sudo", "sh -c", "find -exec"; ""
	// for a command as written.
	Via string `json:"via,omitempty"`
	// Depth is 0 for a command as written and n for one run through n wrappers.
	Depth int `json:"depth"`

	shell   bool // the shell runs it, so a builtin of that name is the builtin (not via sudo, env, …)
	checked bool // the parser checked its builtin forms (declare, let) on the syntax tree
}

// unknown and spread look an index up in Unknown and Spread, which are kept sorted.
func (l Layer) unknown(i int) bool { _, ok := slices.BinarySearch(l.Unknown, i); return ok }
func (l Layer) spread(i int) bool  { _, ok := slices.BinarySearch(l.Spread, i); return ok }

// mark makes word i known only at run time (and possibly several words), keeping the
// indexes sorted.
func (l *Layer) mark(i int, spread bool) {
	if at, ok := slices.BinarySearch(l.Unknown, i); !ok {
		l.Unknown = slices.Insert(l.Unknown, at, i)
	}
	if at, ok := slices.BinarySearch(l.Spread, i); spread && !ok {
		l.Spread = slices.Insert(l.Spread, at, i)
	}
}

// spreadBefore reports the first word before index i that may be several words or none,
// which would move what the wrapper finds at i.
func (l Layer) spreadBefore(i int) (int, bool) {
	for _, s := range l.Spread {
		if s < i {
			return s, true
		}
	}
	return 0, false
}

// String shows the layer as a shell would read it: words quoted where needed, a word known
// only at run time as ‹text›, and "…" for open trailing words.
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
	return l.slice(i, len(l.Argv), l.Open, via)
}

// slice is the layer of l's words [from, to), run through via.
func (l Layer) slice(from, to int, open bool, via string) Layer {
	inner := Layer{Argv: l.Argv[from:to], Open: open, Via: via, Depth: l.Depth + 1}
	for _, u := range l.Unknown {
		if u >= from && u < to {
			inner.Unknown = append(inner.Unknown, u-from)
		}
	}
	for _, s := range l.Spread {
		if s >= from && s < to {
			inner.Spread = append(inner.Spread, s-from)
		}
	}
	return inner
}

// pick is the layer of l's words at idx (in order), run through via.
func (l Layer) pick(idx []int, via string) Layer {
	inner := Layer{Open: l.Open, Via: via, Depth: l.Depth + 1}
	for _, i := range idx {
		if l.unknown(i) {
			inner.Unknown = append(inner.Unknown, len(inner.Argv))
		}
		if l.spread(i) {
			inner.Spread = append(inner.Spread, len(inner.Argv))
		}
		inner.Argv = append(inner.Argv, l.Argv[i])
	}
	return inner
}

// shellString is the layer of a wrapper that hands a string to a shell: sh -c STRING,
// STRING being the word at i of l (known only at run time when that word is).
func (l Layer) shellString(shell string, i int, via string) Layer {
	inner := Layer{Argv: []string{shell, "-c", l.Argv[i]}, Via: via, Depth: l.Depth + 1}
	if l.unknown(i) {
		inner.Unknown = []int{2}
	}
	return inner
}
