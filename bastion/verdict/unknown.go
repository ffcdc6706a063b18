package verdict

import (
	"fmt"
	"net/http"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// OnUnknown is what a class does when an execution's outcome is unknown.
type OnUnknown string

const (
	// ResendSameKey: send the same request again under the same execution id
	// (Idempotency-Key); the target dedups it.
	ResendSameKey OnUnknown = "resend_same_key"
	// CheckFirst: ask the target whether it took effect (the endpoint's status check);
	// send again only if it did not.
	CheckFirst OnUnknown = "check_first"
	// AskHost: ask the host's marker (ReconcileOn): absent → re-dispatch the same execution
	// id, present → attach, else review.
	AskHost OnUnknown = "ask_host"
	// StopForReview: never send again; an operator reviews it.
	StopForReview OnUnknown = "review"
)

// unknownHandling is the "on unknown outcome" column of the class table in docs/design.md ("Action classes").
var unknownHandling = map[string]OnUnknown{
	config.ClassReadOnly:         ResendSameKey,
	config.ClassIdempotentWrite:  ResendSameKey,
	config.ClassConditionalWrite: CheckFirst,
	config.ClassIrreversible:     StopForReview,
	config.ClassRemoteCommand:    AskHost,
}

// UnknownHandlingFor is how an execution of class on channel settles an unknown outcome. An
// SSH execution always has a host marker to ask, whatever its class: the marker proves
// whether it started, and the host never starts an execution id twice. An HTTP execution
// follows its class; a class without a rule (a configured one, or remote_command on an
// endpoint) stops for review.
func UnknownHandlingFor(channel, class string) OnUnknown {
	if channel != "http" {
		return AskHost
	}
	if h, ok := unknownHandling[class]; ok && h != AskHost {
		return h
	}
	return StopForReview
}

// HTTPDo is what the HTTP driver does with an unknown execution.
type HTTPDo string

const (
	// Resend: send the same request again with the same Idempotency-Key.
	Resend HTTPDo = "resend"
	// StatusCheck: ask the endpoint's status check first, then decide again with its answer.
	StatusCheck HTTPDo = "status_check"
	// Stay: journal the verdict (unknown, or what the status check proved); nothing is sent.
	Stay HTTPDo = "stay"
)

// StatusAnswer is an endpoint status check's answer: an HTTP status, or the error that
// prevented one.
type StatusAnswer struct {
	Status int
	Err    error
}

// HTTPAction is DecideUnknownHTTP's decision.
type HTTPAction struct {
	Do      HTTPDo
	Verdict Verdict
}

// DecideUnknownHTTP decides what to do with an HTTP execution whose outcome is unknown, by
// its class (docs/design.md, "Action classes"). configured: its endpoint still exists. check is
// the status check's answer, nil before it was asked.
func DecideUnknownHTTP(rec *markers.Record, configured bool, check *StatusAnswer) HTTPAction {
	unknown := func(review bool, note string) HTTPAction {
		return HTTPAction{Do: Stay, Verdict: Verdict{To: markers.Unknown, Review: review, Note: note}}
	}
	if !configured {
		return unknown(true, "endpoint "+rec.Host+" is no longer configured, so it cannot be asked or sent again — review required")
	}
	again := HTTPAction{Do: Resend, Verdict: Verdict{To: markers.Unknown, Note: "outcome unknown; " + rec.Class + ": sending the same request again with the same Idempotency-Key"}}
	switch UnknownHandlingFor("http", rec.Class) {
	case ResendSameKey:
		return again
	case CheckFirst:
		switch {
		case check == nil:
			return HTTPAction{Do: StatusCheck, Verdict: Verdict{To: markers.Unknown, Note: "outcome unknown; conditional_write: asking the endpoint's status check"}}
		case check.Err != nil:
			return unknown(false, fmt.Sprintf("status check failed (%v); the outcome stays unknown", check.Err))
		case check.Status/100 == 2:
			return HTTPAction{Do: Stay, Verdict: Verdict{To: markers.Completed, Note: fmt.Sprintf("status check answered %d: it took effect", check.Status)}}
		case check.Status == http.StatusNotFound:
			again.Verdict.Note = "status check answered 404: it did not take effect; sending it again with the same Idempotency-Key"
			return again
		}
		return unknown(true, fmt.Sprintf("status check answered %d, which proves neither outcome; it is not sent again — review required", check.Status))
	}
	return unknown(true, "outcome unknown and its class is "+rec.Class+": it is not sent again — review required")
}
