package intent

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// TestRemovable mirrors "Retention" in docs/design.md: what a retention pass may remove, row
// by row. The class: attach window 1 h, retention 30 d (margin 10 min).
func TestRemovable(t *testing.T) {
	now := time.Date(2026, 7, 22, 12, 0, 0, 0, time.UTC)
	class := config.Class{Name: config.ClassRemoteCommand, AttachWindow: time.Hour, Retention: 30 * day}
	short := config.Class{Name: config.ClassReadOnly, AttachWindow: 10 * time.Second, Retention: 60 * time.Second}
	tests := []struct {
		name   string
		state  markers.State
		age    time.Duration // since accepted
		ended  time.Duration // since it reached its state; default age
		review bool
		class  *config.Class
		want   bool
	}{
		{name: "completed, past its retention", state: markers.Completed, age: 31 * day, want: true},
		{name: "failed, past its retention", state: markers.Failed, age: 31 * day, want: true},
		{name: "cancelled, past its retention", state: markers.Cancelled, age: 31 * day, want: true},
		{name: "timed_out, past its retention", state: markers.TimedOut, age: 31 * day, want: true},
		{name: "rejected, past its retention", state: markers.Rejected, age: 31 * day, want: true},
		{name: "completed, within its retention", state: markers.Completed, age: 29 * day, want: false},
		{name: "completed, retention passed but not its margin", state: markers.Completed, age: 30*day + 5*time.Minute, want: false},
		{name: "completed, retention and margin passed", state: markers.Completed, age: 30*day + 11*time.Minute, want: true},
		{name: "accepted long ago, ended within its retention", state: markers.Completed, age: 90 * day, ended: 29 * day, want: false},
		{name: "running, however old", state: markers.Running, age: 365 * day, want: false},
		{name: "dispatched, however old", state: markers.Dispatched, age: 365 * day, want: false},
		{name: "accepted, however old", state: markers.Accepted, age: 365 * day, want: false},
		{name: "authorized, however old", state: markers.Authorized, age: 365 * day, want: false},
		{name: "awaiting approval, however old", state: markers.AwaitingApproval, age: 365 * day, want: false},
		{name: "unknown, however old", state: markers.Unknown, age: 365 * day, want: false},
		{name: "unknown awaiting review, however old", state: markers.Unknown, age: 365 * day, review: true, want: false},
		{name: "short class: inside its attach window", state: markers.Completed, age: 9 * time.Second, class: &short, want: false},
		{name: "short class: past its retention and margin (6 s)", state: markers.Completed, age: 67 * time.Second, class: &short, want: true},
		{name: "short class: past its retention, not its margin", state: markers.Completed, age: 65 * time.Second, class: &short, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := class
			if tt.class != nil {
				cl = *tt.class
			}
			ended := tt.ended
			if ended == 0 {
				ended = tt.age
			}
			rec := &markers.Record{ID: "ex_1", State: tt.state, ReviewRequired: tt.review, Class: cl.Name,
				CreatedAt: now.Add(-tt.age), UpdatedAt: now.Add(-ended / 2),
				StateTimes: map[markers.State]time.Time{markers.Accepted: now.Add(-tt.age), tt.state: now.Add(-ended)}}
			if got := Removable(rec, now, cl); got != tt.want {
				t.Errorf("Removable = %v; want %v", got, tt.want)
			}
		})
	}
}

// TestRuleRemoved mirrors the rule for a call whose lookup found a removed execution's
// tombstone (docs/design.md, "Retention"), row by row: the answer is the matching rule's,
// except where it would replay what is gone.
func TestRuleRemoved(t *testing.T) {
	now := time.Date(2026, 7, 22, 12, 0, 0, 0, time.UTC)
	const actor, scope, fp, key = "token:deploy-bot", "run:5f8097", "hmac-sha256:aa", "deploy-2026-07-22"
	classes := map[string]config.Class{
		config.ClassIrreversible:    {Name: config.ClassIrreversible, AttachWindow: 7 * day, Retention: 90 * day},
		config.ClassReadOnly:        {Name: config.ClassReadOnly, AttachWindow: 5 * time.Minute, Retention: 7 * day},
		config.ClassIdempotentWrite: {Name: config.ClassIdempotentWrite, AttachWindow: time.Hour, Retention: 30 * day},
		config.ClassRemoteCommand:   {Name: config.ClassRemoteCommand, AttachWindow: day, Retention: 30 * day},
	}
	type call struct{ keyed, sameRequest bool }
	unkeyed, keyedSame, keyedOther := call{}, call{keyed: true, sameRequest: true}, call{keyed: true}
	tests := []struct {
		name      string
		class     string
		state     markers.State
		ended     time.Duration // ago; accepted a minute before
		delivered bool
		call      call
		want      Match
	}{
		// As Removable leaves it: every window has passed, so the call is new, as it would be
		// with the execution still there.
		{name: "keyed, same request, removed after its retention", class: config.ClassIrreversible, state: markers.Completed, ended: 91 * day, delivered: true, call: keyedSame, want: NewExecution},
		{name: "keyed, another request, removed after its retention", class: config.ClassIrreversible, state: markers.Completed, ended: 91 * day, call: keyedOther, want: NewExecution},
		{name: "unkeyed, removed after its retention", class: config.ClassRemoteCommand, state: markers.Completed, ended: 31 * day, call: unkeyed, want: NewExecution},
		{name: "unkeyed, not delivered, removed after its retention", class: config.ClassRemoteCommand, state: markers.Completed, ended: 31 * day, call: unkeyed, want: NewExecution},

		// Removed early (a replica's clock ahead, a retention shortened and lengthened again):
		// a keyed call of the same request would replay it.
		{name: "keyed irreversible, removed inside its retention: refused", class: config.ClassIrreversible, state: markers.Completed, ended: 30 * day, delivered: true, call: keyedSame, want: Removed},
		{name: "keyed remote_command, removed inside its retention: refused", class: config.ClassRemoteCommand, state: markers.Completed, ended: 10 * day, call: keyedSame, want: Removed},
		{name: "keyed irreversible cancelled, removed inside its retention: refused", class: config.ClassIrreversible, state: markers.Cancelled, ended: 30 * day, call: keyedSame, want: Removed},
		{name: "keyed read_only, removed inside its retention: runs again", class: config.ClassReadOnly, state: markers.Completed, ended: 3 * day, call: keyedSame, want: NewExecution},
		{name: "keyed idempotent_write, removed inside its retention: runs again", class: config.ClassIdempotentWrite, state: markers.Completed, ended: 3 * day, call: keyedSame, want: NewExecution},
		{name: "keyed, another request, removed inside its retention: key reused", class: config.ClassIrreversible, state: markers.Completed, ended: 30 * day, call: keyedOther, want: KeyReused},
		{name: "keyed, failed, removed inside its retention: a new attempt", class: config.ClassIrreversible, state: markers.Failed, ended: 30 * day, call: keyedSame, want: NewAttempt},
		// An unkeyed call would replay an undelivered result inside the attach window.
		{name: "unkeyed irreversible, not delivered, removed inside its window: refused", class: config.ClassIrreversible, state: markers.Completed, ended: day, call: unkeyed, want: Removed},
		{name: "unkeyed read_only, not delivered, removed inside its window: runs again", class: config.ClassReadOnly, state: markers.Completed, ended: time.Minute, call: unkeyed, want: NewExecution},
		{name: "unkeyed irreversible, delivered, removed inside its window: new", class: config.ClassIrreversible, state: markers.Completed, ended: day, delivered: true, call: unkeyed, want: NewExecution},
		{name: "unkeyed irreversible, failed, removed inside its window: new", class: config.ClassIrreversible, state: markers.Failed, ended: day, call: unkeyed, want: NewExecution},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Facts{Actor: actor, Scope: scope, Fingerprint: fp, SameRequest: tt.call.sameRequest}
			var k string
			if tt.call.keyed {
				in.IdempotencyKey, k = key, key
			}
			finished := now.Add(-tt.ended)
			ts := &markers.Tombstone{ID: "ex_01K0000000000000000000PRIOR", Class: tt.class, State: tt.state,
				Actor: actor, IntentScope: scope, Fingerprint: fp, IdempotencyKey: k,
				CreatedAt: finished.Add(-time.Minute), FinishedAt: finished, RemovedAt: now.Add(-time.Second)}
			if tt.delivered {
				ts.DeliveredAt = &finished
			}
			if got := RuleRemoved(ts.Record(), in, now, classes[tt.class]); got != tt.want {
				t.Errorf("RuleRemoved = %s; want %s", got, tt.want)
			}
		})
	}
}
