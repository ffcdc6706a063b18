package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// maxCauseBytes bounds the cause line of a result.
const maxCauseBytes = 512

// cause is why a failed or unknown execution is so: an operation key held by another
// execution (named only if holder, the caller's own, is given), else the latest evidence,
// its first line.
func cause(rec *markers.Record, holder *markers.Record) string {
	switch {
	case rec.OperationTakenBy != "" && holder != nil:
		return fmt.Sprintf("operation key %s already ran as %s (%s); the host did not start this execution", rec.OperationKey, holder.ID, holder.State)
	case rec.OperationTakenBy != "":
		return fmt.Sprintf("operation key %s is taken by another execution on %s; the host did not start this one", rec.OperationKey, rec.Host)
	case len(rec.Evidence) == 0:
		return "no reason was recorded"
	}
	line, _, _ := strings.Cut(rec.Evidence[len(rec.Evidence)-1], "\n")
	if len(line) > maxCauseBytes {
		line = strings.ToValidUTF8(line[:maxCauseBytes], "") + "…"
	}
	return line
}

// nextStep tells the agent what is safe to do, by state. holder is the execution that holds
// rec's operation key, if the host refused rec for it and it is the caller's own.
func nextStep(rec *markers.Record, holder *markers.Record) string {
	switch rec.State {
	case markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running:
		return fmt.Sprintf("Still in progress. Wait with execution_output {execution_id: %q} or execution_status; do not call ssh_exec again for this — a retry joins this execution anyway.", rec.ID)
	case markers.Unknown:
		if rec.ReviewRequired {
			return fmt.Sprintf("The outcome is NOT known, and Postern will not send it again: an operator must review it (postern review %s). Do not run it as a new request unless you have verified it did not take effect; the evidence says why it is unresolved.", rec.ID)
		}
		if rec.Channel == "http" {
			return fmt.Sprintf("The outcome is NOT known: the request may or may not have taken effect at %s. What Postern does depends on the endpoint's class (%s): read_only and idempotent_write are sent again with the same Idempotency-Key, conditional_write is checked first, irreversible is never re-sent and needs an operator's review. Check execution_status {execution_id: %q}; do not send it as a new request unless you verified it did not take effect.", rec.Host, rec.Class, rec.ID)
		}
		return fmt.Sprintf("The outcome is NOT known: the command may or may not have run. Postern keeps asking the host; check execution_status {execution_id: %q} later. Do not re-run it as a new command unless you have verified on the host that it did not take effect.", rec.ID)
	case markers.Completed:
		return "Finished; the outcome above is final."
	case markers.Failed:
		switch {
		case rec.OperationTakenBy != "" && holder != nil:
			return fmt.Sprintf("The operation already ran as %s: do not run it again (the host refuses operation key %s to every other execution). Read its outcome with execution_status {execution_id: %q}.", holder.ID, rec.OperationKey, holder.ID)
		case rec.OperationTakenBy != "":
			return fmt.Sprintf("Do not retry: the host refuses operation key %s to every execution but the one holding it. If the operation must run again, ask an operator.", rec.OperationKey)
		case rec.StartError != "":
			return fmt.Sprintf("It did not run: %s on host %s. It is safe to fix that and call again (with the same idempotency_key, a new attempt linked to this one).", rec.StartError, rec.Host)
		case rec.IdempotencyKey != "":
			return "Nothing ran: it provably did not take effect. Fix the cause, then call again — the same idempotency_key with the same request starts a new attempt linked to this one (previous_attempt); another request needs a new key."
		}
		return "Nothing ran: it provably did not take effect. Fix the cause, then call again."
	case markers.Cancelled:
		return "Cancelled; see the output for how far it got."
	case markers.TimedOut:
		return "Killed at its timeout; see the output for how far it got."
	case markers.Rejected:
		return "Rejected; it was not run. A retry returns this same rejection."
	case markers.AwaitingApproval:
		return "Waiting for an operator's approval; wait with execution_status."
	}
	return ""
}

// progressEvery is how often a waiting call reports progress.
const progressEvery = time.Second

// Status returns an execution's record and last output. For one whose outcome is unknown it
// asks the host again first, waiting up to a third of the default wait for the answer.
func (b *Engine) Status(ctx context.Context, c transport.Caller, id string) (*api.Execution, error) {
	wait := b.cfg.DefaultWait / 3
	rec, err := b.views.own(c, id)
	if err != nil {
		return nil, err
	}
	if d := b.drivers.live(id); d != nil {
		return b.views.await(ctx, d, 0, false, nil), nil
	}
	if rec.State == markers.Unknown {
		if d := b.drivers.start(rec); d != nil {
			return b.views.await(ctx, d, wait, false, nil), nil
		}
	}
	return b.views.stored(rec), nil
}

// Output returns output from the given offsets, waiting up to wait_s for more output or the
// end when there is nothing new yet. Output older than what the bastion keeps is read from
// the host's spool.
func (b *Engine) Output(ctx context.Context, c transport.Caller, a api.OutputArgs) (*api.Execution, error) {
	rec, err := b.views.own(c, a.ExecutionID)
	if err != nil {
		return nil, err
	}
	return b.views.output(ctx, rec, a)
}
