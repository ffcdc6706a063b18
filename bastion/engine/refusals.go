package engine

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
)

// What an agent reads when a call is turned away, built here and rendered by api.Refusal
// (one format for every refusal): what decided, why, and what the agent can do about it.
// None of it names an operator command: an agent cannot run one, and one that tries only
// wastes its turn.

// Codes of refusals that have no api constant of their own: policy's outcomes that are not
// rejections, and why a host was sent nothing.
const (
	codeApprovalRequired = "approval_required"
	codeHostUnreachable  = "host_unreachable"
	codeHostKeyRefused   = "host_refuses_key"
	codeHostKeyMismatch  = "host_key_mismatch"
	codeHostCertRefused  = "host_cert_refused"
)

// policyRefusal is what an agent reads about a policy decision that did not authorize its
// call: rejected, or held for approval. It is journaled as the execution's evidence (and the
// transition's note), so a retry and a restart show the same text.
//
// The policy says why and what to do in its own words (Decision.Reason, which names the rule
// or permission that decided, and Repair); the reason and repair by code stand in for a
// decision that has none.
func policyRefusal(dec policy.Decision) api.Refusal {
	if dec.Reason != "" {
		code := dec.Code
		if dec.Outcome == policy.AwaitingApproval {
			code = codeApprovalRequired
		}
		return api.Refusal{Code: code, Reason: dec.Reason, Repair: dec.Repair}
	}
	if dec.Outcome == policy.AwaitingApproval {
		return api.Refusal{Code: codeApprovalRequired, Rule: dec.Rule,
			Reason: "policy requires a person's approval before this runs"}
	}
	r := api.Refusal{Code: dec.Code, Rule: dec.Rule}
	switch dec.Code {
	case policy.CodeDenied:
		r.Reason = "a deny rule matches this call"
		r.Repair = "change the command (or request) so that the rule does not match; the policy itself is the operator's"
	case policy.CodeUnparsable:
		r.Reason = "the policy cannot tell what this command runs, and a deny rule could match it"
		r.Repair = "write the command as plain words that name the program it runs"
	case policy.CodeNotAllowed:
		r.Reason = "this actor may not use it"
		r.Repair = "use only the hosts hosts_list shows and the tools and endpoints you were given"
	case policy.CodeActorUnknown:
		r.Reason = "this caller is not one of the bastion's configured actors"
		r.Repair = "an operator must configure an actor for it; no call of this caller can run until then"
	case policy.CodeTargetUnknown:
		r.Reason = "the call names no host or endpoint"
		r.Repair = "name one"
	default:
		r.Reason = "policy rejected the call"
	}
	return r
}

// maxHostsNamed bounds the hosts an unknown_host refusal lists; hosts_list shows them all.
const maxHostsNamed = 20

// unknownHost refuses a call for a host the inventory does not have, naming the hosts the
// caller may use instead (allowed, sorted).
func unknownHost(name string, allowed []string) api.Refusal {
	r := api.Refusal{Code: api.CodeUnknownHost, Reason: fmt.Sprintf("there is no host %q", name)}
	switch {
	case len(allowed) == 0:
		r.Repair = "no host is enrolled that you may use"
	case len(allowed) <= maxHostsNamed:
		r.Repair = "use one of your hosts: " + strings.Join(allowed, ", ")
	default:
		r.Repair = fmt.Sprintf("use one of your hosts: %s and %d more (hosts_list shows them all)",
			strings.Join(allowed[:maxHostsNamed], ", "), len(allowed)-maxHostsNamed)
	}
	r.Next = "Nothing was journaled"
	return r
}

// hostProblem is why a host was sent nothing (or could not be asked about an execution),
// from the error of connecting to it: the host refuses the bastion's key, presents another
// host key than the one enrolled, or cannot be reached. An unreachable host reads the same
// on the first call and on every call while the pool waits to dial it again: the wait is
// the pool's business, not the agent's.
func hostProblem(host string, err error) api.Refusal {
	switch {
	case errors.Is(err, fleet.ErrKeyRefused):
		return api.Refusal{Code: codeHostKeyRefused, Reason: fmt.Sprintf("host %s refuses the bastion's SSH key", host),
			Repair: "the bastion's key must be authorized on the host; calling again will not help until it is"}
	case errors.Is(err, fleet.ErrHostCertRefused):
		return api.Refusal{Code: codeHostCertRefused, Reason: fmt.Sprintf("host %s presents a host certificate or key the bastion does not accept (another name, expired, an untrusted CA, or revoked), so Postern sends it nothing", host),
			Repair: "an operator must fix the host's certificate or the bastion's trust in its CA; calling again will not help until then"}
	case errors.Is(err, fleet.ErrHostKeyMismatch):
		return api.Refusal{Code: codeHostKeyMismatch, Reason: fmt.Sprintf("host %s presents another host key than the one enrolled, so Postern sends it nothing", host),
			Repair: "it is another machine, a reinstalled one, or someone in the middle; an operator must check it before anything runs there"}
	}
	return api.Refusal{Code: codeHostUnreachable, Reason: fmt.Sprintf("host %s cannot be reached (%s)", host, reachDetail(err)),
		Repair: "call again later; if it stays unreachable, the host or its network is down"}
}

// reachDetail is the network's own words for why a dial failed ("connection refused", "i/o
// timeout"), without the addresses and wrapping of the layers in between; a failure that is
// not a network error (a handshake, the protocol hello) keeps its message.
func reachDetail(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		msg := op.Err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		return msg
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "its name does not resolve: " + dns.Err
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, "bastion: "); i >= 0 {
		msg = msg[i+len("bastion: "):]
	}
	return msg
}

// keyReused refuses a keyed call whose key the caller's principal used for another request
// (its own execution, so it is named).
func keyReused(key, holder string) api.Refusal {
	return api.Refusal{Code: api.CodeIdempotencyKeyReused,
		Reason: fmt.Sprintf("idempotency_key %q was used by %s for a different request", key, holder),
		Repair: "use a new key for a new request; the same key with the same request returns " + holder,
		Next:   "Nothing was dispatched"}
}

// keyHeld refuses a keyed call whose key another principal holds. It names no execution:
// keys are matched across principals only so that one key never runs twice, and nobody
// learns another principal's executions through them.
func keyHeld(key string) api.Refusal {
	return api.Refusal{Code: api.CodeIdempotencyKeyHeld,
		Reason: fmt.Sprintf("idempotency_key %q is held by an execution of another principal", key),
		Repair: "use another key (a random one, or one that names your task and run)",
		Next:   "Nothing was dispatched"}
}
