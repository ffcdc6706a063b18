package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/ctxtime"
	"github.com/postern-dev/postern/internal/envpolicy"
	"github.com/postern-dev/postern/markers"
)

// Bounds on arguments, besides the configured command size.
const (
	maxCwdBytes      = 4096
	maxEnvVars       = 32
	maxEnvValueBytes = 4096
	maxTimeoutS      = 31 * 24 * 3600
	maxKeyBytes      = 255
)

// validate checks every argument before anything is journaled.
func (b *Engine) validate(a *api.ExecArgs) error {
	switch {
	case a.Host == "":
		return api.Invalid("host is required")
	case len(a.Host) > 64:
		return api.Invalid("host is longer than 64 bytes")
	case a.Command == "" || strings.TrimSpace(a.Command) == "":
		return api.Invalid("command is required")
	case len(a.Command) > b.cfg.MaxCommandBytes:
		return api.Invalid("command is %d bytes; the limit is %d", len(a.Command), b.cfg.MaxCommandBytes)
	case !utf8.ValidString(a.Command) || strings.IndexByte(a.Command, 0) >= 0:
		return api.Invalid("command must be UTF-8 text without NUL bytes")
	case a.Cwd != "" && (len(a.Cwd) > maxCwdBytes || !filepath.IsAbs(a.Cwd) || filepath.Clean(a.Cwd) != a.Cwd || !utf8.ValidString(a.Cwd)):
		return api.Invalid("cwd must be an absolute, clean path of at most %d bytes", maxCwdBytes)
	case len(a.Env) > maxEnvVars:
		return api.Invalid("at most %d env variables", maxEnvVars)
	case a.TimeoutS < 0 || a.TimeoutS > maxTimeoutS:
		return api.Invalid("timeout_s must be in 0..%d", maxTimeoutS)
	case a.WaitS != nil && (*a.WaitS < 0 || time.Duration(*a.WaitS)*time.Second > b.cfg.MaxWait):
		return api.Invalid("wait_s must be in 0..%d", int(b.cfg.MaxWait/time.Second))
	case a.RunID != "" && !transport.ValidRunID(a.RunID):
		return api.Invalid("run_id must be 1-128 printable ASCII characters")
	case !validKey(a.IdempotencyKey):
		return api.Invalid("idempotency_key must be at most %d printable ASCII characters", maxKeyBytes)
	case !validKey(a.OperationKey) || strings.Contains(a.OperationKey, " "):
		return api.Invalid("operation_key must be at most %d visible ASCII characters", maxKeyBytes)
	}
	for k, v := range a.Env {
		switch {
		case !envpolicy.ValidName(k):
			return api.Invalid("env name %q is not a valid variable name", k)
		case strings.HasPrefix(k, "POSTERN_"):
			return api.Invalid("env %s: POSTERN_* variables are set by the bastion", k)
		case envpolicy.IsForbidden(k):
			return api.Invalid("env %s: no host accepts it (it can make the command run other code); hosts accept LANG, LC_* and their accept_env", k)
		case len(v) > maxEnvValueBytes || strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v):
			return api.Invalid("env %s: values are UTF-8 without NUL, at most %d bytes", k, maxEnvValueBytes)
		}
	}
	return nil
}

// checkHostEnv refuses the env names host would drop (internal/envpolicy, with the host's
// accept_env as the inventory records it), all of them at once, so a command never runs
// without a variable its caller was told it had.
func checkHostEnv(env map[string]string, host fleet.Host) error {
	allow, err := envpolicy.New(host.AcceptEnv)
	if err != nil {
		return err
	}
	var dropped []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !allow.Allows(k) {
			dropped = append(dropped, k)
		}
	}
	if len(dropped) == 0 {
		return nil
	}
	return api.Invalid("env %s: host %s would drop it, since it accepts only %s. Leave it out, or ask the operator to add it to accept_env in the hostagent's config on %s and in %s's inventory entry",
		strings.Join(dropped, ", "), host.Name, allow, host.Name, host.Name)
}

func validKey(k string) bool {
	if len(k) > maxKeyBytes {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// claim is one call resolved to its identity, whatever its channel: who, in which scope,
// the canonical action and its fingerprint, and the record to journal if it is new.
type claim struct {
	caller      transport.Caller
	scope       string
	action      intent.ActionRecord
	fingerprint string
	// record is the execution to accept (identity and what it does); the journal sets the
	// rest.
	record markers.Record
	// ask is what the policy decides on (the actor is filled in by submit).
	ask policy.Request
	// defaultClass applies when no rule sets one.
	defaultClass string
	// host is the SSH target as the inventory had it when the call was resolved (nil for
	// HTTP).
	host *fleet.Host
}

func (b *Engine) resolve(c transport.Caller, a api.ExecArgs) (*claim, error) {
	if err := b.validate(&a); err != nil {
		return nil, err
	}
	host, err := b.inv.Host(a.Host)
	if errors.Is(err, fleet.ErrUnknownHost) {
		return nil, &api.ToolError{Code: api.CodeUnknownHost, Message: err.Error()}
	}
	if err != nil {
		return nil, err
	}
	if err := checkHostEnv(a.Env, host); err != nil {
		return nil, err
	}
	cwd := a.Cwd
	if cwd == "" {
		cwd = host.Cwd
	}
	if err := checkStockCall(host, a, cwd); err != nil {
		return nil, err
	}
	materializedCwd := cwd
	if materializedCwd == "" {
		materializedCwd = "~"
	}
	env := a.Env
	if env == nil {
		env = map[string]string{}
	}
	target := intent.SSHTarget(host.Name, host.HostKey.Type(), host.Fingerprint())
	cl := &claim{caller: c, scope: intent.Scope(c, a.RunID)}
	cl.action = intent.ActionRecord{
		Actor:   c.Actor,
		Tool:    "ssh_exec",
		Channel: "ssh",
		Target:  target,
		Account: host.Account,
		Command: shellCommand(a.Command),
		Cwd:     materializedCwd,
		Env:     env,
		Arguments: map[string]any{
			"timeout_s":     a.TimeoutS,
			"operation_key": a.OperationKey,
		},
		IntentScope: cl.scope,
	}
	cl.record = markers.Record{
		IdempotencyKey: a.IdempotencyKey,
		OperationKey:   a.OperationKey,
		Tool:           "ssh_exec",
		Channel:        "ssh",
		Target:         target,
		Account:        host.Account,
		Command:        shellCommand(a.Command),
		Cwd:            cwd,
		Host:           host.Name,
		Env:            a.Env,
		TimeoutSeconds: a.TimeoutS,
	}
	cl.ask = policy.Request{Tool: policy.ToolSSHExec, Host: host.Name, Groups: host.Groups, Command: a.Command}
	cl.defaultClass = config.ClassRemoteCommand
	cl.host = &host
	return cl, nil
}

// Exec runs ssh_exec: it finds the execution this call belongs to — a prior one of the
// same intent, by the matching rule or the idempotency key — or accepts a new one, and waits
// up to wait_s for it. progress, if set, is told about the execution while it waits.
func (b *Engine) Exec(ctx context.Context, c transport.Caller, a api.ExecArgs, progress func(*api.Execution)) (*api.Execution, error) {
	cl, err := b.resolve(c, a)
	if err != nil {
		b.metrics.rejected.WithLabelValues(errorCode(err)).Inc()
		return nil, err
	}
	return b.submit(ctx, cl, b.views.waitFor(a.WaitS), progress)
}

// submit fingerprints a claim and answers it by the matching rule (match.go): the prior
// execution it belongs to — found by its idempotency key if it has one, else by its
// fingerprint in its scope — or a new execution, accepted (journaled) and handed to a driver.
func (b *Engine) submit(ctx context.Context, cl *claim, wait time.Duration, progress func(*api.Execution)) (*api.Execution, error) {
	c := cl.caller
	if c.Actor == "" {
		return nil, &api.ToolError{Code: "unauthenticated", Message: "no caller identity"}
	}
	var err error
	if cl.fingerprint, err = b.fp.Fingerprint(cl.action); err != nil {
		return nil, err
	}
	key := cl.record.IdempotencyKey
	// The lookup and the acceptance of a new execution happen under one intake lock, so two
	// concurrent calls of one intent cannot both create.
	lockKey, by := intent.LockKey(c.Actor, cl.scope, cl.fingerprint), "fingerprint"
	if key != "" {
		lockKey, by = "k\x00"+c.Actor+"\x00"+key, "idempotency_key"
	}
	facts := intent.Facts{Actor: c.Actor, Scope: cl.scope, Fingerprint: cl.fingerprint, IdempotencyKey: key}
	var (
		unlock  func()
		prior   *markers.Record
		outcome intent.Match
	)
	defer func() { unlock() }()
	claimed := cl.record // as it was before matching and deciding, for a match again (ErrRaced)
	for {
		unlock = sync.OnceFunc(b.intake.Lock(lockKey))
		if prior, outcome, err = b.matchCall(cl, &facts); err != nil {
			return nil, err
		}
		wait := b.deliverySettling(prior, outcome)
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
	case outcome == intent.KeyReused:
		unlock()
		b.metrics.rejected.WithLabelValues(api.CodeIdempotencyKeyReused).Inc()
		if err := b.records.joined(ctx, c, cl.scope, prior.ID, outcome); err != nil {
			return nil, journalError(err)
		}
		return nil, &api.ToolError{Code: api.CodeIdempotencyKeyReused, ExecutionID: prior.ID, Message: fmt.Sprintf(
			"idempotency_key %q was used by %s for a different request; nothing was dispatched (use a new key for a new request)", key, prior.ID)}
	case outcome.Joins():
		unlock()
		b.metrics.dedup.WithLabelValues(by).Inc()
		if err := b.records.joined(ctx, c, cl.scope, prior.ID, outcome); err != nil {
			return nil, journalError(err)
		}
		return b.join(ctx, prior, outcome, wait, progress)
	case outcome == intent.NewAttempt:
		cl.record.PreviousAttempt = prior.ID
		cl.record.Evidence = appendBounded(cl.record.Evidence, fmt.Sprintf(
			"new attempt of %s, which failed without effect (same idempotency_key, same request)", prior.ID))
	}
	dec, admitted, err := b.decide(c, cl)
	if err != nil {
		return nil, err
	}
	defer admitted()
	rec, dispatched, err := b.accept(ctx, cl, dec, outcome)
	if errors.Is(err, markers.ErrRaced) {
		// Another replica accepted this intent after it was matched here: match again, to
		// join that execution.
		b.log.Info("another replica accepted this intent first; matching the call again", "actor", c.Actor)
		unlock()
		admitted()
		cl.record = claimed
		return b.submit(ctx, cl, wait, progress)
	}
	if err != nil {
		return nil, err
	}
	if dec.Outcome != policy.Authorized {
		unlock()
		if rec, err = b.applyDecision(ctx, rec, dec); err != nil {
			return nil, err
		}
		return b.views.view(rec), nil
	}
	// The driver starts before the intake lock is released, so a retry of the same intent
	// finds it and attaches instead of starting a reconciling one of its own.
	var d *driver
	if dispatched {
		d = b.drivers.startDispatched(rec)
	} else {
		d = b.drivers.start(rec)
	}
	unlock()
	admitted() // the driver counts towards the actor's limits now
	if d == nil {
		return nil, &api.ToolError{Code: "shutting_down", Message: "the bastion is shutting down; " + rec.ID + " was accepted and will be dispatched after restart"}
	}
	return b.views.await(ctx, d, wait, false, progress), nil
}

// matchCall looks up the prior execution of cl's intent (by key, else by fingerprint) and
// applies the matching rule. Call it under the intake lock.
func (b *Engine) matchCall(cl *claim, facts *intent.Facts) (*markers.Record, intent.Match, error) {
	var prior *markers.Record
	var err error
	if facts.IdempotencyKey != "" {
		prior, err = b.journal.FindByIdempotencyKey(facts.Actor, facts.IdempotencyKey)
	} else {
		prior, err = b.journal.FindByFingerprint(facts.Actor, facts.Scope, facts.Fingerprint)
	}
	switch {
	case errors.Is(err, markers.ErrNotFound):
		prior = nil
	case err != nil:
		return nil, "", journalError(err)
	}
	class := config.Class{}
	if prior != nil {
		class = b.classes.Get(prior.Class)
		if facts.IdempotencyKey != "" {
			if facts.SameRequest, err = b.fp.SameRequest(prior, cl.action, cl.fingerprint); err != nil {
				return nil, "", err
			}
		}
	}
	return prior, intent.Rule(prior, *facts, b.now(), class), nil
}

// deliverySettling is how long a call must wait before a new-intent decision that rests on
// prior's delivery is final (see config.Config.DeliverySettle); 0 when it needs no wait.
func (b *Engine) deliverySettling(prior *markers.Record, outcome intent.Match) time.Duration {
	if outcome != intent.NewExecution || prior == nil || prior.State != markers.Completed || prior.ResultDeliveredAt == nil {
		return 0
	}
	return prior.ResultDeliveredAt.Add(b.cfg.DeliverySettle).Sub(b.now())
}

// accept journals a new execution (synced) before anything else happens to it. When the
// policy authorized it at once, the first states are journaled together, in the one synced
// write before the dispatch boundary (DESIGN.md's two synced writes per execution, the other
// being its outcome): accepted → authorized, and for SSH → dispatched once the host's pooled
// connection is up (dispatched reports that), so its driver execs at once.
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
func (b *Engine) accept(ctx context.Context, cl *claim, dec policy.Decision, match intent.Match) (_ *markers.Record, dispatched bool, _ error) {
	id, err := markers.NewExecutionID(b.now())
	if err != nil {
		return nil, false, err
	}
	r := cl.record
	r.ID, r.Actor, r.IntentScope, r.Fingerprint = id, cl.caller.Actor, cl.scope, cl.fingerprint
	var path []markers.State
	note := "authorized"
	if dec.Outcome == policy.Authorized {
		path = []markers.State{markers.Authorized}
		if cl.host != nil && b.hosts.connected(*cl.host) {
			path = append(path, markers.Dispatched)
			note = "dispatching to " + r.Host
		}
	}
	rec, err := b.records.create(ctx, &r, path, note, b.records.call(ctx, cl.caller, cl.scope, match, false))
	if errors.Is(err, markers.ErrRaced) {
		return nil, false, err
	}
	if err != nil {
		return nil, false, journalError(err)
	}
	b.metrics.accepted.Inc()
	dispatched = rec.State == markers.Dispatched
	if dispatched {
		b.metrics.dispatched.Inc()
	}
	return rec, dispatched, nil
}

// join answers a call that belongs to an existing execution (recover_or_attach): never a
// second dispatch. A live execution is followed by its driver — continued, attached to or
// reconciled — for up to wait; any other is returned as journaled.
func (b *Engine) join(ctx context.Context, prior *markers.Record, outcome intent.Match, wait time.Duration, progress func(*api.Execution)) (*api.Execution, error) {
	switch outcome {
	case intent.Continue, intent.Attach, intent.Reconcile:
		if d := b.drivers.start(prior); d != nil {
			return b.views.await(ctx, d, wait, true, progress), nil
		}
	}
	x := b.views.stored(prior)
	x.Replayed = true
	return x, nil
}

// shellCommand is the argv an ssh_exec command line runs as: the account's shell on the
// host runs it with -c. Records keep this form; commandLine recovers the line.
func shellCommand(line string) []string { return []string{"sh", "-c", line} }

func commandLine(rec *markers.Record) string {
	if len(rec.Command) == 0 {
		return ""
	}
	return rec.Command[len(rec.Command)-1]
}

// journalError reports a failed journal read or write: the call fails closed.
func journalError(err error) error {
	var te *api.ToolError
	if errors.As(err, &te) {
		return err
	}
	return &api.ToolError{Code: api.CodeJournalUnavailable, Message: "the journal could not record this call, so nothing was dispatched: " + err.Error()}
}

func errorCode(err error) string {
	var te *api.ToolError
	if errors.As(err, &te) {
		return te.Code
	}
	return "internal"
}
