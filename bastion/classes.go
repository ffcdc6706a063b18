package bastion

import (
	"fmt"
	"net/http"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// onUnknown is what a class does when an execution's outcome is unknown.
type onUnknown string

const (
	// resendSameKey: send the same request again under the same execution id
	// (Idempotency-Key); the target dedups it.
	resendSameKey onUnknown = "resend_same_key"
	// checkFirst: ask the target whether it took effect (the endpoint's status check);
	// send again only if it did not.
	checkFirst onUnknown = "check_first"
	// askHost: ask the host's marker (reconcileOn): absent → re-dispatch the same execution
	// id, present → attach, else review.
	askHost onUnknown = "ask_host"
	// stopForReview: never send again; an operator reviews it.
	stopForReview onUnknown = "review"
)

// unknownHandling is the "on unknown outcome" column of DESIGN.md's class table.
var unknownHandling = map[string]onUnknown{
	config.ClassReadOnly:         resendSameKey,
	config.ClassIdempotentWrite:  resendSameKey,
	config.ClassConditionalWrite: checkFirst,
	config.ClassIrreversible:     stopForReview,
	config.ClassRemoteCommand:    askHost,
}

// unknownHandlingFor is how an execution of class on channel settles an unknown outcome. An
// SSH execution always has a host marker to ask, whatever its class: the marker proves
// whether it started, and the host never starts an execution id twice. An HTTP execution
// follows its class; a class without a rule (a configured one, or remote_command on an
// endpoint) stops for review.
func unknownHandlingFor(channel, class string) onUnknown {
	if channel != "http" {
		return askHost
	}
	if h, ok := unknownHandling[class]; ok && h != askHost {
		return h
	}
	return stopForReview
}

// httpDo is what the HTTP driver does with an unknown execution.
type httpDo string

const (
	// resend: send the same request again with the same Idempotency-Key.
	resend httpDo = "resend"
	// statusCheck: ask the endpoint's status check first, then decide again with its answer.
	statusCheck httpDo = "status_check"
	// stay: journal the verdict (unknown, or what the status check proved); nothing is sent.
	stay httpDo = "stay"
)

// statusAnswer is an endpoint status check's answer: an HTTP status, or the error that
// prevented one.
type statusAnswer struct {
	Status int
	Err    error
}

// httpAction is decideUnknownHTTP's decision.
type httpAction struct {
	Do      httpDo
	Verdict verdict
}

// decideUnknownHTTP decides what to do with an HTTP execution whose outcome is unknown, by
// its class (DESIGN.md, "Action classes"). configured: its endpoint still exists. check is
// the status check's answer, nil before it was asked.
func decideUnknownHTTP(rec *markers.Record, configured bool, check *statusAnswer) httpAction {
	unknown := func(review bool, note string) httpAction {
		return httpAction{Do: stay, Verdict: verdict{To: markers.Unknown, Review: review, Note: note}}
	}
	if !configured {
		return unknown(true, "endpoint "+rec.Host+" is no longer configured, so it cannot be asked or sent again — review required")
	}
	again := httpAction{Do: resend, Verdict: verdict{To: markers.Unknown, Note: "outcome unknown; " + rec.Class + ": sending the same request again with the same Idempotency-Key"}}
	switch unknownHandlingFor("http", rec.Class) {
	case resendSameKey:
		return again
	case checkFirst:
		switch {
		case check == nil:
			return httpAction{Do: statusCheck, Verdict: verdict{To: markers.Unknown, Note: "outcome unknown; conditional_write: asking the endpoint's status check"}}
		case check.Err != nil:
			return unknown(false, fmt.Sprintf("status check failed (%v); the outcome stays unknown", check.Err))
		case check.Status/100 == 2:
			return httpAction{Do: stay, Verdict: verdict{To: markers.Completed, Note: fmt.Sprintf("status check answered %d: it took effect", check.Status)}}
		case check.Status == http.StatusNotFound:
			again.Verdict.Note = "status check answered 404: it did not take effect; sending it again with the same Idempotency-Key"
			return again
		}
		return unknown(true, fmt.Sprintf("status check answered %d, which proves neither outcome; it is not sent again — review required", check.Status))
	}
	return unknown(true, "outcome unknown and its class is "+rec.Class+": it is not sent again — review required")
}
