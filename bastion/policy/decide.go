package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// Decide walks the ladder for r (see the package comment). Pure: no I/O, no clock.
func (p *Policy) Decide(r Request) Decision {
	d := Decision{Layer: -1}
	step := func(format string, args ...any) { d.Steps = append(d.Steps, fmt.Sprintf(format, args...)) }
	reject := func(code, rule, reason, repair string) Decision {
		d.Outcome, d.Code, d.Rule, d.Reason, d.Repair = Rejected, code, rule, reason, repair
		step("rejected (%s): %s", code, rule)
		return d
	}

	a, ok := p.Actor(r.Actor)
	if !ok {
		return reject(CodeActorUnknown, fmt.Sprintf("actor %q: not configured", r.Actor),
			fmt.Sprintf("the caller is not a configured actor (%q)", r.Actor),
			"ask an operator to configure an actor for this caller (a token's hash, or a local uid or executable)")
	}
	step("actor resolved: %s", a.Name)
	if len(a.Tools) > 0 && !slices.Contains(a.Tools, r.Tool) {
		return reject(CodeNotAllowed, fmt.Sprintf("actor %s: tool %s not allowed", a.Name, r.Tool),
			fmt.Sprintf("actor %s may not use the tool %s", a.Name, r.Tool),
			"use a tool the actor may use, or ask an operator to add it to the actor's tools")
	}
	step("actor %s: tool %s allowed", a.Name, r.Tool)
	switch {
	case r.Tool == ToolSSHExec && r.Host == "":
		return reject(CodeTargetUnknown, "ssh_exec without a host", "ssh_exec names no host", "name the host to run the command on")
	case r.Tool == ToolHTTPRequest && r.Endpoint == "":
		return reject(CodeTargetUnknown, "http_request without an endpoint", "http_request names no endpoint", "name the endpoint to call")
	}
	if r.Host != "" {
		if !matchHost(a.Hosts, r.Host, r.Groups) {
			return reject(CodeNotAllowed, fmt.Sprintf("actor %s: host %s not allowed", a.Name, r.Host),
				fmt.Sprintf("actor %s may not reach host %s", a.Name, r.Host),
				"use a host the actor may reach, or ask an operator to add it to the actor's hosts")
		}
		step("actor %s: host %s allowed", a.Name, r.Host)
	}
	if r.Account != "" {
		grant, ok := p.accountGrant(a.Name, r)
		if !ok {
			return reject(CodeNotAllowed, fmt.Sprintf("actor %s: account %s on host %s not allowed", a.Name, r.Account, r.Host),
				fmt.Sprintf("actor %s may not run commands as %s on host %s: no rule with accounts grants it there%s", a.Name, r.Account, r.Host, p.grantsElsewhere(a.Name, r)),
				fmt.Sprintf("leave account out to run as the host's enrolled account, or ask an operator for a rule such as { decision = \"allow\", actors = [%q], accounts = [%q], hosts = [%q] }", a.Name, r.Account, r.Host))
		}
		step("account %s: granted by %s", r.Account, grant.label)
	}
	if r.Endpoint != "" {
		if !matchName(a.Endpoints, r.Endpoint) {
			return reject(CodeNotAllowed, fmt.Sprintf("actor %s: endpoint %s not allowed", a.Name, r.Endpoint),
				fmt.Sprintf("actor %s may not call endpoint %s", a.Name, r.Endpoint),
				"use an endpoint the actor may call, or ask an operator to add it to the actor's endpoints")
		}
		step("actor %s: endpoint %s allowed", a.Name, r.Endpoint)
	}

	applicable := p.applicable(a.Name, r)
	var s Script
	if r.Tool == ToolSSHExec {
		s = Parse(r.Command)
		d.Layers, d.Writes, d.Reads = s.Layers, s.Writes, s.Reads
		if s.Known() {
			step("command: %d simple command(s), every program known", s.Simple)
		} else {
			step("command: a program is only known when it runs (%s): it matches every command and writes pattern of deny and approve rules, and gets the strictest class any rule could give",
				unknowableNote(s.Unknowable[0]))
		}
		if len(s.Layers) > s.Simple {
			step("layers: %s", describeLayers(s.Layers))
		}
		if len(s.Writes) > 0 {
			step("writes: %s", describeFiles(s.Writes))
		}
	}
	layerNote := func(i int) string {
		if i < 0 || i >= len(s.Layers) || len(s.Layers) <= s.Simple {
			return ""
		}
		return fmt.Sprintf(", layer %d: %s", i+1, clip(s.Layers[i].String(), maxLayerNote))
	}
	// unknowable fills the decision's explanation from the first unknowable program.
	unknowable := func(what string) (reason, repair string) {
		u := s.Unknowable[0]
		d.Layer, d.Word = u.Layer, u.Word
		return "a program of the command is only known when it runs: " + unknowableNote(u) + "; " + what, u.Repair
	}

	var classRule string
	d.Class, classRule, d.Layer = p.class(r, applicable, s)
	step("class: %s (%s%s)", d.Class, classRule, layerNote(d.Layer))

	for _, rule := range applicable {
		if rule.Decision != DecisionDeny {
			continue
		}
		m, matched := s.match(rule)
		if !matched {
			continue
		}
		d.Layer, d.Word = m.layer, m.word
		if !s.Known() && (rule.forCommands() || rule.forWrites()) {
			reason, repair := unknowable(fmt.Sprintf("deny rule %s could match it", rule.label))
			return reject(CodeUnparsable, rule.label, reason, repair)
		}
		switch {
		case m.write:
			step("deny: %s matches the write %s", rule.label, clip(m.word, maxLayerNote))
		case layerNote(m.layer) != "":
			step("deny: %s matches%s", rule.label, layerNote(m.layer))
		}
		if d.Word == "" && m.layer >= 0 && m.layer < len(s.Layers) {
			d.Word = s.Layers[m.layer].Argv[0]
		}
		return reject(CodeDenied, rule.label, "denied by rule "+rule.label+": "+matchNote(m, s, r), denyRepair)
	}
	step("deny rules: none matched")

	if a.Default == DefaultDeny {
		switch r.Tool {
		case ToolSSHExec:
			if !s.Known() {
				reason, repair := unknowable("under default deny every program must be one an allow rule names")
				return reject(CodeUnparsable, fmt.Sprintf("actor %s: default deny", a.Name), reason, repair)
			}
			for i, l := range s.Layers {
				if !allowed(applicable, l) {
					d.Layer, d.Word = i, l.Argv[0]
					step("allow: no allow rule names layer %d: %s", i+1, clip(l.String(), maxLayerNote))
					return reject(CodeNotAllowed, fmt.Sprintf("actor %s: default deny: %s not allowed", a.Name, l.Argv[0]),
						fmt.Sprintf("%s%s is not among the programs actor %s may run (default deny)", l.Argv[0], viaNote(l), a.Name),
						"use a program the allow rules name, or ask an operator to allow this one")
				}
			}
			step("allow: every program is allowed (default deny)")
		case ToolHTTPRequest:
			if !slices.ContainsFunc(applicable, func(rule compiledRule) bool { return rule.Decision == DecisionAllow }) {
				return reject(CodeNotAllowed, fmt.Sprintf("actor %s: default deny: %s %s not allowed", a.Name, strings.ToUpper(r.Method), r.Endpoint),
					fmt.Sprintf("%s on endpoint %s is not among the calls actor %s may make (default deny)", strings.ToUpper(r.Method), r.Endpoint, a.Name),
					"use a call the allow rules name, or ask an operator to allow this one")
			}
			step("allow: the call is allowed (default deny)")
		}
	}

	for _, rule := range applicable {
		if rule.Decision != DecisionApprove {
			continue
		}
		m, matched := s.match(rule)
		if !matched {
			continue
		}
		d.Outcome, d.Rule, d.Layer, d.Word = AwaitingApproval, rule.label, m.layer, m.word
		if d.Word == "" && m.layer >= 0 && m.layer < len(s.Layers) {
			d.Word = s.Layers[m.layer].Argv[0]
		}
		d.Reason = "rule " + rule.label + " requires a person's approval: " + matchNote(m, s, r)
		if !s.Known() && (rule.forCommands() || rule.forWrites()) {
			d.Reason, _ = unknowable(fmt.Sprintf("approve rule %s could match it", rule.label))
		}
		d.Repair = "wait for a person to approve it (follow it with execution_status); a retry returns the same pending execution, never a second request"
		step("approval: %s requires approval%s", rule.label, layerNote(m.layer))
		step("awaiting_approval")
		return d
	}
	step("approval: none required")
	d.Outcome, d.Rule = Authorized, classRule
	d.Reason = fmt.Sprintf("no rule denies it or requires approval; class %s (%s)", d.Class, classRule)
	if !s.Known() {
		d.Reason += "; a program is only known when it runs (" + unknowableNote(s.Unknowable[0]) + "), so the class is the strictest any rule gives"
	}
	step("authorized")
	return d
}

// denyRepair is what a caller can do about a deny rule: not work around it.
const denyRepair = "the policy forbids this here; do not retry it in another form (wrappers, sh -c and substitutions are seen through); ask an operator if it must run"

// unknowableNote is an unknowable in a few words: "eval: eval runs a string as shell code".
func unknowableNote(u Unknowable) string {
	if u.Word == "" {
		return u.Reason
	}
	return clip(u.Word, maxWordNote) + ": " + u.Reason
}

// viaNote says which wrapper runs a layer: " (run by sudo)".
func viaNote(l Layer) string {
	if l.Via == "" {
		return ""
	}
	return " (run by " + l.Via + ")"
}

// ruleMatch is what matched a rule: the layer (or -1), the pattern, and for a writes rule
// the file.
type ruleMatch struct {
	layer   int
	pattern string
	word    string // the file, for a writes rule
	write   bool
}

// match is the restrictive reading used for deny and approve: a rule fires when it has no
// command or writes patterns, when a program is unknowable, when any layer (in any of its
// forms, for any value of its run-time words) matches a command pattern, or any written
// file (whatever directory a relative path is in) a writes pattern.
func (s Script) match(rule compiledRule) (ruleMatch, bool) {
	switch {
	case !rule.forCommands() && !rule.forWrites(), !s.Known():
		return ruleMatch{layer: -1}, true
	case rule.forCommands():
		for i, l := range s.Layers {
			for _, form := range forms(l) {
				for _, pattern := range rule.Commands {
					if matchLayer(pattern, form, true) {
						return ruleMatch{layer: i, pattern: pattern}, true
					}
				}
			}
		}
	default:
		for _, f := range s.Writes {
			for _, pattern := range rule.Writes {
				if matchWrite(pattern, f) {
					return ruleMatch{layer: f.Layer, pattern: pattern, word: f.Path, write: true}, true
				}
			}
		}
	}
	return ruleMatch{layer: -1}, false
}

// matchNote says what matched a rule: the layer or the written file, and the pattern.
func matchNote(m ruleMatch, s Script, r Request) string {
	switch {
	case m.write:
		note := fmt.Sprintf("the command writes %s, which matches %q", clip(m.word, maxWordNote), m.pattern)
		if m.layer >= 0 && m.layer < len(s.Layers) {
			note = fmt.Sprintf("%s writes %s, which matches %q", clip(s.Layers[m.layer].String(), maxLayerNote), clip(m.word, maxWordNote), m.pattern)
		}
		return note
	case m.layer >= 0 && m.layer < len(s.Layers):
		l := s.Layers[m.layer]
		return fmt.Sprintf("%s%s matches %q", clip(l.String(), maxLayerNote), viaNote(l), m.pattern)
	case r.Tool == ToolHTTPRequest:
		return fmt.Sprintf("it applies to %s on endpoint %s", strings.ToUpper(r.Method), r.Endpoint)
	default:
		return "it applies to every " + r.Tool + " call it covers"
	}
}

// inertBuiltins are builtins that run no program and change nothing outside the shell:
// an actor with default deny may run them without an allow rule.
var inertBuiltins = map[string]bool{
	":": true, "true": true, "false": true, "echo": true, "printf": true, "test": true, "[": true, "pwd": true,
	"cd": true, "pushd": true, "popd": true, "dirs": true, "read": true, "set": true, "shift": true, "exit": true,
	"return": true, "break": true, "continue": true, "wait": true, "getopts": true, "unset": true, "export": true,
	"local": true, "declare": true, "typeset": true, "readonly": true, "let": true, "umask": true, "type": true,
	"command": true, "builtin": true, "exec": true,
}

// allowed reports whether an allow rule names layer l for every value of its run-time
// words (as written: ./df is not df), or l is an inert builtin.
func allowed(rules []compiledRule, l Layer) bool {
	if inertBuiltins[l.Argv[0]] {
		return true
	}
	return slices.ContainsFunc(rules, func(rule compiledRule) bool {
		return rule.Decision == DecisionAllow && rule.matchesLayer(l, false)
	})
}

// Steps are journaled as evidence: a layer is shown up to maxLayerNote bytes, the list of
// layers up to maxLayersStep (Decision.Layers has them whole).
const (
	maxLayerNote  = 256
	maxLayersStep = 2048
)

// describeLayers lists layers for the ladder: "1: sudo rm x; 2 (sudo): rm x".
func describeLayers(layers []Layer) string {
	parts := make([]string, len(layers))
	for i, l := range layers {
		via := ""
		if l.Via != "" {
			via = " (" + l.Via + ")"
		}
		parts[i] = fmt.Sprintf("%d%s: %s", i+1, via, clip(l.String(), maxLayerNote))
	}
	return clip(strings.Join(parts, "; "), maxLayersStep)
}

// describeFiles lists the files redirections write: "/tmp/f, ‹$F›".
func describeFiles(files []File) string {
	parts := make([]string, len(files))
	for i, f := range files {
		parts[i] = clip(f.Path, maxLayerNote)
		if f.Unknown {
			parts[i] = "‹" + parts[i] + "›"
		}
	}
	return clip(strings.Join(parts, ", "), maxLayersStep)
}

// clip cuts s to at most n bytes (on a rune boundary), marking the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// applicable returns the rules whose actor, host, tool, endpoint and method conditions
// hold for r — everything but command patterns, which depend on how the command parsed.
func (p *Policy) applicable(actor string, r Request) []compiledRule {
	var out []compiledRule
	for _, rule := range p.rules {
		if rule.forAccounts() {
			continue // an account grant decides only the account (accountGrant)
		}
		if len(rule.Actors) > 0 && !slices.Contains(rule.Actors, actor) {
			continue
		}
		if len(rule.Hosts) > 0 && !matchHost(rule.Hosts, r.Host, r.Groups) {
			continue
		}
		if rule.forCommands() && r.Tool != ToolSSHExec {
			continue
		}
		if rule.forEndpoints() {
			if r.Tool != ToolHTTPRequest || !matchName(rule.Endpoints, r.Endpoint) {
				continue
			}
			if len(rule.Methods) > 0 && !slices.Contains(rule.Methods, strings.ToUpper(r.Method)) {
				continue
			}
		}
		out = append(out, rule)
	}
	return out
}

// forms returns the layers a layer is judged as: itself, and, when its name is a path
// (/bin/rm, ./rm), the same layer under the base name, so a rule about "rm" also sees
// "/bin/rm". Whichever reading is stricter wins.
func forms(l Layer) []Layer {
	if len(l.Argv) == 0 || !strings.Contains(l.Argv[0], "/") {
		return []Layer{l}
	}
	base := l
	base.Argv = slices.Clone(l.Argv)
	base.Argv[0] = path.Base(l.Argv[0])
	return []Layer{l, base}
}

// matchesLayer reports whether one of the rule's patterns matches l: for some value of its
// run-time words (could: deny, approve, and classes stricter than the default), or for
// every value (!could: whether a looser class may apply).
func (rule compiledRule) matchesLayer(l Layer, could bool) bool {
	if !rule.forCommands() {
		return true
	}
	for _, pattern := range rule.Commands {
		if matchLayer(pattern, l, could) {
			return true
		}
	}
	return false
}

func (p *Policy) rank(class string) int {
	if r, ok := p.ranks[class]; ok {
		return r
	}
	return rankCustom
}

// strictest returns the strictest class among the class-setting rules for which match
// holds (ties: the earlier rule), or ok=false when none sets a class.
func (p *Policy) strictest(rules []compiledRule, match func(compiledRule) bool) (class, label string, ok bool) {
	for _, rule := range rules {
		if rule.Class == "" || !match(rule) {
			continue
		}
		if !ok || p.rank(rule.Class) > p.rank(class) {
			class, label, ok = rule.Class, rule.label, true
		}
	}
	return class, label, ok
}

// class returns the action class of r and what decided it.
// layer is the index of the layer that set an ssh_exec command's class, -1 for none.
func (p *Policy) class(r Request, rules []compiledRule, s Script) (class, decidedBy string, layer int) {
	layer = -1
	everyRule := func(compiledRule) bool { return true }
	switch r.Tool {
	case ToolSSHExec:
		const byDefault = "default for ssh_exec"
		if !s.Known() {
			// Any rule could be the one that matches: take the strictest, never looser than
			// the default.
			const why = "a program is only known when it runs"
			class, label, ok := p.strictest(rules, everyRule)
			if !ok || p.rank(class) < rankRemoteCommand {
				return ClassRemoteCommand, byDefault + ", " + why, -1
			}
			return class, label + ", the strictest any rule gives: " + why, -1
		}
		// Each layer (in each form) gets the strictest class among the rules that could match
		// it, and the default unless a rule matches it whatever its run-time words; the
		// command gets the strictest of those.
		commandRules := slices.DeleteFunc(slices.Clone(rules), compiledRule.forWrites)
		class, decidedBy = ClassRemoteCommand, byDefault
		first := true
		for i, l := range s.Layers {
			for _, form := range forms(l) {
				c, label, ok := p.strictest(commandRules, func(rule compiledRule) bool { return rule.matchesLayer(form, true) })
				_, _, certain := p.strictest(commandRules, func(rule compiledRule) bool { return rule.matchesLayer(form, false) })
				if !ok || (!certain && p.rank(c) < rankRemoteCommand) {
					c, label = ClassRemoteCommand, byDefault
				}
				if first || p.rank(c) > p.rank(class) {
					class, decidedBy, layer, first = c, label, i, false
				}
			}
		}
		// A command that writes files is never looser than the default, whatever its
		// programs are; a writes rule's class only makes it stricter.
		if len(s.Writes) > 0 && p.rank(class) < rankRemoteCommand {
			class, decidedBy, layer = ClassRemoteCommand, byDefault+", the command writes files", s.Writes[0].Layer
		}
		for _, rule := range rules {
			if rule.Class == "" || !rule.forWrites() || p.rank(rule.Class) <= p.rank(class) {
				continue
			}
			if m, ok := s.match(rule); ok {
				class, decidedBy, layer = rule.Class, rule.label, m.layer
			}
		}
		return class, decidedBy, layer
	case ToolHTTPRequest:
		if class, label, ok := p.strictest(rules, everyRule); ok {
			return class, label, -1
		}
		if r.EndpointClass == "" {
			return ClassIdempotentWrite, "default for an endpoint without a class", -1
		}
		return r.EndpointClass, "endpoint " + r.Endpoint, -1
	default:
		if class, label, ok := p.strictest(rules, everyRule); ok {
			return class, label, -1
		}
		return "", "no rule sets a class for " + r.Tool, -1
	}
}

// accountGrant is the first rule that lets actor run r's command as r.Account on r's host:
// an account grant (Rule.Accounts) naming the account, for the actor (or all) and the host
// or one of its groups (or all hosts).
func (p *Policy) accountGrant(actor string, r Request) (compiledRule, bool) {
	for _, rule := range p.rules {
		if rule.forAccounts() && slices.Contains(rule.Accounts, r.Account) &&
			(len(rule.Actors) == 0 || slices.Contains(rule.Actors, actor)) &&
			(len(rule.Hosts) == 0 || matchHost(rule.Hosts, r.Host, r.Groups)) {
			return rule, true
		}
	}
	return compiledRule{}, false
}

// grantsElsewhere names the grants of r.Account to actor on other hosts, so a refusal says
// where the account may be used: "" when there are none.
func (p *Policy) grantsElsewhere(actor string, r Request) string {
	var where []string
	for _, rule := range p.rules {
		if rule.forAccounts() && slices.Contains(rule.Accounts, r.Account) && (len(rule.Actors) == 0 || slices.Contains(rule.Actors, actor)) {
			where = append(where, fmt.Sprintf("%s grants it on %s", rule.label, strings.Join(rule.Hosts, ", ")))
		}
	}
	if len(where) == 0 {
		return ""
	}
	return " (" + strings.Join(where, "; ") + ")"
}
