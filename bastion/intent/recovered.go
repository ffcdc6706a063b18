package intent

import (
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// Recovered: the call's fingerprint names an execution rebuilt from its host's marker after
// the journal lost it (postern recover --from-hosts; markers.Record.RecoveredFrom), which
// waits for an operator's review: the call is answered with it as journaled, and nothing is
// sent.
const Recovered Match = "recovered"

// RuleRecovered is the matching rule for a call whose own lookup found nothing but whose
// fingerprint names prior, an execution rebuilt from a host's marker. The journal lost the
// actor, scope and idempotency key of the call that started it; the marker kept the
// fingerprint, which covers the actor, the scope and the action — so a retry of that call
// finds it by the fingerprint alone, and joins it as it would have joined the original,
// within the class's attach window counted from the recovery:
//
//   - awaiting review (unknown): Recovered, never a second run;
//   - reviewed "completed", its result never delivered: Replay;
//   - reviewed "not-run" (failed), or completed and delivered: a new execution.
func RuleRecovered(prior *markers.Record, now time.Time, class config.Class) Match {
	switch {
	case now.Sub(prior.CreatedAt) > class.AttachWindow:
		return NewExecution
	case prior.State == markers.Unknown:
		return Recovered
	case prior.State == markers.Completed && prior.ResultDeliveredAt == nil:
		return Replay
	}
	return NewExecution
}
