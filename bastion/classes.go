package bastion

import (
	"strings"
	"time"
)

// Action classes (DESIGN.md, "Action classes"). Each has its own attach window — how long a
// retry of the same intent joins the prior execution — and its own retention.
const (
	ClassReadOnly         = "read_only"
	ClassIdempotentWrite  = "idempotent_write"
	ClassConditionalWrite = "conditional_write"
	ClassIrreversible     = "irreversible"
	ClassRemoteCommand    = "remote_command"
)

const day = 24 * time.Hour

var builtinClasses = []ClassConfig{
	{Name: ClassReadOnly, AttachWindow: 5 * time.Minute, Retention: 7 * day},
	{Name: ClassIdempotentWrite, AttachWindow: time.Hour, Retention: 30 * day},
	{Name: ClassConditionalWrite, AttachWindow: time.Hour, Retention: 30 * day},
	{Name: ClassIrreversible, AttachWindow: 7 * day, Retention: 90 * day},
	{Name: ClassRemoteCommand, AttachWindow: day, Retention: 30 * day},
}

// classes resolves a command on a host to its action class.
type classes struct {
	byName map[string]ClassConfig
	rules  []RuleConfig
}

func newClasses(cfg Config) *classes {
	c := &classes{byName: map[string]ClassConfig{}, rules: cfg.Rules}
	for _, cl := range builtinClasses {
		c.byName[cl.Name] = cl
	}
	for _, cl := range cfg.Classes {
		base := c.byName[cl.Name]
		if cl.AttachWindow == 0 {
			cl.AttachWindow = base.AttachWindow
		}
		if cl.Retention == 0 {
			cl.Retention = base.Retention
		}
		if cl.AttachWindow == 0 {
			cl.AttachWindow = day
		}
		if cl.Retention == 0 {
			cl.Retention = 30 * day
		}
		c.byName[cl.Name] = cl
	}
	return c
}

// get returns a class by name; unknown names (records from an older config) get the
// remote_command windows.
func (c *classes) get(name string) ClassConfig {
	if cl, ok := c.byName[name]; ok {
		return cl
	}
	cl := c.byName[ClassRemoteCommand]
	cl.Name = name
	return cl
}

// retention is the per-class retention the journal's GC applies.
func (c *classes) retention() map[string]time.Duration {
	m := make(map[string]time.Duration, len(c.byName))
	for name, cl := range c.byName {
		m[name] = cl.Retention
	}
	return m
}

// shellSyntax are the characters that let one command string run more than one program
// or rewrite itself; a pattern like "df *" must not class "df; rm -rf /" as read_only.
const shellSyntax = ";&|`$()<>\n\r\\\"'*?[]{}~#!"

// forCommand returns the class of the first rule that matches host and command, else
// remote_command. A command containing shell syntax only matches rules whose class is
// irreversible: the strictest class is the only safe reading of what it may do. (Policy
// with argv parsing refines this.)
func (c *classes) forCommand(host string, groups []string, command string) ClassConfig {
	complex := strings.ContainsAny(command, shellSyntax)
	for _, r := range c.rules {
		if !matchesAny(r.Hosts, host, groups) || !matchesAny(r.Commands, command, nil) {
			continue
		}
		if complex && r.Class != ClassIrreversible && len(r.Commands) > 0 {
			continue
		}
		return c.get(r.Class)
	}
	return c.get(ClassRemoteCommand)
}

// matchesAny reports whether any pattern matches s or one of also (an empty pattern list
// matches everything).
func matchesAny(patterns []string, s string, also []string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if globMatch(p, s) {
			return true
		}
		for _, a := range also {
			if globMatch(p, a) {
				return true
			}
		}
	}
	return false
}

// globMatch matches s against pattern, where * is any run of characters (including none)
// and every other character is literal. Iterative with one backtrack point, so it is linear
// in practice and never exponential.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
