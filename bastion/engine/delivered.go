package engine

import (
	"context"
	"errors"

	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// deliveredNote is the note of the update event that records a delivery.
const deliveredNote = "result delivered"

// Delivered records that the result of execution id reached the caller's transport, so a
// later identical call is a new intent. Only completed executions are marked.
//
// The update event names the call that was handed the result, when ctx carries it (the
// transport's caller and the request's JSON-RPC id). It is written without an fsync
// (records.delivered says why that is safe).
func (b *Engine) Delivered(ctx context.Context, id string) error {
	return b.records.delivered(ctx, id, deliveryCall(ctx, "delivered"))
}

// NotDelivered journals why the response to the call of ctx, which carried the result of
// execution id, is not its delivery (delivery.Journal): an update event naming the call,
// written only while the result counts as not delivered, so an operator reading the
// execution sees why (records.notDelivered).
func (b *Engine) NotDelivered(ctx context.Context, id, why string) error {
	return b.records.notDelivered(ctx, id, deliveryCall(ctx, "not delivered"), why)
}

// deliveryCall is the call the request of ctx carried (nil outside a transport), as a
// delivery event names it.
func deliveryCall(ctx context.Context, match string) *markers.Call {
	c, ok := transport.CallerFromContext(ctx)
	if !ok {
		return nil
	}
	return &markers.Call{Transport: transportOf(c), RequestID: delivery.RequestID(ctx), Run: intent.Scope(c, ""), Match: match}
}

// RevokeDelivery revokes the delivery of id's result unless a newer execution of the same
// intent was accepted since: the delivery then already ended the matching window and a
// retry joins the newer one, so revoking would only rewrite what made it new. It holds the
// intake lock of the intent, so no new execution is accepted meanwhile.
func (b *Engine) RevokeDelivery(ctx context.Context, id string) (bool, error) {
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
