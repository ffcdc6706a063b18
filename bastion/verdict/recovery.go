package verdict

import (
	"fmt"
	"time"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// Recovery from the hosts (docs/operations.md, "Recovering from the hosts"): after the
// journal was lost, or restored from a backup older than what the hosts have run since,
// `postern recover --from-hosts` asks every host for its markers and decides, execution by
// execution, what the journal must learn. Nothing it decides is ever sent again: what the
// hosts ran, or may have run, becomes an unknown outcome that waits for an operator's review.

// RecoveryDo is what recovery does with one execution.
type RecoveryDo string

const (
	// RecoverJournal journals an execution the journal does not know, rebuilt from its host's
	// marker: unknown, review required, never driven (markers.Record.RecoveredFrom).
	RecoverJournal RecoveryDo = "journal"
	// RecoverReview moves the journal's record to unknown, review required (along
	// RecoveryPath), with the host's evidence.
	RecoverReview RecoveryDo = "review"
	// RecoverLeave journals nothing: the journal knows as much as the host, or a start of the
	// bastion settles it safely (the note says how).
	RecoverLeave RecoveryDo = "leave"
)

// Recovery is the decision for one execution, and why.
type Recovery struct {
	Do   RecoveryDo
	Note string
}

// RecoverOn decides what the journal must learn of one execution: rec is the journal's
// record of it (nil: the journal does not know it), m its host's marker (nil: the host has
// none, or keeps none), level its host's guarantee ("" for an HTTP execution), host the
// host's (or endpoint's) name. removed: the journal does not know it but holds executions
// accepted before and after it (RemovedSpan), so it knew it and its retention pass removed
// it — an ended execution past its class's retention, not something that ran unseen.
func RecoverOn(rec *markers.Record, m *hostproto.Marker, level fleet.Guarantee, host string, removed bool) Recovery {
	ran := m != nil && m.State != hostproto.MarkerNotStarted && m.State != hostproto.MarkerStartFailed
	seen := ""
	if m != nil {
		seen = fmt.Sprintf("host %s's marker says %s", host, markerText(m))
	}
	switch {
	case rec == nil && !ran:
		return Recovery{RecoverLeave, seen + ": it never ran, and the journal does not know it; nothing to journal"}
	case rec == nil && removed:
		return Recovery{RecoverLeave, seen + ", and the journal does not know it, but it holds executions accepted before and after it: it knew this one, and its retention removed it once it had ended and its class's retention had passed; nothing to journal"}
	case rec == nil:
		return Recovery{RecoverJournal, seen + ", and the journal does not know it: it ran after the journal's last record (the journal was lost or restored). Journaled unknown, review required, with the host's evidence; it is never sent again"}
	case markers.JournalGraph.Terminal(rec.State):
		return Recovery{RecoverLeave, fmt.Sprintf("the journal knows how it ended (%s)", rec.State)}
	case rec.State == markers.Unknown && rec.ReviewRequired:
		return Recovery{RecoverLeave, "it waits for your review already"}
	case ran:
		return Recovery{RecoverReview, fmt.Sprintf("%s, and the journal last recorded it %s: it ran since (the journal was lost or restored). Unknown, review required, with the host's evidence", seen, rec.State)}
	case m != nil:
		return Recovery{RecoverLeave, seen + "; " + atStartOr(rec, level, "a start leaves it as it is")}
	case rec.Channel == "http":
		switch rec.State {
		case markers.Accepted, markers.Authorized:
			return Recovery{RecoverReview, fmt.Sprintf("the journal last recorded it %s, never sent; %s keeps no record Postern can ask, so it may have been sent after that, and a start would send it: unknown, review required", rec.State, host)}
		case markers.AwaitingApproval:
			return Recovery{RecoverLeave, "it awaits approval; if it was approved after the journal's last record of it, it may have been sent already: check " + host + " before you approve it"}
		}
		return Recovery{RecoverLeave, atStartOr(rec, level, "")}
	case level == fleet.GuaranteeNone:
		if rec.State == markers.AwaitingApproval {
			return Recovery{RecoverLeave, fmt.Sprintf("it awaits approval; %s keeps no markers, so if it was approved after the journal's last record of it, it may have run already: check %s before you approve it", host, host)}
		}
		note := fmt.Sprintf("%s keeps no markers (guarantee level none): whether it ran after the journal last recorded it %s cannot be known", host, rec.State)
		if rec.State == markers.Accepted || rec.State == markers.Authorized {
			note += ", and a start would send it"
		}
		return Recovery{RecoverReview, note + ". Unknown, review required"}
	case rec.State == markers.AwaitingApproval:
		return Recovery{RecoverLeave, fmt.Sprintf("it awaits approval, and %s has no marker of it: it has not run", host)}
	}
	return Recovery{RecoverLeave, fmt.Sprintf("%s has no marker of it: it has not run there; %s", host, atStartOr(rec, level, ""))}
}

// atStartOr is what a start of the bastion does with rec, in words (AtStart), or otherwise.
func atStartOr(rec *markers.Record, level fleet.Guarantee, otherwise string) string {
	if s := AtStart(rec, level); s != "" {
		return "a start " + s
	}
	return otherwise
}

// RecoveryPath is the journal path from state from to unknown that RecoverReview takes: the
// states a host's marker proves were passed (it was authorized and sent, or it could not have
// run); nil for an unknown record (the review flag and the evidence are an update).
func RecoveryPath(from markers.State) []markers.State {
	switch from {
	case markers.Accepted, markers.AwaitingApproval:
		return []markers.State{markers.Authorized, markers.Dispatched, markers.Unknown}
	case markers.Authorized:
		return []markers.State{markers.Dispatched, markers.Unknown}
	case markers.Dispatched, markers.Running:
		return []markers.State{markers.Unknown}
	}
	return nil
}

// markerText is a marker's state and, once it ended, how.
func markerText(m *hostproto.Marker) string {
	switch {
	case m.State == hostproto.MarkerExited:
		return "exited, " + OutcomeNote(m)
	case m.StartError != "":
		return fmt.Sprintf("%s (%s)", m.State, m.StartError)
	}
	return string(m.State)
}

// RemovedSkew is how much later than an execution the journal's newest must have been
// accepted for RemovedSpan to count it as known: ids are made before the synced write that
// accepts them, so under concurrency a slightly older id may be written after a newer one
// (and be missing from a backup that has the newer).
const RemovedSkew = 10 * time.Minute

// RemovedSpan reports whether the journal, whose oldest and newest executions were accepted
// at oldest and newest, knew an execution accepted at at: every execution is journaled
// before it is sent, so one accepted between them that it does not hold was removed by
// retention. One older than its oldest may predate the journal (a lost journal started
// again empty), one newer than its newest ran after its last record: neither counts.
func RemovedSpan(at, oldest, newest time.Time) bool {
	return !oldest.IsZero() && !at.Before(oldest) && at.Before(newest.Add(-RemovedSkew))
}
