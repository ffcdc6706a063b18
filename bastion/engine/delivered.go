package engine

import (
	"context"
	"errors"
	"sync"

	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// deliveredNote is the note of the update event that records a delivery.
const deliveredNote = "result delivered"

// deliveryJournal is the engine as the delivery tracker journals through it
// (delivery.Journal): what was handed to whom, what was not, and what a cancel revoked.
type deliveryJournal struct{ *Engine }

// DeliveryJournal is what the transports' delivery tracker writes through.
func (b *Engine) DeliveryJournal() delivery.Journal { return deliveryJournal{b} }

// Delivered records that the result of execution id reached the caller's transport, so a
// later identical call is a new intent. Only completed executions are marked.
//
// The update event names the call that was handed the result, when ctx carries it (the
// transport's caller and the request's JSON-RPC id). It is written without an fsync
// (records.delivered says why that is safe).
func (b deliveryJournal) Delivered(ctx context.Context, id string) error {
	return b.records.delivered(ctx, id, deliveryCall(ctx, "delivered"))
}

// NotDelivered journals why the response to the call of ctx, which carried the result of
// execution id, is not its delivery (delivery.Journal): an update event naming the call,
// written only while the result counts as not delivered, so an operator reading the
// execution sees why (records.notDelivered).
func (b deliveryJournal) NotDelivered(ctx context.Context, id, why string) error {
	return b.records.notDelivered(ctx, id, deliveryCall(ctx, "not delivered"), why)
}

// deliveryCall is the call the request of ctx carried (nil outside a transport), as a
// delivery event names it.
func deliveryCall(ctx context.Context, match string) *markers.Call {
	c, ok := transport.CallerFromContext(ctx)
	if !ok {
		return nil
	}
	return &markers.Call{Transport: transportOf(c), RequestID: delivery.RequestID(ctx), Run: intent.Scope(c, ""), Subject: c.Subject, Match: match}
}

// RevokeDelivery revokes the delivery of id's result unless a newer execution of the same
// intent was accepted since: the delivery then already ended the matching window and a
// retry joins the newer one, so revoking would only rewrite what made it new. It holds the
// intake lock of the intent, so no new execution is accepted meanwhile.
func (b deliveryJournal) RevokeDelivery(ctx context.Context, id string) (bool, error) {
	rec, err := b.journal.Get(id)
	if err != nil {
		return false, err
	}
	if rec.IdempotencyKey == "" {
		defer b.intake.locks.Lock(intent.LockKey(rec.Actor, rec.IntentScope, rec.Fingerprint))()
		latest, err := b.journal.FindByFingerprint(rec.Actor, rec.IntentScope, rec.Fingerprint)
		if err != nil && !errors.Is(err, markers.ErrNotFound) {
			return false, err
		}
		if latest != nil && latest.ID != id {
			b.log.Info("result delivery stays: a newer execution of the same intent was accepted since", "execution_id", id, "newer", latest.ID)
			return false, nil
		}
	}
	return b.records.deliveryRevoked(ctx, id)
}

// Delivering notes that a response carrying id's result is on its way (delivery.Journal):
// until done, a call that would replay that result waits for the delivery's verdict
// (intake.deliveryInDoubt).
func (b deliveryJournal) Delivering(id string) (done func()) { return b.judging.add(id) }

// judgments are the executions whose delivery the transports are judging now: a response
// carrying the result was (or is being) written, and the kernel's evidence is not in yet.
type judgments struct {
	mu sync.Mutex // guards byID
	// byID counts the responses being judged per execution and holds a channel closed when
	// the last of them is.
	byID map[string]*judgment
}

type judgment struct {
	n    int
	done chan struct{}
}

func (j *judgments) add(id string) func() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.byID == nil {
		j.byID = map[string]*judgment{}
	}
	jd := j.byID[id]
	if jd == nil {
		jd = &judgment{done: make(chan struct{})}
		j.byID[id] = jd
	}
	jd.n++
	return sync.OnceFunc(func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		if jd.n--; jd.n == 0 {
			close(jd.done)
			delete(j.byID, id)
		}
	})
}

// pending returns a channel closed once no response carrying id's result is being judged,
// or nil when none is.
func (j *judgments) pending(id string) <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if jd := j.byID[id]; jd != nil {
		return jd.done
	}
	return nil
}
