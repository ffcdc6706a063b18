package oauth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Rule maps the tokens it matches to a configured actor. Every criterion it sets must hold;
// it must set at least one.
type Rule struct {
	// Actor is the configured remote actor the token's calls are made as.
	Actor string `toml:"actor"`
	// Subjects: the token's sub is one of these.
	Subjects []string `toml:"subjects"`
	// Clients: the token's client_id (or azp) is one of these — a service account.
	Clients []string `toml:"clients"`
	// Groups: the token's groups claim has one of these.
	Groups []string `toml:"groups"`
	// Scopes: the token has every one of these scopes.
	Scopes []string `toml:"scopes"`
}

// Rules are the mapping from tokens to actors, and the scopes' tools.
type Rules struct {
	// Actors are tried in order; the first that matches decides.
	Actors []Rule
	// ScopeTools, when set, narrows what a token may call to the tools its scopes list
	// (the union): a tool no scope of the token lists is refused with 403
	// insufficient_scope, whatever the actor may do. Empty: scopes narrow nothing.
	ScopeTools map[string][]string
}

// Mapping is the actor a token maps to.
type Mapping struct {
	Actor string
	// Rule is the index of the rule that matched.
	Rule int
	// Tools are the tools the token's scopes allow (sorted); nil when scopes narrow nothing.
	Tools []string
}

// AllowsTool reports whether the token may call tool (before the actor's own tools and the
// policy decide).
func (m Mapping) AllowsTool(tool string) bool {
	return m.Tools == nil || slices.Contains(m.Tools, tool)
}

// check reports rules that can never be right: no actor, or no criterion.
func (r Rules) check() error {
	var errs []error
	for i, rule := range r.Actors {
		if rule.Actor == "" {
			errs = append(errs, fmt.Errorf("oauth.actors[%d]: actor is required", i))
		}
		if len(rule.Subjects)+len(rule.Clients)+len(rule.Groups)+len(rule.Scopes) == 0 {
			errs = append(errs, fmt.Errorf("oauth.actors[%d] (%s): set subjects, clients, groups or scopes: a rule that matches every token of the issuer is not allowed", i, rule.Actor))
		}
	}
	for scope, tools := range r.ScopeTools {
		if scope == "" || strings.ContainsFunc(scope, func(c rune) bool { return c <= ' ' || c == '"' || c == '\\' || c == 0x7f }) {
			errs = append(errs, fmt.Errorf("oauth.scope_tools: scope %q must be printable ASCII without spaces, quotes or backslashes", scope))
		}
		if len(tools) == 0 {
			errs = append(errs, fmt.Errorf("oauth.scope_tools.%s: list the tools it allows", scope))
		}
	}
	return errors.Join(errs...)
}

// Map returns the actor id maps to: the first rule that matches. A token that matches none
// maps to nobody (ErrNoActor): deny by default.
func (r Rules) Map(id Identity) (Mapping, error) {
	for i, rule := range r.Actors {
		if rule.matches(id) {
			return Mapping{Actor: rule.Actor, Rule: i, Tools: r.toolsOf(id.Scopes)}, nil
		}
	}
	return Mapping{}, fmt.Errorf("%w: no [[oauth.actors]] rule matches subject %q (client %q); an operator maps it with an [[oauth.actors]] rule naming this subject, its client, a group or a scope, then postern reload", ErrNoActor, short(id.Subject), short(id.ClientID))
}

func (rule Rule) matches(id Identity) bool {
	if len(rule.Subjects) > 0 && !slices.Contains(rule.Subjects, id.Subject) {
		return false
	}
	if len(rule.Clients) > 0 && (id.ClientID == "" || !slices.Contains(rule.Clients, id.ClientID)) {
		return false
	}
	if len(rule.Groups) > 0 && !slices.ContainsFunc(id.Groups, func(g string) bool { return slices.Contains(rule.Groups, g) }) {
		return false
	}
	for _, s := range rule.Scopes {
		if !slices.Contains(id.Scopes, s) {
			return false
		}
	}
	return len(rule.Subjects)+len(rule.Clients)+len(rule.Groups)+len(rule.Scopes) > 0
}

// toolsOf is the union of the tools scopes allow, sorted; nil when ScopeTools is empty.
func (r Rules) toolsOf(scopes []string) []string {
	if len(r.ScopeTools) == 0 {
		return nil
	}
	tools := []string{}
	for _, s := range scopes {
		tools = append(tools, r.ScopeTools[s]...)
	}
	slices.Sort(tools)
	return slices.Compact(tools)
}

// ScopesFor are the scopes that would allow tool (sorted): what a 403 insufficient_scope
// names for the client to ask.
func (r Rules) ScopesFor(tool string) []string {
	var scopes []string
	for s, tools := range r.ScopeTools {
		if slices.Contains(tools, tool) {
			scopes = append(scopes, s)
		}
	}
	slices.Sort(scopes)
	return scopes
}

// Scopes are the scopes the rules name (sorted): the metadata's scopes_supported.
func (r Rules) Scopes() []string {
	var scopes []string
	for s := range r.ScopeTools {
		scopes = append(scopes, s)
	}
	for _, rule := range r.Actors {
		scopes = append(scopes, rule.Scopes...)
	}
	slices.Sort(scopes)
	return slices.Compact(scopes)
}
