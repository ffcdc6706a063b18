package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// cancelWait is how long execution_cancel waits for the host to confirm.
const cancelWait = 15 * time.Second

// Cancel stops an execution: one not yet dispatched is cancelled in the journal; one on a
// host is cancelled there (TERM, then KILL after the host's grace period) and its outcome
// follows from the host's marker; one its host never started (no marker) is cancelled in the
// journal by its driver instead of being dispatched again. An HTTP request cannot be recalled.
func (b *Engine) Cancel(ctx context.Context, c transport.Caller, id string) (*api.Execution, error) {
	rec, err := b.views.own(c, id)
	if err != nil {
		return nil, err
	}
	if rec.IsFleetRun() {
		return b.cancelFleet(ctx, c.Actor, rec) // drive_fleet.go
	}
	switch rec.State {
	case markers.Accepted, markers.Authorized:
		next, err := b.records.cancelledBeforeDispatch(ctx, rec, c.Actor)
		if err == nil {
			b.drivers.slotsChanged() // a queued execution's driver lets go
			return b.views.view(next), nil
		}
		if !errors.Is(err, markers.ErrConflict) {
			return nil, journalError(err)
		}
		rec = next // the driver dispatched it meanwhile: cancel it on the host
	case markers.Dispatched, markers.Running, markers.Unknown:
	case markers.AwaitingApproval:
		// The journal has no edge from awaiting_approval to cancelled: a decision ends it.
		x := b.views.stored(rec)
		x.Next = "It awaits an operator's approval and has not run; it cannot be cancelled, and it runs only if approved. An operator denies it (postern deny), or approval_timeout rejects it."
		return x, nil
	default:
		x := b.views.stored(rec)
		x.Next = "It had already ended (" + string(rec.State) + "); nothing to cancel."
		return x, nil
	}
	if rec.Channel == "http" {
		x := b.views.stored(rec)
		x.Next = "An HTTP request that was sent cannot be recalled; its outcome follows from the endpoint's answer. Check execution_status."
		return x, nil
	}
	if b.held {
		return nil, errHeld("cancelling " + id + " means asking " + rec.Host + " to stop it")
	}
	host, err := hostOf(b.inv, rec)
	if errors.Is(err, fleet.ErrUnknownHost) {
		te := api.Refusal{Code: api.CodeUnknownHost, Reason: fmt.Sprintf("host %s is no longer enrolled, so the cancel cannot reach it", rec.Host),
			Next: "Its outcome stays as the journal has it; check execution_status"}.Err()
		te.ExecutionID = id
		return nil, te
	}
	if err != nil {
		return nil, err
	}
	b.drivers.requestStop(id)
	if err := b.hosts.cancel(ctx, host, id); err != nil {
		x := b.views.stored(rec)
		x.Next = fmt.Sprintf("The cancel could not be delivered to %s (%v); the command may still be running. If the host turns out never to have started it, it is cancelled instead of sent again. Try again, or check execution_status.", host.Name, err)
		return x, nil
	}
	d := b.drivers.start(rec)
	if d == nil {
		return b.views.stored(rec), nil
	}
	return b.views.await(ctx, d, cancelWait, false, nil), nil
}

// List returns the caller's executions, newest first.
func (b *Engine) List(c transport.Caller, a api.ListArgs) (*api.ListResult, error) {
	q := markers.Query{Actor: c.Actor, Newest: true, Limit: 50}
	if a.State != "" {
		if !markers.JournalGraph.Has(markers.State(a.State)) {
			return nil, api.Invalid("unknown state %q", a.State)
		}
		q.State = markers.State(a.State)
	}
	if a.Since != "" {
		t, err := time.Parse(time.RFC3339, a.Since)
		if err != nil {
			return nil, api.Invalid("since: want an RFC 3339 time: %v", err)
		}
		q.Since = t
	}
	if a.Limit < 0 || a.Limit > 500 {
		return nil, api.Invalid("limit must be in 0..500")
	}
	if a.Limit > 0 {
		q.Limit = a.Limit
	}
	want := q.Limit
	out := &api.ListResult{Executions: []*api.Execution{}}
	for {
		recs, next, err := b.journal.List(q)
		if err != nil {
			return nil, journalError(err)
		}
		for _, r := range recs {
			if a.Host == "" || r.Host == a.Host {
				out.Executions = append(out.Executions, b.views.view(r))
			}
		}
		if next == "" || len(out.Executions) >= want {
			break
		}
		q.Cursor = next
	}
	if len(out.Executions) > want {
		out.Executions = out.Executions[:want]
	}
	return out, nil
}

// Hosts lists a page of the enrolled hosts (for operators).
func (b *Engine) Hosts(a api.HostsArgs) (*api.HostsResult, error) {
	hosts, err := b.inv.Hosts()
	if err != nil {
		return nil, err
	}
	return b.hostsResult(hosts, a)
}

// HostsOf lists a page of the enrolled hosts caller may use (hosts_list): an agent is shown
// no host its policy would refuse it, so it never picks one.
func (b *Engine) HostsOf(c transport.Caller, a api.HostsArgs) (*api.HostsResult, error) {
	hosts, err := b.usableHosts(c)
	if err != nil {
		return nil, err
	}
	return b.hostsResult(hosts, a)
}

// hostsResult is the page of hosts a asks for.
func (b *Engine) hostsResult(hosts []fleet.Host, a api.HostsArgs) (*api.HostsResult, error) {
	sel, err := fleet.ParseSelector(a.Labels)
	if err != nil {
		return nil, api.Invalid("%v", err)
	}
	page, next, total, err := fleet.PageHosts(hosts, sel, a.Cursor, a.Limit)
	if err != nil {
		return nil, api.Invalid("%v", err)
	}
	out := &api.HostsResult{Hosts: []api.HostInfo{}, Total: total, NextCursor: next}
	for _, h := range page {
		out.Hosts = append(out.Hosts, api.HostInfo{
			Name: h.Name, Addr: h.Addr, Account: h.Account, Description: h.Description, Labels: h.Labels, OS: h.OS,
			HostKey: h.Fingerprint(), HostKeyType: h.KeyType(), Groups: h.Groups, Connected: b.pool.Connected(h.Name),
			DefaultCwd: h.Cwd, Guarantee: string(h.Level()),
		})
	}
	return out, nil
}

// usableHosts are the enrolled hosts caller's configured actor may use, sorted by name.
func (co *core) usableHosts(c transport.Caller) ([]fleet.Host, error) {
	hosts, err := co.inv.Hosts()
	if err != nil {
		return nil, err
	}
	actor := ""
	if a, ok := co.policyActor(c); ok {
		actor = a.Name
	}
	return slices.DeleteFunc(hosts, func(h fleet.Host) bool { return !co.mayUseHost(actor, h) }), nil
}

// mayUseHost reports whether the policy lets actor (a configured actor's name, "" for none)
// run commands on h at all: the ladder, asked about h, does not stop at the actor's
// permissions (its tools and hosts, by name or group). Rules about commands do not hide a
// host: they judge each command, and say why when they refuse one.
func (co *core) mayUseHost(actor string, h fleet.Host) bool {
	dec := co.current().policy.Decide(policy.Request{Actor: actor, Tool: policy.ToolSSHExec, Host: h.Name, Groups: h.Groups, Command: "true"})
	return dec.Outcome != policy.Rejected || dec.Code != policy.CodeNotAllowed && dec.Code != policy.CodeActorUnknown
}

// Exec runs ssh_exec: it finds the execution this call belongs to — a prior one of the
// same intent, by the matching rule or the idempotency key — or accepts a new one, and waits
// up to wait_s for it. progress, if set, is told about the execution while it waits.
func (b *Engine) Exec(ctx context.Context, c transport.Caller, a api.ExecArgs, progress func(*api.Execution)) (*api.Execution, error) {
	cl, err := b.intake.resolveSSH(c, a)
	if err != nil {
		b.metrics.rejected.WithLabelValues(errorCode(err)).Inc()
		return nil, err
	}
	return b.intake.submit(ctx, cl, b.views.waitFor(a.WaitS), progress)
}

// HTTPEnabled reports whether an HTTP plugin is configured: http_request exists.
func (b *Engine) HTTPEnabled() bool { return b.plugin != nil }

// HTTPRequest runs http_request: the same identity, matching rule and lifecycle as ssh_exec,
// performed by the HTTP plugin.
func (b *Engine) HTTPRequest(ctx context.Context, c transport.Caller, a api.HTTPArgs, progress func(*api.Execution)) (*api.Execution, error) {
	cl, err := b.intake.resolveHTTP(c, a)
	if err != nil {
		b.metrics.rejected.WithLabelValues(errorCode(err)).Inc()
		return nil, err
	}
	return b.intake.submit(ctx, cl, b.views.waitFor(a.WaitS), progress)
}

// progressEvery is how often a waiting call reports progress.
const progressEvery = time.Second

// Status returns an execution's record and last output. For one whose outcome is unknown it
// asks the host again first, waiting up to a third of the default wait for the answer.
func (b *Engine) Status(ctx context.Context, c transport.Caller, id string) (*api.Execution, error) {
	wait := b.current().cfg.DefaultWait / 3
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
