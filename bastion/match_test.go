package bastion

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"

	"github.com/postern-dev/postern/markers"
)

// TestMatchRule mirrors DESIGN.md's matching rule, its idempotency_key paragraph (keyed
// retries included) and the recover_or_attach table, row by row.
const day = 24 * time.Hour

func TestMatchRule(t *testing.T) {
	now := time.Date(2026, 7, 22, 12, 0, 0, 0, time.UTC)
	class := config.Class{Name: "test", AttachWindow: time.Hour, Retention: 30 * day}
	const (
		actor, scope, fp, key = "token:deploy-bot", "run:5f8097", "hmac-sha256:aa", "deploy-2026-07-22"
	)
	// prior describes the execution the lookup found: its state, how long ago it was
	// accepted and ended, and how it differs from the call.
	type prior struct {
		state     markers.State
		age       time.Duration // since accepted
		ended     time.Duration // since it reached its state (terminal states); default age
		delivered bool
		actor     string // default: the caller
		scope     string // default: the call's scope
		fp        string // default: the call's fingerprint
		key       string // default: the call's key
	}
	type call struct {
		keyed       bool
		sameRequest bool
	}
	unkeyed, keyedSame, keyedOther := call{}, call{keyed: true, sameRequest: true}, call{keyed: true}
	tests := []struct {
		name  string
		prior *prior
		call  call
		want  matchOutcome
	}{
		// The matching rule, no idempotency_key.
		{name: "no prior execution", call: unkeyed, want: matchNew},
		{name: "accepted, not dispatched: continue", prior: &prior{state: markers.Accepted, age: time.Minute}, call: unkeyed, want: matchContinue},
		{name: "authorized, not dispatched: continue", prior: &prior{state: markers.Authorized, age: time.Minute}, call: unkeyed, want: matchContinue},
		{name: "awaiting_approval: the pending record", prior: &prior{state: markers.AwaitingApproval, age: time.Minute}, call: unkeyed, want: matchPending},
		{name: "rejected: the same rejection", prior: &prior{state: markers.Rejected, age: time.Minute}, call: unkeyed, want: matchRejection},
		{name: "dispatched: attach", prior: &prior{state: markers.Dispatched, age: time.Minute}, call: unkeyed, want: matchAttach},
		{name: "running: attach", prior: &prior{state: markers.Running, age: time.Minute}, call: unkeyed, want: matchAttach},
		{name: "unknown: reconcile first", prior: &prior{state: markers.Unknown, age: time.Minute}, call: unkeyed, want: matchReconcile},
		{name: "completed, result not delivered: replay", prior: &prior{state: markers.Completed, age: time.Minute}, call: unkeyed, want: matchReplay},
		{name: "completed and delivered: a new intent", prior: &prior{state: markers.Completed, age: time.Minute, delivered: true}, call: unkeyed, want: matchNew},
		{name: "failed (no effect): a new intent", prior: &prior{state: markers.Failed, age: time.Minute}, call: unkeyed, want: matchNew},
		{name: "cancelled: a new intent", prior: &prior{state: markers.Cancelled, age: time.Minute}, call: unkeyed, want: matchNew},
		{name: "timed_out: a new intent", prior: &prior{state: markers.TimedOut, age: time.Minute}, call: unkeyed, want: matchNew},
		{name: "running, at the end of the attach window", prior: &prior{state: markers.Running, age: time.Hour}, call: unkeyed, want: matchAttach},
		{name: "running, past the attach window", prior: &prior{state: markers.Running, age: time.Hour + time.Second}, call: unkeyed, want: matchNew},
		{name: "unknown, past the attach window", prior: &prior{state: markers.Unknown, age: 2 * time.Hour}, call: unkeyed, want: matchNew},
		{name: "completed not delivered, past the attach window", prior: &prior{state: markers.Completed, age: 2 * time.Hour}, call: unkeyed, want: matchNew},
		{name: "another actor", prior: &prior{state: markers.Running, age: time.Minute, actor: "token:other"}, call: unkeyed, want: matchNew},
		{name: "another intent scope", prior: &prior{state: markers.Running, age: time.Minute, scope: "run:other"}, call: unkeyed, want: matchNew},
		{name: "another fingerprint", prior: &prior{state: markers.Running, age: time.Minute, fp: "hmac-sha256:bb"}, call: unkeyed, want: matchNew},
		{name: "the prior carried a key, the call none", prior: &prior{state: markers.Running, age: time.Minute, key: "k"}, call: unkeyed, want: matchNew},

		// An explicit idempotency_key: matched by (actor, key) across scopes, for the
		// class's retention.
		{name: "keyed, no prior execution", call: keyedSame, want: matchNew},
		{name: "keyed, same request, completed and delivered: replay", prior: &prior{state: markers.Completed, age: time.Minute, delivered: true}, call: keyedSame, want: matchReplay},
		{name: "keyed, same request, completed not delivered: replay", prior: &prior{state: markers.Completed, age: time.Minute}, call: keyedSame, want: matchReplay},
		{name: "keyed, same request, cancelled: replay", prior: &prior{state: markers.Cancelled, age: time.Minute}, call: keyedSame, want: matchReplay},
		{name: "keyed, same request, timed_out: replay", prior: &prior{state: markers.TimedOut, age: time.Minute}, call: keyedSame, want: matchReplay},
		{name: "keyed, same request, accepted: continue", prior: &prior{state: markers.Accepted, age: time.Minute}, call: keyedSame, want: matchContinue},
		{name: "keyed, same request, awaiting_approval: pending", prior: &prior{state: markers.AwaitingApproval, age: time.Minute}, call: keyedSame, want: matchPending},
		{name: "keyed, same request, rejected: the same rejection", prior: &prior{state: markers.Rejected, age: time.Minute}, call: keyedSame, want: matchRejection},
		{name: "keyed, same request, running: attach", prior: &prior{state: markers.Running, age: time.Minute}, call: keyedSame, want: matchAttach},
		{name: "keyed, same request, unknown: reconcile", prior: &prior{state: markers.Unknown, age: time.Minute}, call: keyedSame, want: matchReconcile},
		{name: "keyed, same request, from another scope: still the prior", prior: &prior{state: markers.Completed, age: time.Minute, scope: "run:other", fp: "hmac-sha256:cc"}, call: keyedSame, want: matchReplay},
		{name: "keyed, same request, past the attach window: still the prior", prior: &prior{state: markers.Completed, age: 2 * day, delivered: true}, call: keyedSame, want: matchReplay},
		{name: "keyed, same request, failed (no effect): a new attempt", prior: &prior{state: markers.Failed, age: time.Minute}, call: keyedSame, want: matchNewAttempt},
		{name: "keyed, same request, failed long ago: a new attempt", prior: &prior{state: markers.Failed, age: 10 * day}, call: keyedSame, want: matchNewAttempt},
		{name: "keyed, another request, failed: key reused", prior: &prior{state: markers.Failed, age: time.Minute}, call: keyedOther, want: matchKeyReused},
		{name: "keyed, another request, completed: key reused", prior: &prior{state: markers.Completed, age: time.Minute, delivered: true}, call: keyedOther, want: matchKeyReused},
		{name: "keyed, another request, running: key reused", prior: &prior{state: markers.Running, age: time.Minute}, call: keyedOther, want: matchKeyReused},
		{name: "keyed, another request, awaiting_approval: key reused", prior: &prior{state: markers.AwaitingApproval, age: time.Minute}, call: keyedOther, want: matchKeyReused},
		{name: "keyed, ended past the class's retention: the key is free", prior: &prior{state: markers.Completed, age: 31 * day, ended: 30*day + time.Second, delivered: true}, call: keyedOther, want: matchNew},
		{name: "keyed, ended within the retention though accepted before it", prior: &prior{state: markers.Completed, age: 31 * day, ended: 29 * day, delivered: true}, call: keyedSame, want: matchReplay},
		{name: "keyed, still running past the retention: attach", prior: &prior{state: markers.Running, age: 31 * day}, call: keyedSame, want: matchAttach},
		{name: "keyed, unknown past the retention: reconcile", prior: &prior{state: markers.Unknown, age: 31 * day}, call: keyedSame, want: matchReconcile},
		{name: "keyed, the prior is another actor's", prior: &prior{state: markers.Completed, age: time.Minute, actor: "token:other"}, call: keyedSame, want: matchNew},
		{name: "keyed, the prior carried another key", prior: &prior{state: markers.Completed, age: time.Minute, key: "other-key"}, call: keyedSame, want: matchNew},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := callFacts{Actor: actor, Scope: scope, Fingerprint: fp, SameRequest: tt.call.sameRequest}
			if tt.call.keyed {
				in.IdempotencyKey = key
			}
			var rec *markers.Record
			if p := tt.prior; p != nil {
				rec = &markers.Record{
					ID: "ex_01K0000000000000000000PRIOR", State: p.state,
					Actor: or(p.actor, actor), IntentScope: or(p.scope, scope), Fingerprint: or(p.fp, fp),
					IdempotencyKey: or(p.key, in.IdempotencyKey),
					CreatedAt:      now.Add(-p.age),
				}
				ended := p.ended
				if ended == 0 {
					ended = p.age
				}
				rec.UpdatedAt = now.Add(-ended / 2) // a later write (delivery) must not count
				rec.StateTimes = map[markers.State]time.Time{markers.Accepted: rec.CreatedAt, p.state: now.Add(-ended)}
				if p.delivered {
					d := now.Add(-ended / 2)
					rec.ResultDeliveredAt = &d
				}
			}
			if got := matchRule(rec, in, now, class); got != tt.want {
				t.Errorf("matchRule = %s; want %s", got, tt.want)
			}
		})
	}
}

func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// TestFinishedAtIsWhenTheOutcomeWasObserved: a later update (result delivery) moves the
// record's updated_at, never its finished_at.
func TestFinishedAtIsWhenTheOutcomeWasObserved(t *testing.T) {
	accepted := time.Date(2026, 7, 22, 12, 0, 0, 0, time.UTC)
	observed := accepted.Add(3 * time.Second)
	delivered := accepted.Add(time.Minute)
	rec := &markers.Record{
		State: markers.Completed, CreatedAt: accepted, UpdatedAt: delivered, ResultDeliveredAt: &delivered,
		StateTimes: map[markers.State]time.Time{markers.Accepted: accepted, markers.Completed: observed},
	}
	if got := finishedAt(rec); !got.Equal(observed) {
		t.Errorf("finishedAt = %v; want %v (when completed was journaled)", got, observed)
	}
	rec.State = markers.Unknown
	if got := finishedAt(rec); !got.IsZero() {
		t.Errorf("finishedAt of an unknown execution = %v; want none", got)
	}
}

// TestDeliverySettling: only a new-intent decision that rests on a delivery younger than
// delivery_settle waits, and only for what is left of it.
func TestDeliverySettling(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	b := &Bastion{cfg: config.Config{DeliverySettle: time.Second}, now: func() time.Time { return now }}
	at := func(d time.Duration) *time.Time { v := now.Add(-d); return &v }
	tests := []struct {
		name    string
		prior   *markers.Record
		outcome matchOutcome
		want    time.Duration
	}{
		{"no prior", nil, matchNew, 0},
		{"delivered just now", &markers.Record{State: markers.Completed, ResultDeliveredAt: at(200 * time.Millisecond)}, matchNew, 800 * time.Millisecond},
		{"delivered long ago", &markers.Record{State: markers.Completed, ResultDeliveredAt: at(5 * time.Second)}, matchNew, -4 * time.Second},
		{"not delivered: it joins", &markers.Record{State: markers.Completed}, matchReplay, 0},
		{"failed prior", &markers.Record{State: markers.Failed}, matchNew, 0},
		{"joins anyway", &markers.Record{State: markers.Completed, ResultDeliveredAt: at(0)}, matchReplay, 0},
	}
	for _, tt := range tests {
		if got := b.deliverySettling(tt.prior, tt.outcome); (got > 0) != (tt.want > 0) || tt.want > 0 && got != tt.want {
			t.Errorf("%s: deliverySettling = %v; want %v", tt.name, got, tt.want)
		}
	}
}
