package engine

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// What operators read and decide (bastion/operatorapi serves it on the operator socket):
// every actor's executions, their stories and output, the agent runs, the hosts' markers,
// the audit log, and the policy's decision for a call.

// Executions lists executions, newest first. A host filter is applied to each page the
// journal returns, so a page may hold fewer than q.Limit.
func (b *Engine) Executions(q api.ExecutionQuery) (*api.ExecutionPage, error) {
	mq := markers.Query{Newest: true, Limit: q.Limit, Actor: q.Actor, Cursor: q.Cursor, State: q.State, Since: q.Since}
	if q.ReviewRequired {
		mq.State = markers.Unknown
	}
	recs, next, err := b.journal.List(mq)
	if errors.Is(err, markers.ErrInvalidCursor) {
		return nil, api.Invalid("cursor: not one this journal handed out; list again without it")
	}
	if err != nil {
		return nil, err
	}
	page := &api.ExecutionPage{Executions: []*markers.Record{}, Next: next}
	for _, rec := range recs {
		if (q.Host == "" || rec.Host == q.Host) && (!q.ReviewRequired || rec.ReviewRequired) {
			page.Executions = append(page.Executions, rec)
		}
	}
	return page, nil
}

// Execution is one execution for operators: its record, its events, the agent run of its
// scope, and its stored output.
func (b *Engine) Execution(id string) (*api.ExecutionDetail, error) {
	rec, err := b.journal.Get(id)
	if err != nil {
		return nil, err
	}
	events, err := b.journal.Events(id)
	if err != nil {
		return nil, err
	}
	detail := &api.ExecutionDetail{Record: rec, Events: events}
	if run, err := b.journal.Run(rec.Actor, rec.IntentScope); err == nil {
		detail.Run = run
	}
	if rec.ResultRef != "" || rec.IsFleetRun() {
		detail.Output = b.views.stored(rec) // a fleet run's: its rollout
	}
	return detail, nil
}

// ReadOutput is an execution's output from the given offsets, waiting up to wait_s for more
// or the end, as execution_output answers its agent; reading it is not a delivery.
func (b *Engine) ReadOutput(ctx context.Context, id string, a api.OutputArgs) (*api.Execution, error) {
	rec, err := b.journal.Get(id)
	if err != nil {
		return nil, err
	}
	return b.views.output(ctx, rec, a)
}

// Runs lists agent runs, newest first seen first: an actor's, or the one of a scope.
func (b *Engine) Runs(actor, scope string, limit int) (*api.RunPage, error) {
	q := markers.RunQuery{Actor: actor, Limit: limit}
	if scope != "" {
		q.Limit = 1000 // a scope is one run per actor: look through the newest
	}
	runs, err := b.journal.Runs(q)
	if err != nil {
		return nil, err
	}
	page := &api.RunPage{Runs: []*markers.Run{}}
	for _, run := range runs {
		if scope == "" || run.Scope == scope {
			page.Runs = append(page.Runs, run)
		}
	}
	return page, nil
}

// PolicyCheck is the decision the running policy makes for req (its actors, its rules),
// with the host's groups from the inventory and the endpoint's class from the config filled
// in. Nothing runs.
func (b *Engine) PolicyCheck(req policy.Request) (policy.Decision, error) {
	if req.Host != "" {
		h, err := b.inv.Host(req.Host)
		switch {
		case err == nil:
			req.Groups = h.Groups
			if req.Account == h.Account {
				req.Account = "" // the enrolled account needs no grant, as in ssh_exec
			}
		case !errors.Is(err, fleet.ErrUnknownHost):
			return policy.Decision{}, err
		}
	}
	for _, e := range b.cfg.Endpoints {
		if e.Name == req.Endpoint {
			req.EndpointClass = e.Class
		}
	}
	return b.current().policy.Decide(req), nil
}

// ExportAudit writes the journal's event log as JSONL.
func (b *Engine) ExportAudit(w io.Writer) error { return b.journal.Export(w) }

// AuditKey is the journal's audit verifier key.
func (b *Engine) AuditKey() (string, error) {
	return markers.ReadAuditVerifier(b.cfg.AuditKeyPath())
}

// HostMarkers asks a host for its markers: the hostagent's through its control protocol, the
// marker script's with its list command (scriptmarkers.go).
func (b *Engine) HostMarkers(ctx context.Context, name string, q api.MarkerQuery) (*api.MarkerPage, error) {
	host, err := b.hosts.markerHost(name)
	if err != nil {
		return &api.MarkerPage{Host: name}, err
	}
	cq := hostproto.ControlListQuery{State: hostproto.MarkerState(q.State), Cursor: q.Cursor, Limit: q.Limit, Newest: true}
	var page []*hostproto.Marker
	var next string
	if host.Level() == fleet.GuaranteeMarkerScript {
		var list []agentless.Answer
		if list, err = b.hosts.listMarkerScript(ctx, host); err == nil {
			page, next, err = scriptMarkerPage(host, list, scriptMarkerQuery{State: cq.State, Cursor: cq.Cursor, Limit: cq.Limit})
		}
	} else {
		var cc *hostproto.ControlClient
		if cc, err = b.hosts.control(ctx, host); err == nil {
			page, next, err = cc.List(ctx, cq)
			cc.Close()
		}
	}
	return &api.MarkerPage{Host: host.Name, Markers: page, Next: next}, err
}

// HostMarker asks a host for its marker of execution id.
func (b *Engine) HostMarker(ctx context.Context, name, id string) (*hostproto.Marker, error) {
	host, err := b.hosts.markerHost(name)
	if err != nil {
		return nil, err
	}
	var found *hostproto.Marker
	if host.Level() == fleet.GuaranteeMarkerScript {
		found, err = b.hosts.showScriptMarker(ctx, host, id)
	} else {
		found, err = b.hosts.showHostagentMarker(ctx, host, id)
	}
	if err == nil && found == nil {
		err = fmt.Errorf("%w: host %s has no marker %s", markers.ErrNotFound, host.Name, id)
	}
	return found, err
}

// overviewBound bounds each state's part of an Overview (executions list shows them all).
const overviewBound = 200

// Overview is what is in flight and what waits for an operator. When nothing carries the
// executions in flight (read-only or held), each says what a start will do with it.
func (b *Engine) Overview() (*api.Overview, error) {
	o := &api.Overview{Daemon: api.DaemonRunning, StateDir: b.cfg.StateDir,
		InFlight: []api.OverviewItem{}, AwaitingApproval: []api.OverviewItem{}, AwaitingReview: []api.OverviewItem{}}
	switch {
	case b.readOnly:
		o.Daemon = api.DaemonDown
	case b.held:
		o.Daemon = api.DaemonHeld
	}
	if !b.readOnly {
		change := b.current().change
		o.Config = &change
	}
	for _, st := range []markers.State{markers.AwaitingApproval, markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running, markers.Unknown} {
		recs, next, err := b.journal.List(markers.Query{State: st, Limit: overviewBound})
		if err != nil {
			return nil, journalError(err)
		}
		o.Truncated = o.Truncated || next != ""
		for _, r := range recs {
			item := api.OverviewItem{Record: r}
			switch {
			case st == markers.AwaitingApproval:
				o.AwaitingApproval = append(o.AwaitingApproval, item)
			case r.ReviewRequired:
				o.AwaitingReview = append(o.AwaitingReview, item)
			default:
				if o.Daemon != api.DaemonRunning {
					item.AtStart = verdict.AtStart(r, guaranteeOf(b.inv, r))
				}
				o.InFlight = append(o.InFlight, item)
			}
		}
	}
	return o, nil
}
