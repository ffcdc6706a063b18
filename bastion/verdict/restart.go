package verdict

import (
	"fmt"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/markers"
)

// AtStart says what starting the bastion (without --hold) will do with an execution the
// journal shows between acceptance and an outcome: what `postern status` tells an operator
// deciding whether to restart after a crash. level is the guarantee of the execution's host
// (ignored for HTTP; "" when not known, read as the hostagent). It follows the rules the drivers apply (ReconcileByLevel,
// UnknownHandlingFor), in words; "" for an execution a start leaves alone.
func AtStart(rec *markers.Record, level fleet.Guarantee) string {
	if rec.IsFleetRun() {
		switch rec.State {
		case markers.Accepted, markers.Authorized:
			return fmt.Sprintf("starts its rollout on %d hosts: it was accepted but started none", len(rec.Fleet.Hosts))
		case markers.Dispatched, markers.Running:
			return fmt.Sprintf("goes on with its rollout on %d hosts: a host with an execution gets that execution reconciled (never a second one), a host without one is started under the same brakes (max_concurrency %s, max_errors %s)",
				len(rec.Fleet.Hosts), rec.Fleet.MaxConcurrency, rec.Fleet.MaxErrors)
		}
		return ""
	}
	switch rec.State {
	case markers.Accepted, markers.Authorized:
		return fmt.Sprintf("sends it to %s: it was accepted but never left the bastion", rec.Host)
	case markers.Dispatched, markers.Running, markers.Unknown:
	default:
		return ""
	}
	if rec.ReviewRequired {
		return "sends nothing: it waits for your review (postern review " + rec.ID + ")"
	}
	if rec.Channel == "http" {
		switch UnknownHandlingFor(rec.Channel, rec.Class) {
		case ResendSameKey:
			return fmt.Sprintf("sends the same request to %s again with the same Idempotency-Key (%s: the endpoint answers a repeat without acting twice)", rec.Host, rec.Class)
		case CheckFirst:
			return fmt.Sprintf("asks %s's status check whether it took effect, and sends it again only if it did not (%s)", rec.Host, rec.Class)
		}
		return fmt.Sprintf("sends nothing: a %s request whose answer was lost is never sent again; its outcome becomes unknown and waits for your review", rec.Class)
	}
	switch level {
	case fleet.GuaranteeNone:
		return fmt.Sprintf("sends nothing: %s keeps no marker (guarantee level none), so its outcome becomes unknown and waits for your review", rec.Host)
	case fleet.GuaranteeMarkerScript:
		return fmt.Sprintf("asks the marker script on %s: ended → records how; still running → watches it; no marker (it never started) → sends it again under the same id; anything else → your review", rec.Host)
	}
	return fmt.Sprintf("asks the hostagent on %s for its marker: running → re-attaches; ended → records how; no marker (it never started) → sends it again under the same id, which the host never starts twice; anything else → your review", rec.Host)
}
