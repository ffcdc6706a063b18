package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/ctxtime"
	"github.com/postern-dev/postern/internal/keylock"
	"github.com/postern-dev/postern/markers"
)

// intake answers the calls that start work (ssh_exec, http_request): it checks the
// arguments, resolves the call to its intent (bastion/intent), and either joins the prior
// execution the matching rule names or decides on a new one (policy, the actor's limits) and
// accepts it — journaled before anything is sent — handing it to a driver.
//
// Invariant: the lookup of a call's prior execution and the acceptance of a new one happen
// under one of locks (per intent, per idempotency key), so two calls of one intent never both
// create.
type intake struct {
	*core
	drivers *drivers
	views   *views
	locks   keylock.Set
}

// submit fingerprints a claim and answers it by the matching rule (match.go): the prior
// execution it belongs to — found by its idempotency key if it has one, else by its
// fingerprint in its scope — or a new execution, accepted (journaled) and handed to a driver.
func (in *intake) submit(ctx context.Context, cl *claim, wait time.Duration, progress func(*api.Execution)) (*api.Execution, error) {
	c := cl.caller
	if c.Actor == "" {
		return nil, &api.ToolError{Code: api.CodeUnauthenticated, Message: "no caller identity"}
	}
	var err error
	if cl.fingerprint, err = in.fp.Fingerprint(cl.action); err != nil {
		return nil, err
	}
	key := cl.record.IdempotencyKey
	// The lookup and the acceptance of a new execution happen under one intake lock, so two
	// concurrent calls of one intent cannot both create.
	lockKey, by := intent.LockKey(c.Actor, cl.scope, cl.fingerprint), "fingerprint"
	if key != "" {
		lockKey, by = intent.KeyLockKey(key), "idempotency_key"
	}
	cl.record.Principal = in.principalOf(c)
	facts := intent.Facts{Actor: c.Actor, Principal: cl.record.Principal, Scope: cl.scope, Fingerprint: cl.fingerprint, IdempotencyKey: key}
	var (
		unlock  func()
		prior   *markers.Record
		gone    *markers.Tombstone // prior was removed by retention: its tombstone
		outcome intent.Match
	)
	defer func() { unlock() }()
	claimed := cl.record // as it was before matching and deciding, for a match again (ErrRaced)
	for {
		unlock = sync.OnceFunc(in.locks.Lock(lockKey))
		if prior, gone, outcome, err = in.matchCall(cl, &facts); err != nil {
			return nil, err
		}
		if judged := in.deliveryInDoubt(prior, outcome); judged != nil {
			// The result this call would replay is on its way to a client, and whether it
			// got there is not known yet: a client that read it and calls again must not
			// be handed the same result as if it had lost it. Decide on the verdict, without
			// the intake lock (the delivery's journal write does not need it, a revocation
			// does).
			unlock()
			verdict := time.NewTimer(maxDeliveryVerdictWait)
			select {
			case <-judged:
			case <-verdict.C:
			case <-ctx.Done():
			}
			verdict.Stop()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue
		}
		wait := in.deliverySettling(c, prior, outcome)
		if wait <= 0 {
			break
		}
		// A result delivered moments ago may yet be given up: the client's
		// notifications/cancelled can arrive after the re-issue it preceded. Decide once the
		// settle time has passed, without the intake lock (a revocation takes it), so that a
		// revocation in between makes the call join.
		unlock()
		if !ctxtime.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
	switch {
	case outcome == intent.Removed:
		unlock()
		in.metrics.rejected.WithLabelValues(api.CodeExecutionRemoved).Inc()
		return nil, &api.ToolError{Code: api.CodeExecutionRemoved, ExecutionID: prior.ID, Message: fmt.Sprintf(
			"this call would replay %s (%s, class %s, ended %s), but the journal's retention removed it on %s, before its class's window had passed (a clock or configuration change): its result is gone, and a %s action is not run again blindly. Nothing was dispatched. Find out what it did (postern audit verify --archive with the export made before the removal), then call with a new idempotency_key or a changed request",
			prior.ID, prior.State, prior.Class, gone.FinishedAt.Format(time.RFC3339), gone.RemovedAt.Format(time.RFC3339), prior.Class)}
	case outcome == intent.KeyHeld:
		// Another principal's execution: the caller learns that the key is taken, never
		// which execution holds it, and nothing is journaled on that execution.
		unlock()
		in.metrics.rejected.WithLabelValues(api.CodeIdempotencyKeyHeld).Inc()
		return nil, keyHeld(key).Err()
	case outcome == intent.KeyReused:
		unlock()
		in.metrics.rejected.WithLabelValues(api.CodeIdempotencyKeyReused).Inc()
		if gone != nil {
			return nil, &api.ToolError{Code: api.CodeIdempotencyKeyReused, ExecutionID: prior.ID, Message: fmt.Sprintf(
				"idempotency_key %q was used by %s (since removed by the journal's retention) for a different request; nothing was dispatched (use a new key for a new request)", key, prior.ID)}
		}
		if err := in.records.joined(ctx, c, cl.scope, prior.ID, outcome); err != nil {
			return nil, journalError(err)
		}
		te := keyReused(key, prior.ID).Err()
		te.ExecutionID = prior.ID
		return nil, te
	case outcome.Joins():
		unlock()
		in.metrics.dedup.WithLabelValues(by).Inc()
		if err := in.records.joined(ctx, c, cl.scope, prior.ID, outcome); err != nil {
			return nil, journalError(err)
		}
		return in.join(ctx, prior, outcome, wait, progress)
	case outcome == intent.NewAttempt:
		cl.record.PreviousAttempt = prior.ID
		cl.record.Evidence = appendBounded(cl.record.Evidence, fmt.Sprintf(
			"new attempt of %s, which failed without effect (same idempotency_key, same request)", prior.ID))
	case gone != nil && (key == "" || facts.SameRequest):
		cl.record.Evidence = appendBounded(cl.record.Evidence, fmt.Sprintf(
			"a new execution: this call's %s last named %s (%s, ended %s), which the journal's retention removed on %s once no call could match it",
			matchedBy(key), gone.ID, gone.State, gone.FinishedAt.Format(time.RFC3339), gone.RemovedAt.Format(time.RFC3339)))
	}
	if in.held {
		unlock()
		return nil, errHeld("this call would start a new execution")
	}
	dec, admitted, err := in.decide(c, cl)
	if err != nil {
		return nil, err
	}
	defer admitted()
	if dec.Outcome == policy.Authorized && cl.host != nil && !cl.connectTried && !in.hosts.pool.Holds(*cl.host) {
		// No connection to the host yet, and a dial can take up to connectTimeout: not
		// under the intake lock (which every call of this intent waits for) nor the actor's
		// admission (which all its calls wait for, whatever their host). Dial without them,
		// then match and decide again — the journal may have changed meanwhile. accept
		// checks the connection again under the lock, so nothing else changes.
		unlock()
		admitted()
		cl.connectTried = true
		in.hosts.connected(*cl.host)
		cl.record = claimed
		return in.submit(ctx, cl, wait, progress)
	}
	rec, dispatched, err := in.accept(ctx, cl, dec, outcome)
	if errors.Is(err, markers.ErrRaced) {
		// Another replica accepted this intent after it was matched here: match again, to
		// join that execution.
		in.log.Info("another replica accepted this intent first; matching the call again", "actor", c.Actor)
		unlock()
		admitted()
		cl.record = claimed
		return in.submit(ctx, cl, wait, progress)
	}
	if err != nil {
		return nil, err
	}
	if dec.Outcome != policy.Authorized {
		unlock()
		if rec, err = in.records.policyDecision(ctx, rec, dec); err != nil {
			return nil, err
		}
		if rec.State == markers.AwaitingApproval && in.announcer != nil {
			in.announcer.Announce(in.approvalRequest(rec))
		}
		return in.views.view(rec), nil
	}
	// The driver starts before the intake lock is released, so a retry of the same intent
	// finds it and attaches instead of starting a reconciling one of its own.
	var d *driver
	if dispatched {
		d = in.drivers.startDispatched(rec)
	} else {
		d = in.drivers.start(rec)
	}
	unlock()
	admitted() // the driver counts towards the actor's limits now
	if d == nil {
		return nil, &api.ToolError{Code: api.CodeShuttingDown, Message: "the bastion is shutting down; " + rec.ID + " was accepted and will be dispatched after restart"}
	}
	return in.views.await(ctx, d, wait, false, progress), nil
}

// matchCall looks up the prior execution of cl's intent (by key, else by fingerprint) and
// applies the matching rule — intent.RuleRemoved when the lookup found the tombstone of an
// execution retention removed (gone; prior is then that execution as the tombstone keeps
// it). Call it under the intake lock.
func (in *intake) matchCall(cl *claim, facts *intent.Facts) (prior *markers.Record, gone *markers.Tombstone, _ intent.Match, _ error) {
	var err error
	var removed *markers.RemovedError
	if facts.IdempotencyKey != "" {
		// Whoever holds the key; then the caller's own key of before principals, which its
		// actor's space keeps (markers.KeySpace). A tombstone in the shared space is the
		// newest holder's: it answers (RuleRemoved), not the older space.
		prior, err = in.journal.FindByIdempotencyKey(markers.SharedKeySpace, facts.IdempotencyKey)
		if errors.Is(err, markers.ErrNotFound) && !errors.As(err, &removed) {
			prior, err = in.journal.FindByIdempotencyKey(facts.Actor, facts.IdempotencyKey)
		}
	} else {
		prior, err = in.journal.FindByFingerprint(facts.Actor, facts.Scope, facts.Fingerprint)
	}
	switch {
	case errors.As(err, &removed):
		gone = removed.Tombstone
		prior = gone.Record()
	case errors.Is(err, markers.ErrNotFound):
		prior = nil
	case err != nil:
		return nil, nil, "", journalError(err)
	}
	if prior == nil {
		rec, err := in.recoveredOf(facts.Fingerprint)
		if err != nil {
			return nil, nil, "", journalError(err)
		}
		if rec != nil {
			return rec, nil, intent.RuleRecovered(rec, in.now(), in.current().classes.Get(rec.Class)), nil
		}
	}
	class := config.Class{}
	if prior != nil {
		class = in.current().classes.Get(prior.Class)
		if facts.IdempotencyKey != "" && intent.HoldsKey(prior, *facts) {
			if facts.SameRequest, err = in.fp.SameRequest(prior, cl.action, cl.fingerprint); err != nil {
				return nil, nil, "", err
			}
		}
	}
	if gone != nil {
		return prior, gone, intent.RuleRemoved(prior, *facts, in.now(), class), nil
	}
	return prior, nil, intent.Rule(prior, *facts, in.now(), class), nil
}

func matchedBy(key string) string {
	if key != "" {
		return fmt.Sprintf("idempotency_key %q", key)
	}
	return "intent (same command, same agent run)"
}

// maxDeliveryVerdictWait bounds how long a call waits for the delivery verdict of the result
// it would replay (deliveryInDoubt): the transports judge within seconds (the kernel's
// evidence is looked for at most 5 s), and a call that waited this long replays.
const maxDeliveryVerdictWait = 10 * time.Second

// deliveryInDoubt returns a channel closed once the delivery of prior's result has been
// judged, when the call would replay that result (an unkeyed call, a completed execution not
// delivered) while a response carrying it is still being judged; nil otherwise. A keyed call
// replays whatever happened to the response, and needs no verdict.
func (in *intake) deliveryInDoubt(prior *markers.Record, outcome intent.Match) <-chan struct{} {
	if outcome != intent.Replay || prior.IdempotencyKey != "" || prior.State != markers.Completed || prior.ResultDeliveredAt != nil {
		return nil
	}
	return in.judging.pending(prior.ID)
}

// deliverySettling is how long a call must wait before a new-intent decision that rests on
// prior's delivery is final (see config.Config.DeliverySettle); 0 when it needs no wait.
//
// Only a cancel that can overtake the call is waited for: over Streamable HTTP the client's
// notifications/cancelled is a POST of its own, which may arrive after the re-issue it came
// before. The stdio bridge forwards a cancel, and the daemon has revoked the delivery it
// gave up on, before the bridge reads its client's next message (transport.Bridge), so a
// call through it that finds a delivered result finds it after any cancel of it: it is
// decided at once. Only a bridge that runs the daemon's own executable is known to be that
// bridge (Caller.BridgeBinary); any other program may name its parent as a bridge does.
func (in *intake) deliverySettling(c transport.Caller, prior *markers.Record, outcome intent.Match) time.Duration {
	if c.BridgeBinary || outcome != intent.NewExecution || prior == nil || prior.State != markers.Completed || prior.ResultDeliveredAt == nil {
		return 0
	}
	return prior.ResultDeliveredAt.Add(in.cfg.DeliverySettle).Sub(in.now())
}

// decide runs the ladder for a new execution and checks the actor's limits (limits.go). A
// rejection by the ladder is journaled (the caller and an operator can see it and why);
// exceeding a limit is a plain error and journals nothing. The returned release must be
// called once the execution is accepted and its driver started: an actor with limits is
// admitted one call at a time, so concurrent calls cannot all pass the same count.
func (in *intake) decide(c transport.Caller, cl *claim) (policy.Decision, func(), error) {
	if cl.fleet != nil {
		return in.decideFleet(c, cl)
	}
	actor, ok := in.policyActor(c)
	ask := cl.ask
	if ok {
		ask.Actor = actor.Name
		cl.record.PolicyActor = actor.Name
	}
	dec := in.current().policy.Decide(ask)
	cl.record.Class = dec.Class
	if cl.record.Class == "" {
		cl.record.Class = cl.defaultClass
	}
	cl.record.Decision, cl.record.Rule = string(dec.Outcome), dec.Rule
	steps := append([]string(nil), dec.Steps...)
	steps = append(steps, api.DecisionEvidence(string(dec.Outcome), dec.Rule))
	for _, s := range steps {
		cl.record.Evidence = appendBounded(cl.record.Evidence, s)
	}
	if dec.Outcome == policy.Rejected || !ok || !actor.Limited() {
		return dec, func() {}, nil
	}
	release := sync.OnceFunc(in.locks.Lock("a\x00" + actor.Name))
	if err := in.checkLimits(c, actor, cl.scope, dec.Outcome == policy.Authorized); err != nil {
		release()
		return dec, nil, err
	}
	return dec, release, nil
}

// policyActor resolves the caller to its configured actor: by token name for remote
// callers, by process (uid, executable) for local ones.
func (co *core) policyActor(c transport.Caller) (policy.Actor, bool) {
	if c.Local {
		return co.current().policy.LocalActor(c.UID, c.Exe)
	}
	return co.current().policy.Actor(strings.TrimPrefix(c.Actor, "token:"))
}

// principalOf is who holds the caller's idempotency keys (markers.Record.Principal):
// "principal:NAME" for a caller whose configured actor is in a [[principals]] entry, else
// the caller's own actor string.
func (co *core) principalOf(c transport.Caller) string {
	if actor, ok := co.policyActor(c); ok {
		if name, ok := co.current().cfg.PrincipalOf(actor.Name); ok {
			return "principal:" + name
		}
	}
	return c.Actor
}

// checkLimits refuses a new call of actor in scope that would exceed one of its limits. An
// execution that awaits approval (dispatchNow false) takes no concurrency slot yet: once
// approved it waits for one (awaitSlot).
func (in *intake) checkLimits(c transport.Caller, actor policy.Actor, scope string, dispatchNow bool) error {
	if dispatchNow && (actor.MaxConcurrent > 0 || actor.RunMaxConcurrent > 0) {
		all, run := in.drivers.inFlight(actor.Name, scope)
		if why := concurrencyExceeded(actor, all, run); why != "" {
			in.metrics.rejected.WithLabelValues(api.CodeConcurrencyLimit).Inc()
			return api.Refusal{Code: api.CodeConcurrencyLimit, Reason: why,
				Repair: "wait for one of them to end (execution_status or execution_output), then call again",
				Next:   "Nothing was started"}.Err()
		}
	}
	if actor.DailyQuota > 0 || actor.RunDailyQuota > 0 {
		all, run, err := in.quotaUsed(c.Actor, actor, scope)
		if err != nil {
			return journalError(err)
		}
		var why string
		switch {
		case actor.DailyQuota > 0 && all >= actor.DailyQuota:
			why = fmt.Sprintf("actor %s used its daily quota of %d executions", actor.Name, actor.DailyQuota)
		case actor.RunDailyQuota > 0 && run >= actor.RunDailyQuota:
			why = fmt.Sprintf("this agent run of actor %s used its daily quota of %d executions (run_daily_quota)", actor.Name, actor.RunDailyQuota)
		}
		if why != "" {
			in.metrics.rejected.WithLabelValues(api.CodeQuotaExceeded).Inc()
			return api.Refusal{Code: api.CodeQuotaExceeded, Reason: why,
				Repair: "the quota resets at 00:00 UTC (rejected executions do not count); until then nothing new can start",
				Next:   "Nothing was started"}.Err()
		}
	}
	return nil
}

// quotaUsed counts the executions of actor (journaled under the caller string journalActor)
// accepted today that count toward its quotas, and of those the ones in scope. It reads the
// journal's index of the actor's executions (of the run's, when only the run has a quota),
// so other actors' history costs it nothing; it stops once every quota the actor has is
// reached.
func (in *intake) quotaUsed(journalActor string, actor policy.Actor, scope string) (all, run int, err error) {
	now := in.now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	reached := func() bool {
		return (actor.DailyQuota == 0 || all >= actor.DailyQuota) && (actor.RunDailyQuota == 0 || run >= actor.RunDailyQuota)
	}
	q := markers.Query{Actor: journalActor, Since: midnight, Limit: 1000}
	if actor.DailyQuota == 0 {
		q.Scope = scope
	}
	cursor := ""
	for {
		q.Cursor = cursor
		recs, next, err := in.journal.List(q)
		if err != nil {
			return 0, 0, err
		}
		for _, r := range recs {
			if r.PolicyActor != actor.Name || !countsTowardQuota(r) {
				continue
			}
			all++
			if r.IntentScope == scope {
				run++
			}
		}
		if next == "" || reached() {
			return all, run, nil
		}
		cursor = next
	}
}

// accept journals a new execution (synced) before anything else happens to it. When the
// policy authorized it at once, the first states are journaled together, in the one synced
// write before the dispatch boundary (docs/design.md, "Two synced writes per execution"; the
// other is its outcome): accepted → authorized, and for SSH → dispatched once the host's
// pooled connection is up (dispatched reports that), so its driver execs at once.
//
// Why one write is as safe as three: the states between accepted and dispatched are there so
// that a crash between them can be resumed, and with nothing decided in between (no approval,
// no other caller: the intake lock is held and the record does not exist before the write)
// there is no such moment. A crash before the write is durable leaves nothing: no record, and
// nothing sent (the connection is made before, but the exec goes out only after the write
// returns), and the caller never saw an execution id, so its retry is a new execution —
// indistinguishable from a call that never arrived. A crash after it is a crash after
// dispatch: Recover asks the host, whose marker (or its absence: never started) decides. A
// failed write fails closed: nothing is dispatched.
//
// A host that cannot be reached is the exception: the execution is journaled authorized, and
// its driver records that it failed with nothing sent (the pool's backoff answers it at once).
//
// Its create event carries the call (matched as match: new or new_attempt), in that write.
func (in *intake) accept(ctx context.Context, cl *claim, dec policy.Decision, match intent.Match) (_ *markers.Record, dispatched bool, _ error) {
	newID := markers.NewExecutionID
	if cl.fleet != nil {
		newID = markers.NewFleetRunID
	}
	id, err := newID(in.now())
	if err != nil {
		return nil, false, err
	}
	r := cl.record
	r.ID, r.Actor, r.IntentScope, r.Fingerprint = id, cl.caller.Actor, cl.scope, cl.fingerprint
	var path []markers.State
	note := "authorized"
	if dec.Outcome == policy.Authorized {
		path = []markers.State{markers.Authorized}
		if cl.host != nil && in.hosts.connected(*cl.host) {
			path = append(path, markers.Dispatched)
			note = "dispatching to " + r.Host
		}
	}
	rec, err := in.records.create(ctx, &r, path, note, in.records.call(ctx, cl.caller, cl.scope, match, false))
	if errors.Is(err, markers.ErrRaced) {
		return nil, false, err
	}
	if err != nil {
		return nil, false, journalError(err)
	}
	in.metrics.accepted.Inc()
	dispatched = rec.State == markers.Dispatched
	if dispatched {
		in.metrics.dispatched.Inc()
	}
	return rec, dispatched, nil
}

// join answers a call that belongs to an existing execution (recover_or_attach): never a
// second dispatch. A live execution is followed by its driver — continued, attached to or
// reconciled — for up to wait; any other is returned as journaled.
func (in *intake) join(ctx context.Context, prior *markers.Record, outcome intent.Match, wait time.Duration, progress func(*api.Execution)) (*api.Execution, error) {
	switch outcome {
	case intent.Continue, intent.Attach, intent.Reconcile:
		if d := in.drivers.start(prior); d != nil {
			return in.views.await(ctx, d, wait, true, progress), nil
		}
	}
	x := in.views.stored(prior)
	x.Replayed = true
	return x, nil
}

func errorCode(err error) string {
	var te *api.ToolError
	if errors.As(err, &te) {
		return te.Code
	}
	return "internal"
}
