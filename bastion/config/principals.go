package config

import (
	"fmt"

	"github.com/postern-dev/postern/bastion/policy"
)

// Principal is one party behind several actors: one user's HTTP token and local agents (as
// `postern up` configures them), or an agent that holds several tokens. Its actors share one
// key space: an idempotency_key belongs to the principal whose actor first used it, so the
// same key with the same request from any of its actors is the same execution (run once,
// readable by each of them), and the key used by another principal is refused without
// naming that principal's execution. An actor in no principal is a principal of its own.
type Principal struct {
	Name string `toml:"name"`
	// Actors are configured actor names ([[actors]], or "self": the implicit local actor of
	// the bastion's own user). An actor belongs to at most one principal.
	Actors []string `toml:"actors"`
}

// PrincipalOf returns the name of the principal actor belongs to ("", false when none).
func (c Config) PrincipalOf(actor string) (string, bool) {
	for _, p := range c.Principals {
		for _, a := range p.Actors {
			if a == actor {
				return p.Name, true
			}
		}
	}
	return "", false
}

// validatePrincipals checks the principals against the compiled actors of pol.
func (c Config) validatePrincipals(pol *policy.Policy) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: "+format, args...)) }
	names := map[string]bool{}
	member := map[string]string{} // actor → its principal
	for i, p := range c.Principals {
		at := fmt.Sprintf("principals[%d] (%s)", i, p.Name)
		switch {
		case !ValidName(p.Name):
			bad("principals[%d]: name %q: want 1-64 of [A-Za-z0-9_.-]", i, p.Name)
		case names[p.Name]:
			bad("%s: duplicate name", at)
		}
		names[p.Name] = true
		if len(p.Actors) == 0 {
			bad("%s: list its actors (actors = [\"…\"])", at)
		}
		for _, a := range p.Actors {
			if _, ok := pol.Actor(a); !ok {
				bad("%s: unknown actor %q (name one of [[actors]], or %q for the bastion's own user)", at, a, SelfActor)
				continue
			}
			if other, dup := member[a]; dup {
				bad("%s: actor %q is already in principal %s; an actor belongs to one principal", at, a, other)
				continue
			}
			member[a] = p.Name
		}
	}
	return errs
}
