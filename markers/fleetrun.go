package markers

import "slices"

// A fleet run (docs/fleet.md) is one journal record of the JournalGraph, named fr_…, with
// one ordinary execution per host. It lives in the journal as an execution does — the same
// states, the same matching indexes (fingerprint, idempotency key), the same events and
// chain — so both journal backends, the verifier, retention and `journal copy` keep it
// without knowing what it is. What makes it a fleet run is its id and its Rollout
// (Record.Fleet); each of its executions names it in Record.FleetRun.

// Rollout is what a fleet run carries out, fixed when it is accepted except CancelledBy.
type Rollout struct {
	// Targets are the run's targets as the call gave them: host names, group:NAME, labels.
	Targets []string `json:"targets"`
	// Hosts are the hosts the targets selected when the run was accepted, in the order the
	// run starts them.
	Hosts []RolloutHost `json:"hosts"`
	// MaxConcurrency and MaxErrors are the brakes as the call wrote them: a count ("20") or
	// a percentage of the hosts ("25%").
	MaxConcurrency string `json:"max_concurrency"`
	MaxErrors      string `json:"max_errors"`
	// CancelledBy is who asked the run to stop ("" while nobody did): from then on no host
	// is started, and the running ones are cancelled.
	CancelledBy string `json:"cancelled_by,omitempty"`
}

// RolloutHost is one host of a fleet run as the run was accepted: the identity its
// execution gets, and the policy's decision for it.
type RolloutHost struct {
	Name string `json:"name"`
	// Target and Account are the host as the inventory had it then (the target names the
	// pinned host key): the host's execution is found again by them, whatever the inventory
	// says later.
	Target  string `json:"target"`
	Account string `json:"account"`
	// Decision, Rule and Class are the policy's for this host: authorized, awaiting_approval
	// (the run's approval stands for it) or rejected.
	Decision string `json:"decision"`
	Rule     string `json:"rule,omitempty"`
	Class    string `json:"class,omitempty"`
}

func (r *Rollout) clone() *Rollout {
	c := *r
	c.Targets = slices.Clone(r.Targets)
	c.Hosts = slices.Clone(r.Hosts)
	return &c
}

// IsFleetRun reports whether r is a fleet run (not one of its executions).
func (r *Record) IsFleetRun() bool { return r.Fleet != nil }
