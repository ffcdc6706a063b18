package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// Decide walks the ladder for r (see the package comment). Pure: no I/O, no clock.
func (p *Policy) Decide(r Request) Decision {
	var d Decision
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
		if cmd.safe {
			step("command: %d simple command(s) of plain literal words", len(cmd.argvs))
		} else {
			step("command: not plain literal words (shell syntax, or does not parse): it matches every command pattern of deny and approve rules, and gets the strictest class any rule could give")
		}
	}

	var classRule string
	d.Class, classRule = p.class(r, applicable, cmd)
	step("class: %s (%s)", d.Class, classRule)

	for _, rule := range applicable {
		if rule.Decision == DecisionDeny && cmd.anyMatches(rule) {
			code := CodeDenied
			if rule.forCommands() && !cmd.safe {
				code = CodeUnparsable
			}
			return reject(code, rule.label)
		}
	}
	step("deny rules: none matched")
	for _, rule := range applicable {
		if rule.Decision == DecisionApprove && cmd.anyMatches(rule) {
			d.Outcome, d.Rule = AwaitingApproval, rule.label
			step("approval: %s requires approval", rule.label)
			step("awaiting_approval")
			return d
		}
	}
	step("approval: none required")
	d.Outcome, d.Rule = Authorized, classRule
	step("authorized")
	return d
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

// command is an ssh_exec command as the rules see it. For other tools it is the zero
// value, which command-pattern rules never apply to (applicable filters them out).
type command struct {
	argvs [][]string
	safe  bool
}

// parseForPolicy parses c; an empty script is not safe (there is nothing to match).
func parseForPolicy(c string) command {
	argvs, safe := ParseCommand(c)
	return command{argvs: argvs, safe: safe && len(argvs) > 0}
}

// forms returns the argvs a simple command is judged as: itself, and, when its name is a
// path (/bin/rm, ./rm), the same argv under the base name, so a rule about "rm" also sees
// "/bin/rm". Whichever reading is stricter wins.
func forms(argv []string) [][]string {
	if !strings.Contains(argv[0], "/") {
		return [][]string{argv}
	}
	base := slices.Clone(argv)
	base[0] = path.Base(argv[0])
	return [][]string{argv, base}
}

// anyMatches is the restrictive reading used for deny and approve: the rule fires when it
// has no command patterns, when the command is not safe, or when any simple command (in
// any of its forms) matches any of its patterns.
func (c command) anyMatches(rule compiledRule) bool {
	if !rule.forCommands() || !c.safe {
		return true
	}
	for _, argv := range c.argvs {
		for _, form := range forms(argv) {
			if rule.matchesArgv(form) {
				return true
			}
		}
	}
	return false
}

func (rule compiledRule) matchesArgv(argv []string) bool {
	if !rule.forCommands() {
		return true
	}
	for _, pattern := range rule.Commands {
		if MatchArgv(pattern, argv) {
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
func (p *Policy) class(r Request, rules []compiledRule, cmd command) (class, decidedBy string) {
	everyRule := func(compiledRule) bool { return true }
	switch r.Tool {
	case ToolSSHExec:
		const byDefault = "default for ssh_exec"
		if !cmd.safe {
			// Any rule could be the one that matches: take the strictest, never looser than
			// the default.
			class, label, ok := p.strictest(rules, everyRule)
			if !ok || p.rank(class) < rankRemoteCommand {
				return ClassRemoteCommand, byDefault + ", command not plain literal words"
			}
			return class, label + ", the strictest any rule gives: command not plain literal words"
		}
		// Each simple command (in each form) gets the strictest class among the rules that
		// match it, or the default; the script gets the strictest of those.
		class, decidedBy = "", ""
		for _, argv := range cmd.argvs {
			for _, form := range forms(argv) {
				c, label, ok := p.strictest(rules, func(rule compiledRule) bool { return rule.matchesArgv(form) })
				if !ok {
					c, label = ClassRemoteCommand, byDefault
				}
				if class == "" || p.rank(c) > p.rank(class) {
					class, decidedBy = c, label
				}
			}
		}
		return class, decidedBy
	case ToolHTTPRequest:
		if class, label, ok := p.strictest(rules, everyRule); ok {
			return class, label
		}
		if r.EndpointClass == "" {
			return ClassIdempotentWrite, "default for an endpoint without a class"
		}
		return r.EndpointClass, "endpoint " + r.Endpoint
	default:
		if class, label, ok := p.strictest(rules, everyRule); ok {
			return class, label
		}
		return "", "no rule sets a class for " + r.Tool
	}
}
