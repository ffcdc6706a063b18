package intent

import (
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// Retention and the matching rule (docs/design.md, "Retention"): the journal's retention
// pass removes an execution only once no call could match it any more (Removable), so that
// removing it changes no answer; and a call whose lookup finds the tombstone of a removed
// execution is answered by RuleRemoved, honestly, even when a clock or a configuration
// changed in between.

// Removed: the call would have joined (replayed) an execution that retention removed — its
// result is gone —, and its class does not allow running it again blindly: refuse, nothing
// is dispatched. Only a clock or configuration change makes this happen (Removable keeps
// whatever a call could still join).
const Removed Match = "execution_removed"

// RemovalMargin is added to a class's windows before an execution may be removed: it covers
// the clock skew between bastion replicas (one may run the pass while another matches a
// call). At most 10 minutes, less for classes with a short retention.
func RemovalMargin(retention time.Duration) time.Duration {
	return min(10*time.Minute, retention/10)
}

// Removable reports whether retention may remove rec at now: only an execution that ended
// (never one in flight, awaiting approval or awaiting review), and only once no call could
// join it — its class's attach window has passed since it was accepted and its class's
// retention since it ended (which bounds a keyed call's match), each plus RemovalMargin.
func Removable(rec *markers.Record, now time.Time, class config.Class) bool {
	margin := RemovalMargin(class.Retention)
	switch {
	case !markers.JournalGraph.Terminal(rec.State) || rec.ReviewRequired:
		return false
	case now.Sub(rec.CreatedAt) <= class.AttachWindow+margin:
		return false
	case now.Sub(FinishedAt(rec)) <= class.Retention+margin:
		return false
	}
	return true
}

// Repeatable reports whether a class's action may run again when the execution a call
// would have replayed was removed: reading (read_only) or writing a named state
// (idempotent_write) a second time has the effect of once. Every other class — conditional
// and irreversible writes, remote commands, classes a configuration adds — may not.
func Repeatable(class string) bool {
	return class == config.ClassReadOnly || class == config.ClassIdempotentWrite
}

// RuleRemoved decides a call whose lookup found no execution but the tombstone of one that
// retention removed: removed is that execution as its tombstone keeps it (markers.Tombstone),
// class its class. The answer is Rule's as if the execution were still there — a new
// execution once its window or retention has passed (what Removable makes of every removal
// while clocks and configuration hold), key reused for another request, a new attempt of a
// failed one — except where Rule would join it: its result is gone, so a repeatable class
// gets a new execution and any other the Removed refusal.
func RuleRemoved(removed *markers.Record, in Facts, now time.Time, class config.Class) Match {
	m := Rule(removed, in, now, class)
	switch {
	case !m.Joins():
		return m
	case Repeatable(class.Name):
		return NewExecution
	}
	return Removed
}
