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
	reject := func(code, rule string) Decision {
		d.Outcome, d.Code, d.Rule = Rejected, code, rule
		step("rejected (%s): %s", code, rule)
		return d
	}

	a, ok := p.Actor(r.Actor)
	if !ok {
		return reject(CodeActorUnknown, fmt.Sprintf("actor %q: not configured", r.Actor))
	}
	step("actor resolved: %s", a.Name)
	if len(a.Tools) > 0 && !slices.Contains(a.Tools, r.Tool) {
		return reject(CodeNotAllowed, fmt.Sprintf("actor %s: tool %s not allowed", a.Name, r.Tool))
	}
	step("actor %s: tool %s allowed", a.Name, r.Tool)
	switch {
	case r.Tool == ToolSSHExec && r.Host == "":
		return reject(CodeTargetUnknown, "ssh_exec without a host")
	case r.Tool == ToolHTTPRequest && r.Endpoint == "":
		return reject(CodeTargetUnknown, "http_request without an endpoint")
	}
	if r.Host != "" {
		if !matchHost(a.Hosts, r.Host, r.Groups) {
			return reject(CodeNotAllowed, fmt.Sprintf("actor %s: host %s not allowed", a.Name, r.Host))
		}
		step("actor %s: host %s allowed", a.Name, r.Host)
	}
	if r.Endpoint != "" {
		if !matchName(a.Endpoints, r.Endpoint) {
			return reject(CodeNotAllowed, fmt.Sprintf("actor %s: endpoint %s not allowed", a.Name, r.Endpoint))
		}
		step("actor %s: endpoint %s allowed", a.Name, r.Endpoint)
	}

	applicable := p.applicable(a.Name, r)
	cmd := command{}
	if r.Tool == ToolSSHExec {
		cmd = parseForPolicy(r.Command)
		d.Layers = cmd.layers
		switch {
		case cmd.safe:
			step("command: %d simple command(s) of plain literal words", cmd.simple)
		case cmd.unsure:
			step("command: a wrapper in it could not be unwrapped with certainty: it matches every command pattern of deny and approve rules, and gets the strictest class any rule could give")
		default:
			step("command: not plain literal words (shell syntax, or does not parse): it matches every command pattern of deny and approve rules, and gets the strictest class any rule could give")
		}
		if len(cmd.layers) > cmd.simple {
			step("layers: %s", describeLayers(cmd.layers))
		}
	}
	layerNote := func(i int) string {
		if i < 0 || len(cmd.layers) <= cmd.simple {
			return ""
		}
		return fmt.Sprintf(", layer %d: %s", i+1, clip(cmd.layers[i].String(), maxLayerNote))
	}

	var classRule string
	var classLayer int
	d.Class, classRule, classLayer = p.class(r, applicable, cmd)
	d.Layer = classLayer
	step("class: %s (%s%s)", d.Class, classRule, layerNote(classLayer))

	for _, rule := range applicable {
		if rule.Decision != DecisionDeny {
			continue
		}
		if matched, layer := cmd.anyMatches(rule); matched {
			code := CodeDenied
			if rule.forCommands() && !cmd.safe {
				code = CodeUnparsable
			}
			d.Layer = layer
			if note := layerNote(layer); note != "" {
				step("deny: %s matches%s", rule.label, note)
			}
			return reject(code, rule.label)
		}
	}
	step("deny rules: none matched")
	for _, rule := range applicable {
		if rule.Decision != DecisionApprove {
			continue
		}
		if matched, layer := cmd.anyMatches(rule); matched {
			d.Outcome, d.Rule, d.Layer = AwaitingApproval, rule.label, layer
			step("approval: %s requires approval%s", rule.label, layerNote(layer))
			step("awaiting_approval")
			return d
		}
	}
	step("approval: none required")
	d.Outcome, d.Rule = Authorized, classRule
	step("authorized")
	return d
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

// command is an ssh_exec command as the rules see it: every layer each of its simple
// commands would run (Unwrap). For other tools it is the zero value, which command-pattern
// rules never apply to (applicable filters them out).
type command struct {
	layers []Layer
	simple int  // simple commands in the script
	safe   bool // plain literal words, and every wrapper unwrapped with certainty
	// unsure: the script is plain literal words, but a wrapper in it could not be unwrapped
	// with certainty.
	unsure bool
}

// parseForPolicy parses c and unwraps each simple command; an empty script is not safe
// (there is nothing to match).
func parseForPolicy(c string) command {
	argvs, safe := ParseCommand(c)
	cmd := command{simple: len(argvs), safe: safe && len(argvs) > 0}
	for _, argv := range argvs {
		layers, certain := Unwrap(argv)
		cmd.layers = append(cmd.layers, layers...)
		if cmd.safe && !certain {
			cmd.safe, cmd.unsure = false, true
		}
	}
	return cmd
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

// anyMatches is the restrictive reading used for deny and approve: the rule fires when it
// has no command patterns, when the command is not safe, or when any layer (in any of its
// forms, for any value of its run-time words) matches any of its patterns. layer is the
// index of the first layer that matched; -1 when no layer decided.
func (c command) anyMatches(rule compiledRule) (matched bool, layer int) {
	if !rule.forCommands() || !c.safe {
		return true, -1
	}
	for i, l := range c.layers {
		for _, form := range forms(l) {
			if rule.matchesLayer(form, true) {
				return true, i
			}
		}
	}
	return false, -1
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
func (p *Policy) class(r Request, rules []compiledRule, cmd command) (class, decidedBy string, layer int) {
	layer = -1
	everyRule := func(compiledRule) bool { return true }
	switch r.Tool {
	case ToolSSHExec:
		const byDefault = "default for ssh_exec"
		if !cmd.safe {
			// Any rule could be the one that matches: take the strictest, never looser than
			// the default.
			why := "command not plain literal words"
			if cmd.unsure {
				why = "a wrapper in it could not be unwrapped with certainty"
			}
			class, label, ok := p.strictest(rules, everyRule)
			if !ok || p.rank(class) < rankRemoteCommand {
				return ClassRemoteCommand, byDefault + ", " + why, -1
			}
			return class, label + ", the strictest any rule gives: " + why, -1
		}
		// Each layer (in each form) gets the strictest class among the rules that could match
		// it, and the default unless a rule matches it whatever its run-time words; the
		// command gets the strictest of those.
		class, decidedBy, layer = "", "", -1
		for i, l := range cmd.layers {
			for _, form := range forms(l) {
				c, label, ok := p.strictest(rules, func(rule compiledRule) bool { return rule.matchesLayer(form, true) })
				_, _, certain := p.strictest(rules, func(rule compiledRule) bool { return rule.matchesLayer(form, false) })
				if !ok || (!certain && p.rank(c) < rankRemoteCommand) {
					c, label = ClassRemoteCommand, byDefault
				}
				if class == "" || p.rank(c) > p.rank(class) {
					class, decidedBy, layer = c, label, i
				}
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
