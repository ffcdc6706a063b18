package intent

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// TestMatchRule mirrors the matching rule of docs/design.md, its idempotency_key paragraph (keyed
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
		principal string // default: none (a record made before principals)
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
		want  Match
	}{
		// The matching rule, no idempotency_key.
		{name: "no prior execution", call: unkeyed, want: NewExecution},
		{name: "accepted, not dispatched: continue", prior: &prior{state: markers.Accepted, age: time.Minute}, call: unkeyed, want: Continue},
		{name: "authorized, not dispatched: continue", prior: &prior{state: markers.Authorized, age: time.Minute}, call: unkeyed, want: Continue},
		{name: "awaiting_approval: the pending record", prior: &prior{state: markers.AwaitingApproval, age: time.Minute}, call: unkeyed, want: Pending},
		{name: "rejected: the same rejection", prior: &prior{state: markers.Rejected, age: time.Minute}, call: unkeyed, want: Rejection},
		{name: "dispatched: attach", prior: &prior{state: markers.Dispatched, age: time.Minute}, call: unkeyed, want: Attach},
		{name: "running: attach", prior: &prior{state: markers.Running, age: time.Minute}, call: unkeyed, want: Attach},
		{name: "unknown: reconcile first", prior: &prior{state: markers.Unknown, age: time.Minute}, call: unkeyed, want: Reconcile},
		{name: "completed, result not delivered: replay", prior: &prior{state: markers.Completed, age: time.Minute}, call: unkeyed, want: Replay},
		{name: "completed and delivered: a new intent", prior: &prior{state: markers.Completed, age: time.Minute, delivered: true}, call: unkeyed, want: NewExecution},
		{name: "failed (no effect): a new intent", prior: &prior{state: markers.Failed, age: time.Minute}, call: unkeyed, want: NewExecution},
		{name: "cancelled: a new intent", prior: &prior{state: markers.Cancelled, age: time.Minute}, call: unkeyed, want: NewExecution},
		{name: "timed_out: a new intent", prior: &prior{state: markers.TimedOut, age: time.Minute}, call: unkeyed, want: NewExecution},
		{name: "running, at the end of the attach window", prior: &prior{state: markers.Running, age: time.Hour}, call: unkeyed, want: Attach},
		{name: "running, past the attach window", prior: &prior{state: markers.Running, age: time.Hour + time.Second}, call: unkeyed, want: NewExecution},
		{name: "unknown, past the attach window", prior: &prior{state: markers.Unknown, age: 2 * time.Hour}, call: unkeyed, want: NewExecution},
		{name: "completed not delivered, past the attach window", prior: &prior{state: markers.Completed, age: 2 * time.Hour}, call: unkeyed, want: NewExecution},
		{name: "another actor", prior: &prior{state: markers.Running, age: time.Minute, actor: "token:other"}, call: unkeyed, want: NewExecution},
		{name: "another intent scope", prior: &prior{state: markers.Running, age: time.Minute, scope: "run:other"}, call: unkeyed, want: NewExecution},
		{name: "another fingerprint", prior: &prior{state: markers.Running, age: time.Minute, fp: "hmac-sha256:bb"}, call: unkeyed, want: NewExecution},
		{name: "the prior carried a key, the call none", prior: &prior{state: markers.Running, age: time.Minute, key: "k"}, call: unkeyed, want: NewExecution},

		// An explicit idempotency_key: matched by key across scopes and a principal's actors,
		// for the class's retention; another principal's key is refused.
		{name: "keyed, no prior execution", call: keyedSame, want: NewExecution},
		{name: "keyed, same request, completed and delivered: replay", prior: &prior{state: markers.Completed, age: time.Minute, delivered: true}, call: keyedSame, want: Replay},
		{name: "keyed, same request, completed not delivered: replay", prior: &prior{state: markers.Completed, age: time.Minute}, call: keyedSame, want: Replay},
		{name: "keyed, same request, cancelled: replay", prior: &prior{state: markers.Cancelled, age: time.Minute}, call: keyedSame, want: Replay},
		{name: "keyed, same request, timed_out: replay", prior: &prior{state: markers.TimedOut, age: time.Minute}, call: keyedSame, want: Replay},
		{name: "keyed, same request, accepted: continue", prior: &prior{state: markers.Accepted, age: time.Minute}, call: keyedSame, want: Continue},
		{name: "keyed, same request, awaiting_approval: pending", prior: &prior{state: markers.AwaitingApproval, age: time.Minute}, call: keyedSame, want: Pending},
		{name: "keyed, same request, rejected: the same rejection", prior: &prior{state: markers.Rejected, age: time.Minute}, call: keyedSame, want: Rejection},
		{name: "keyed, same request, running: attach", prior: &prior{state: markers.Running, age: time.Minute}, call: keyedSame, want: Attach},
		{name: "keyed, same request, unknown: reconcile", prior: &prior{state: markers.Unknown, age: time.Minute}, call: keyedSame, want: Reconcile},
		{name: "keyed, same request, from another scope: still the prior", prior: &prior{state: markers.Completed, age: time.Minute, scope: "run:other", fp: "hmac-sha256:cc"}, call: keyedSame, want: Replay},
		{name: "keyed, same request, past the attach window: still the prior", prior: &prior{state: markers.Completed, age: 2 * day, delivered: true}, call: keyedSame, want: Replay},
		{name: "keyed, same request, failed (no effect): a new attempt", prior: &prior{state: markers.Failed, age: time.Minute}, call: keyedSame, want: NewAttempt},
		{name: "keyed, same request, failed long ago: a new attempt", prior: &prior{state: markers.Failed, age: 10 * day}, call: keyedSame, want: NewAttempt},
		{name: "keyed, another request, failed: key reused", prior: &prior{state: markers.Failed, age: time.Minute}, call: keyedOther, want: KeyReused},
		{name: "keyed, another request, completed: key reused", prior: &prior{state: markers.Completed, age: time.Minute, delivered: true}, call: keyedOther, want: KeyReused},
		{name: "keyed, another request, running: key reused", prior: &prior{state: markers.Running, age: time.Minute}, call: keyedOther, want: KeyReused},
		{name: "keyed, another request, awaiting_approval: key reused", prior: &prior{state: markers.AwaitingApproval, age: time.Minute}, call: keyedOther, want: KeyReused},
		{name: "keyed, ended past the class's retention: the key is free", prior: &prior{state: markers.Completed, age: 31 * day, ended: 30*day + time.Second, delivered: true}, call: keyedOther, want: NewExecution},
		{name: "keyed, ended within the retention though accepted before it", prior: &prior{state: markers.Completed, age: 31 * day, ended: 29 * day, delivered: true}, call: keyedSame, want: Replay},
		{name: "keyed, still running past the retention: attach", prior: &prior{state: markers.Running, age: 31 * day}, call: keyedSame, want: Attach},
		{name: "keyed, unknown past the retention: reconcile", prior: &prior{state: markers.Unknown, age: 31 * day}, call: keyedSame, want: Reconcile},
		{name: "keyed, the prior is another actor's (before principals)", prior: &prior{state: markers.Completed, age: time.Minute, actor: "token:other"}, call: keyedSame, want: KeyHeld},
		{name: "keyed, the prior is the caller's principal's", prior: &prior{state: markers.Completed, age: time.Minute, actor: "local:alice", principal: "principal:alice"}, call: keyedSame, want: Replay},
		{name: "keyed, the caller's principal's, another request", prior: &prior{state: markers.Running, age: time.Minute, actor: "local:alice", principal: "principal:alice"}, call: keyedOther, want: KeyReused},
		{name: "keyed, another principal's: held, even for the same request", prior: &prior{state: markers.Completed, age: time.Minute, principal: "principal:bob"}, call: keyedSame, want: KeyHeld},
		{name: "keyed, another principal's, running: held", prior: &prior{state: markers.Running, age: time.Minute, actor: "token:bob", principal: "token:bob"}, call: keyedOther, want: KeyHeld},
		{name: "keyed, another principal's, failed: held", prior: &prior{state: markers.Failed, age: time.Minute, principal: "principal:bob"}, call: keyedSame, want: KeyHeld},
		{name: "keyed, another principal's, past its retention: the key is free", prior: &prior{state: markers.Completed, age: 31 * day, ended: 30*day + time.Second, principal: "principal:bob"}, call: keyedSame, want: NewExecution},
		{name: "keyed, the prior carried another key", prior: &prior{state: markers.Completed, age: time.Minute, key: "other-key"}, call: keyedSame, want: NewExecution},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Facts{Actor: actor, Principal: "principal:alice", Scope: scope, Fingerprint: fp, SameRequest: tt.call.sameRequest}
			if tt.call.keyed {
				in.IdempotencyKey = key
			}
			var rec *markers.Record
			if p := tt.prior; p != nil {
				rec = &markers.Record{
					ID: "ex_01K0000000000000000000PRIOR", State: p.state,
					Actor: or(p.actor, actor), IntentScope: or(p.scope, scope), Fingerprint: or(p.fp, fp),
					IdempotencyKey: or(p.key, in.IdempotencyKey), Principal: p.principal,
					CreatedAt: now.Add(-p.age),
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
			if got := Rule(rec, in, now, class); got != tt.want {
				t.Errorf("Rule = %s; want %s", got, tt.want)
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
	if got := FinishedAt(rec); !got.Equal(observed) {
		t.Errorf("FinishedAt = %v; want %v (when completed was journaled)", got, observed)
	}
	rec.State = markers.Unknown
	if got := FinishedAt(rec); !got.IsZero() {
		t.Errorf("FinishedAt of an unknown execution = %v; want none", got)
	}
}

// TestScope: which scope a call is matched in — the kernel's run for a local caller, the
// run_id argument before the Postern-Run header, and without either the OAuth subject's own
// window, so two people mapped to one actor never join each other's executions.
func TestScope(t *testing.T) {
	for _, tc := range []struct {
		name   string
		caller transport.Caller
		runID  string
		want   string
	}{
		{"local run from the kernel", transport.Caller{Actor: "uid:1000", Local: true, Scope: "run:41-7", Subject: "x"}, "r", "run:41-7"},
		{"run_id argument first", transport.Caller{Actor: "token:a", RunID: "hdr"}, "arg", "run:arg"},
		{"Postern-Run header", transport.Caller{Actor: "token:a", RunID: "hdr", Subject: "alice"}, "", "run:hdr"},
		{"an OAuth subject's window", transport.Caller{Actor: "token:people", Subject: "alice"}, "", "window:alice"},
		{"another subject of the same actor", transport.Caller{Actor: "token:people", Subject: "bob"}, "", "window:bob"},
		{"a Postern token's window", transport.Caller{Actor: "token:a"}, "", "window"},
	} {
		if got := Scope(tc.caller, tc.runID); got != tc.want {
			t.Errorf("%s: Scope = %q, want %q", tc.name, got, tc.want)
		}
	}
}
