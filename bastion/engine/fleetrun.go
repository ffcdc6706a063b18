package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/rollout"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// Fleet runs (docs/fleet.md): one fleet_exec call is one journaled run (fr_…) and one
// ordinary execution per host. The run is matched, decided and accepted by intake as an
// execution is (submit): a retry joins it, an idempotency key holds it. Its driver
// (drive_fleet.go) starts its hosts' executions under the rollout's brakes
// (bastion/rollout), each found again after a crash by its deterministic identity
// (childAction), so no host ever gets a second one.

// Bounds of a fleet run's arguments.
const (
	maxFleetTargets     = 64
	maxFleetTargetBytes = 256
	// maxFleetHosts bounds the hosts of one run: its record carries every host with its
	// decision, and every event of the run carries its record.
	maxFleetHosts = 500
)

// Tool and channel names of fleet runs and of their hosts' identities.
const (
	toolFleetExec = "fleet_exec"
	channelFleet  = "fleet"
)

// fleetClaim is what a claim of a fleet run holds besides the record: its hosts, resolved.
type fleetClaim struct {
	hosts []fleet.Host
	// policyActor is the configured actor whose policy and limits decide the run when an
	// operator starts it for that actor; "" for an agent's call (its own actor).
	policyActor string
}

// FleetExec runs fleet_exec: it finds the run this call belongs to — a prior run of the
// same intent, by the matching rule or the idempotency key — or accepts a new one, and waits
// up to wait_s for it. progress, if set, hears about the run while it waits.
func (b *Engine) FleetExec(ctx context.Context, c transport.Caller, a api.FleetArgs, progress func(*api.Execution)) (*api.Execution, error) {
	cl, err := b.intake.resolveFleet(c, a, "")
	if err != nil {
		b.metrics.rejected.WithLabelValues(errorCode(err)).Inc()
		return nil, err
	}
	return b.intake.submit(ctx, cl, b.views.waitFor(a.WaitS), progress)
}

// OperatorFleetRun is `postern fleet run`: a fleet run an operator starts for a configured
// actor, whose policy decides every host (and whose limits the hosts' executions count
// toward). The journal names the operator as the run's actor, so no agent sees or joins
// it; a.RunID (the CLI makes one per invocation) is its scope.
func (b *Engine) OperatorFleetRun(ctx context.Context, op api.Operator, actor string, a api.FleetArgs) (*api.Execution, error) {
	if b.readOnly {
		return nil, errReadOnly
	}
	// Starting commands is a decision that lets them run: not for a uid an agent may run as,
	// whose shell could otherwise pick the actor whose policy decides.
	why, err := b.operatorRefused(op, -1)
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, &api.ToolError{Code: api.CodeNotAnOperator, Message: fmt.Sprintf(
			"%s may not start a fleet run: %s. Run postern fleet run as another user or root, or name who may in [approvals] operators", op.Name, why)}
	}
	if _, ok := b.current().policy.Actor(actor); !ok {
		return nil, api.Invalid("actor %q is not configured: a fleet run is decided by the policy of the actor named with --actor (the configured actors are in [[actors]])", actor)
	}
	if a.RunID == "" {
		return nil, api.Invalid("run_id is required: it names this invocation, so that a retry of it joins the run")
	}
	c := transport.Caller{Actor: op.Name}
	cl, err := b.intake.resolveFleet(c, a, actor)
	if err != nil {
		return nil, err
	}
	return b.intake.submit(ctx, cl, b.views.waitFor(a.WaitS), nil)
}

// resolveFleet checks a fleet_exec call and resolves it to its claim: the targets to their
// hosts (as the inventory has them now), the command checked for every host, the run's
// canonical action and record.
func (in *intake) resolveFleet(c transport.Caller, a api.FleetArgs, policyActor string) (*claim, error) {
	if len(a.Targets) == 0 || len(a.Targets) > maxFleetTargets {
		return nil, api.Invalid("targets: name 1 to %d targets (host names, group:NAME, or labels k=v,k=v)", maxFleetTargets)
	}
	for _, t := range a.Targets {
		if len(t) > maxFleetTargetBytes || !utf8.ValidString(t) || strings.ContainsFunc(t, unicode.IsControl) {
			return nil, api.Invalid("targets: each is text of at most %d bytes without control characters", maxFleetTargetBytes)
		}
	}
	targets, err := rollout.Canonical(a.Targets)
	if err != nil {
		return nil, api.Invalid("targets: %v", err)
	}
	concurrency, err := rollout.ParseLimit(string(a.MaxConcurrency))
	switch {
	case a.MaxConcurrency == "":
		return nil, api.Invalid("max_concurrency is required: how many hosts run at once, a count (5) or a percentage (\"25%%\")")
	case err != nil:
		return nil, api.Invalid("max_concurrency %v", err)
	case concurrency.N == 0:
		return nil, api.Invalid("max_concurrency must be at least 1 (or a percentage above 0%%)")
	}
	maxErrors, err := rollout.ParseLimit(string(a.MaxErrors))
	switch {
	case a.MaxErrors == "":
		return nil, api.Invalid("max_errors is required: how many failed hosts the run tolerates before it starts no more, a count (0 stops at the first failure) or a percentage (\"10%%\")")
	case err != nil:
		return nil, api.Invalid("max_errors %v", err)
	}
	// Targets select among the hosts the deciding actor may use (hosts_list shows them): a
	// group or labels never sweep in a host its policy keeps it from, nor name one to it.
	all, err := in.inv.Hosts()
	if err != nil {
		return nil, err
	}
	actorName := policyActor
	if actorName == "" {
		if actor, ok := in.policyActor(c); ok {
			actorName = actor.Name
		}
	}
	all = slices.DeleteFunc(all, func(h fleet.Host) bool { return !in.mayUseHost(actorName, h) })
	candidates := make([]rollout.Host, 0, len(all))
	byName := make(map[string]fleet.Host, len(all))
	for _, h := range all {
		candidates = append(candidates, rollout.Host{Name: h.Name, Groups: h.Groups, Labels: h.Labels})
		byName[h.Name] = h
	}
	names, err := rollout.Select(targets, candidates)
	if err != nil {
		return nil, &api.ToolError{Code: api.CodeUnknownHost, Message: err.Error() + " (hosts_list shows the hosts you may use, their groups and labels)"}
	}
	if len(names) > maxFleetHosts {
		return nil, api.Invalid("the targets select %d hosts; one run takes at most %d: split it into several runs", len(names), maxFleetHosts)
	}
	// The command is checked as ssh_exec checks it, then for every host: what one host
	// refuses (an env name it drops, what a host without the hostagent cannot honour), the
	// call is refused for, before anything is journaled.
	ea := api.ExecArgs{Host: names[0], Command: a.Command, Cwd: a.Cwd, Env: a.Env, TimeoutS: a.TimeoutS, CallOptions: a.CallOptions}
	if err := in.validate(&ea); err != nil {
		return nil, err
	}
	fc := &fleetClaim{policyActor: policyActor}
	rec := markers.Record{
		IdempotencyKey: a.IdempotencyKey, Reason: a.Reason,
		Tool: toolFleetExec, Channel: channelFleet, Target: "fleet: " + strings.Join(targets, " "),
		Command: shellCommand(a.Command), Cwd: a.Cwd, Env: a.Env, TimeoutSeconds: a.TimeoutS,
		Fleet: &markers.Rollout{Targets: targets, MaxConcurrency: concurrency.String(), MaxErrors: maxErrors.String()},
	}
	for _, name := range names {
		h := byName[name]
		if err := checkHostEnv(a.Env, h); err != nil {
			return nil, err
		}
		cwd := a.Cwd
		if cwd == "" {
			cwd = h.Cwd
		}
		if err := checkWire(ea, cwd); err != nil {
			return nil, err
		}
		if err := checkAgentlessCall(h, ea, cwd); err != nil {
			return nil, err
		}
		fc.hosts = append(fc.hosts, h)
		rec.Fleet.Hosts = append(rec.Fleet.Hosts, markers.RolloutHost{
			Name: h.Name, Target: intent.SSHTarget(h.Name, h.HostKey.Type(), h.Fingerprint()), Account: h.Account,
		})
	}
	env := a.Env
	if env == nil {
		env = map[string]string{}
	}
	cl := &claim{caller: c, scope: intent.Scope(c, a.RunID), record: rec, fleet: fc, defaultClass: config.ClassRemoteCommand}
	cl.action = intent.ActionRecord{
		Actor: c.Actor, Tool: toolFleetExec, Channel: channelFleet, Target: rec.Target,
		Command: rec.Command, Cwd: a.Cwd, Env: env,
		Arguments: map[string]any{
			"timeout_s":       a.TimeoutS,
			"max_concurrency": rec.Fleet.MaxConcurrency,
			"max_errors":      rec.Fleet.MaxErrors,
		},
		IntentScope: cl.scope,
	}
	return cl, nil
}

// decideFleet is decide for a fleet run: the policy decides every host as it decides an
// ssh_exec of the command there, and the run is what its hosts need — rejected only when
// every host is; awaiting approval when any host needs one (one approval stands for the
// run, and shows its hosts); else authorized. A host the policy rejects is a failed host of
// the run, its refusal the cause. Its daily quota must hold every host the run may start.
func (in *intake) decideFleet(c transport.Caller, cl *claim) (policy.Decision, func(), error) {
	// One policy decides every host of the run, even if a reload changes it meanwhile.
	pol := in.current().policy
	var actor policy.Actor
	var ok bool
	if cl.fleet.policyActor != "" {
		actor, ok = pol.Actor(cl.fleet.policyActor)
	} else {
		actor, ok = in.policyActor(c)
	}
	rec := &cl.record
	if ok {
		rec.PolicyActor = actor.Name
	}
	var counts [3]int // authorized, awaiting approval, rejected
	var approvalRules, rejections []string
	classes := map[string]bool{}
	if ok && len(actor.Tools) > 0 && !slices.Contains(actor.Tools, toolFleetExec) {
		// The ladder decides each host as an ssh_exec; the run itself is a tool of its own.
		rule := fmt.Sprintf("actor %s: tool %s not allowed", actor.Name, toolFleetExec)
		for i := range rec.Fleet.Hosts {
			rec.Fleet.Hosts[i].Decision, rec.Fleet.Hosts[i].Rule = string(policy.Rejected), rule
		}
		counts[2] = len(rec.Fleet.Hosts)
		rejections = append(rejections, rule)
	} else {
		for i, h := range cl.fleet.hosts {
			ask := policy.Request{Tool: policy.ToolSSHExec, Host: h.Name, Groups: h.Groups, Command: commandLine(rec)}
			if ok {
				ask.Actor = actor.Name
			}
			dec := pol.Decide(ask)
			rh := &rec.Fleet.Hosts[i]
			rh.Decision, rh.Rule, rh.Class = string(dec.Outcome), dec.Rule, dec.Class
			if rh.Class == "" {
				rh.Class = cl.defaultClass
			}
			switch dec.Outcome {
			case policy.Authorized:
				counts[0]++
			case policy.AwaitingApproval:
				counts[1]++
				approvalRules = appendNew(approvalRules, dec.Rule)
			default:
				counts[2]++
				rejections = appendNew(rejections, dec.Rule)
				continue
			}
			classes[rh.Class] = true
		}
	}
	dec := policy.Decision{Outcome: policy.Authorized, Rule: "every host authorized"}
	switch {
	case counts[2] == len(rec.Fleet.Hosts):
		dec = policy.Decision{Outcome: policy.Rejected, Rule: strings.Join(rejections, "; ")}
	case counts[1] > 0:
		dec = policy.Decision{Outcome: policy.AwaitingApproval, Rule: strings.Join(approvalRules, "; ")}
	}
	rec.Class = in.strictestClass(classes, cl.defaultClass)
	rec.Decision, rec.Rule = string(dec.Outcome), dec.Rule
	rec.Evidence = appendBounded(rec.Evidence, fmt.Sprintf("policy, host by host: %d authorized, %d awaiting approval, %d rejected", counts[0], counts[1], counts[2]))
	if counts[2] > 0 && dec.Outcome != policy.Rejected {
		rec.Evidence = appendBounded(rec.Evidence, "rejected hosts fail in the run, each with its refusal: "+strings.Join(rejections, "; "))
	}
	rec.Evidence = appendBounded(rec.Evidence, fmt.Sprintf("policy: %s (%s)", dec.Outcome, dec.Rule))
	if dec.Outcome == policy.Rejected || !ok || (actor.DailyQuota == 0 && actor.RunDailyQuota == 0) || cl.fleet.policyActor != "" {
		// An operator's run is not an agent's to ration: its quota counts the agent's calls.
		return dec, func() {}, nil
	}
	release := sync.OnceFunc(in.locks.Lock("a\x00" + actor.Name)) // submit may call it twice
	if err := in.checkFleetQuota(c, actor, cl.scope, counts[0]+counts[1]); err != nil {
		release()
		return dec, nil, err
	}
	return dec, release, nil
}

// checkFleetQuota refuses a run whose hosts would take actor past a daily quota: all of
// them count, as each host's execution does.
func (in *intake) checkFleetQuota(c transport.Caller, actor policy.Actor, scope string, hosts int) error {
	all, run, err := in.quotaUsed(c.Actor, actor, scope)
	if err != nil {
		return journalError(err)
	}
	var why string
	switch {
	case actor.DailyQuota > 0 && all+hosts > actor.DailyQuota:
		why = fmt.Sprintf("this run's %d hosts would take actor %s past its daily quota of %d executions (%d used)", hosts, actor.Name, actor.DailyQuota, all)
	case actor.RunDailyQuota > 0 && run+hosts > actor.RunDailyQuota:
		why = fmt.Sprintf("this run's %d hosts would take this agent run of actor %s past its daily quota of %d executions (run_daily_quota; %d used)", hosts, actor.Name, actor.RunDailyQuota, run)
	default:
		return nil
	}
	in.metrics.rejected.WithLabelValues(api.CodeQuotaExceeded).Inc()
	return &api.ToolError{Code: api.CodeQuotaExceeded, Message: why + " (resets at 00:00 UTC; rejected executions do not count); nothing was started: target fewer hosts"}
}

// strictestClass is the class of a run whose hosts' executions have classes: the one kept
// longest (then the one with the longest attach window), so the run is matched and kept
// at least as long as any of its hosts.
func (c *core) strictestClass(classes map[string]bool, def string) string {
	known := c.current().classes
	best := ""
	for name := range classes {
		if best == "" {
			best = name
			continue
		}
		a, b := known.Get(name), known.Get(best)
		if a.Retention > b.Retention || a.Retention == b.Retention && (a.AttachWindow > b.AttachWindow || a.AttachWindow == b.AttachWindow && name < best) {
			best = name
		}
	}
	if best == "" {
		return def
	}
	return best
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// childAction is the canonical action of host h's execution in fleet run run: who (the
// run's actor and scope), what (the run's command, cwd, env and timeout) and where (the host
// and account as the run was accepted), and which run. Its fingerprint is the execution's
// identity: computed from the run's record alone, it finds the same execution after any
// crash or failover, whatever the inventory says by then, and no other call has it.
func childAction(run *markers.Record, h markers.RolloutHost) intent.ActionRecord {
	env := run.Env
	if env == nil {
		env = map[string]string{}
	}
	return intent.ActionRecord{
		Actor: run.Actor, Tool: toolFleetExec, Channel: "ssh", Target: h.Target, Account: h.Account,
		Command: run.Command, Cwd: run.Cwd, Env: env,
		Arguments:   map[string]any{"fleet_run": run.ID, "timeout_s": run.TimeoutSeconds},
		IntentScope: run.IntentScope,
	}
}

// fleetChild is one host of a fleet run and its execution (nil: not started).
type fleetChild struct {
	host markers.RolloutHost
	fp   string
	rec  *markers.Record
}

// fleetChildren reads the executions of run's hosts from the journal, in the run's order.
func (c *core) fleetChildren(run *markers.Record) ([]fleetChild, error) {
	out := make([]fleetChild, len(run.Fleet.Hosts))
	for i, h := range run.Fleet.Hosts {
		out[i].host = h
		if err := c.findChild(run, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// findChild looks up the execution of ch's host, by its identity.
func (c *core) findChild(run *markers.Record, ch *fleetChild) error {
	if c.fp == nil {
		return errors.New("the fingerprint key could not be read, so a fleet run's executions cannot be found")
	}
	if ch.fp == "" {
		fp, err := c.fp.Fingerprint(childAction(run, ch.host))
		if err != nil {
			return err
		}
		ch.fp = fp
	}
	rec, err := c.journal.FindByFingerprint(run.Actor, run.IntentScope, ch.fp)
	var removed *markers.RemovedError
	switch {
	case errors.As(err, &removed):
		// Retention removed the host's execution long after it ended: the host was started
		// (its fingerprint names this run alone), so it is never started again. Its
		// tombstone stands for it.
		t := removed.Tombstone
		ch.rec = &markers.Record{
			ID: t.ID, State: t.State, Host: ch.host.Name, FleetRun: run.ID, CreatedAt: t.CreatedAt,
			Evidence: []string{"removed by the journal's retention at " + t.RemovedAt.UTC().Format(time.RFC3339) + "; its outcome and output are gone"},
		}
		return nil
	case errors.Is(err, markers.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	// The fingerprint names this run (childAction): whatever the record says — one rebuilt
	// from its host's marker by a recovery from the hosts names no run — it is this host's.
	ch.rec = rec
	return nil
}

// fleetProgress is the run's progress as the brakes see it, and its limits resolved.
func fleetProgress(run *markers.Record, children []fleetChild) (p rollout.Progress, concurrency, tolerated int) {
	p.Total = len(children)
	p.Cancelled = run.Fleet.CancelledBy != ""
	for _, ch := range children {
		if ch.rec != nil {
			p.Add(ch.rec.State, ch.rec.IsError, ch.rec.ReviewRequired)
		}
	}
	conc, err := rollout.ParseLimit(run.Fleet.MaxConcurrency)
	if err != nil {
		conc = rollout.Limit{N: 1} // checked when the run was accepted
	}
	errs, err := rollout.ParseLimit(run.Fleet.MaxErrors)
	if err != nil {
		errs = rollout.Limit{}
	}
	return p, rollout.Concurrency(conc, p.Total), errs.Of(p.Total)
}

// fleetView is a fleet run as the surfaces return it: its record, and its rollout as its
// hosts' executions stand now.
func (v *views) fleetView(run *markers.Record) *api.Execution {
	x := &api.Execution{
		ExecutionID: run.ID, State: string(run.State), ResultDelivered: run.ResultDeliveredAt != nil,
		Command: commandLine(run), Class: run.Class, IsError: run.IsError, AcceptedAt: run.CreatedAt,
		Evidence: run.Evidence,
	}
	if t, ok := run.StateTimes[markers.Dispatched]; ok {
		x.DispatchedAt = &t
	}
	if t := intent.FinishedAt(run); !t.IsZero() {
		x.FinishedAt = &t
	}
	f := &api.FleetRun{
		Targets: run.Fleet.Targets, MaxConcurrency: run.Fleet.MaxConcurrency, MaxErrors: run.Fleet.MaxErrors,
		Counts: map[string]int{}, Hosts: []api.FleetHost{},
	}
	x.Fleet = f
	children, err := v.fleetChildren(run)
	if err != nil {
		x.Next = "Its hosts' executions could not be read now (" + err.Error() + "); ask again."
		return x
	}
	p, conc, tolerated := fleetProgress(run, children)
	f.Total, f.Concurrency, f.Tolerated, f.Failures = p.Total, conc, tolerated, p.Failed
	for _, ch := range children {
		h := api.FleetHost{Host: ch.host.Name, State: api.NotStarted}
		if r := ch.rec; r != nil {
			h.ExecutionID, h.State = r.ID, string(r.State)
			if r.ExitCode != nil {
				code := *r.ExitCode
				h.ExitCode = &code
			}
			if failedHost(r) {
				h.Cause = v.hostCause(r)
				f.Failed = append(f.Failed, h)
			}
		}
		f.Counts[h.State]++
		f.Hosts = append(f.Hosts, h)
	}
	if markers.JournalGraph.Terminal(run.State) || run.State == markers.Running || run.State == markers.Dispatched {
		step := rollout.Next(p, conc, tolerated)
		f.Braked = step.Braked
		if step.Done && markers.JournalGraph.Terminal(run.State) {
			f.Outcome = string(step.Outcome)
		}
	}
	x.Next = fleetNext(run, f)
	return x
}

// failedHost reports whether a host's execution counts as failed in its run's answer:
// ended in failure, or unknown.
func failedHost(r *markers.Record) bool {
	switch r.State {
	case markers.Failed, markers.Rejected, markers.TimedOut, markers.Cancelled, markers.Unknown:
		return true
	}
	return r.State == markers.Completed && r.IsError
}

// hostCause is why a host of a fleet run failed: for a command that ran and failed, the
// last line it wrote to stderr (what an agent needs first); else the execution's cause.
func (v *views) hostCause(r *markers.Record) string {
	if r.State == markers.Completed || r.State == markers.TimedOut {
		if raw, err := v.journal.Result(r.ID); err == nil {
			var res storedResult
			if json.Unmarshal(raw, &res) == nil {
				if line := lastLineOf(res.Stderr); line != "" {
					return "stderr: " + line
				}
			}
		}
	}
	return cause(r, nil)
}

// lastLineOf is the last non-empty line of b, at most maxCauseBytes of it.
func lastLineOf(b []byte) string {
	s := strings.TrimRight(string(b), "\r\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > maxCauseBytes {
		s = strings.ToValidUTF8(s[len(s)-maxCauseBytes:], "")
	}
	return s
}

// fleetNext tells the agent what is safe to do with a fleet run, by its state.
func fleetNext(run *markers.Record, f *api.FleetRun) string {
	read := fmt.Sprintf("Read it again with execution_status {execution_id: %q}; one host's output with execution_output {execution_id: \"ex_…\"} (its id in hosts)", run.ID)
	switch run.State {
	case markers.AwaitingApproval:
		return fmt.Sprintf("Waiting for an operator's approval of the whole run (%d hosts, one approval for all). Wait with execution_status {execution_id: %q}; do not call fleet_exec again for this — a retry returns this same run.", f.Total, run.ID)
	case markers.Rejected:
		return "Rejected: the policy refuses it on every host; nothing ran anywhere. A retry returns this same rejection."
	case markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running:
		if f.Braked {
			return "Braked: no new host starts (max_errors exceeded, or cancelled); the running ones finish. " + read + "."
		}
		return "The rollout is in progress. " + read + "; execution_cancel on " + run.ID + " stops it. Do not call fleet_exec again for this — a retry joins this run."
	case markers.Cancelled:
		return fmt.Sprintf("Cancelled: no host started after the cancel, and the running ones were asked to stop. %d hosts never started. %s.", f.Counts[api.NotStarted], read)
	case markers.Failed:
		return "Nothing ran on any host: every host failed before its command started (see failed). Fix the cause, then call again."
	}
	switch f.Outcome {
	case string(rollout.Completed):
		return "Finished: every host succeeded; the outcome above is final."
	case string(rollout.Stopped):
		return fmt.Sprintf("Stopped: more hosts failed than max_errors (%s) tolerates, so %d hosts never started. %s. To go on, fix the cause and call fleet_exec again with targets naming the hosts that did not succeed.", f.MaxErrors, f.Counts[api.NotStarted], read)
	}
	return fmt.Sprintf("Finished: %d hosts failed (see failed). %s. To run again where it failed, call fleet_exec with targets naming those hosts.", len(f.Failed), read)
}

// fleetOutput is execution_output of a fleet run: its rollout, once it changed (a host
// started or ended) or ended, or after wait. Each host's output is its execution's.
func (v *views) fleetOutput(ctx context.Context, run *markers.Record, wait time.Duration) *api.Execution {
	d := v.drivers.live(run.ID)
	if d == nil && (run.State == markers.Dispatched || run.State == markers.Running) {
		d = v.drivers.start(run)
	}
	if d != nil {
		deadline := time.NewTimer(wait)
		defer deadline.Stop()
		select {
		case <-d.changes():
		case <-d.done:
		case <-deadline.C:
		case <-ctx.Done():
		}
		run = d.record()
	}
	return v.fleetView(run)
}
