package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// Recovery from the hosts (docs/operations.md, "Recovering from the hosts"): after the
// journal was lost, or restored from a backup older than what the hosts ran since, every
// enrolled host is asked for its markers, and what the journal must learn is decided per
// execution (verdict.RecoverOn) and, confirmed, journaled (records.recovered,
// records.reviewRecovered). It runs with the bastion down, on an engine opened held: nothing
// is sent to a host but the markers queries.

// recoveredOf is the execution rebuilt from a host's marker whose fingerprint is fp, nil if
// none. Only records rebuilt from a marker are indexed by the fingerprint alone (their actor
// and scope are empty), and it looks only while the journal holds such an execution awaiting
// review (core.recovered), so other calls pay nothing for it.
func (in *intake) recoveredOf(fp string) (*markers.Record, error) {
	if fp == "" || !in.recovered.Load() {
		return nil, nil
	}
	rec, err := in.journal.FindByFingerprint("", "", fp)
	switch {
	case errors.Is(err, markers.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case rec.RecoveredFrom == "":
		return nil, nil
	}
	return rec, nil
}

// maxRecoveryPages bounds how many pages of 1000 markers recovery reads of one host.
const maxRecoveryPages = 1000

// RecoverFromHosts asks every enrolled host for its markers and decides what the journal must
// learn of each execution a host has a marker of, or that the journal shows unfinished; with
// q.Confirm it journals it. A host that cannot be asked is reported (Problem) and its
// executions left as they are: running it again once the host answers is safe, since what
// was journaled is left alone the second time. The engine must be held (Options.Hold), with
// no other bastion on the journal.
func (b *Engine) RecoverFromHosts(ctx context.Context, q api.RecoveryQuery) (*api.Recovery, error) {
	if !b.held || b.readOnly {
		return nil, errors.New("recovery from the hosts runs with the bastion down, on an engine opened held (postern recover)")
	}
	hosts, err := b.inv.Hosts()
	if err != nil {
		return nil, err
	}
	oldest, newest, err := b.journalSpan()
	if err != nil {
		return nil, journalError(err)
	}
	out := &api.Recovery{Confirmed: q.Confirm, Hosts: []api.RecoveryHost{}, Items: []api.RecoveryItem{}, Counts: map[string]int{}}
	listed := map[string]bool{}
	unasked := map[string]string{}
	for _, h := range hosts {
		rh := api.RecoveryHost{Name: h.Name, Guarantee: string(h.Level())}
		ms, err := b.hostMarkers(ctx, h, q.Since)
		switch {
		case h.Level() == fleet.GuaranteeNone:
			rh.Note = "keeps no markers (guarantee level none): nothing on it records what ran"
		case err != nil:
			rh.Problem = err.Error()
			unasked[h.Name] = err.Error()
		case h.Level() == fleet.GuaranteeMarkerScript:
			rh.Note = "its marker script keeps the state and exit code only: no command, no times, no fingerprint (a retry of a call it ran is not matched to it)"
		}
		rh.Markers = len(ms)
		out.Hosts = append(out.Hosts, rh)
		for _, m := range ms {
			listed[m.ID] = true
			rec, err := b.journal.Get(m.ID)
			if errors.Is(err, markers.ErrNotFound) {
				rec = nil
			} else if err != nil {
				return nil, journalError(err)
			}
			removed := false
			if at, ok := markers.ExecutionIDTime(m.ID); ok && rec == nil {
				removed = verdict.RemovedSpan(at, oldest, newest)
			}
			b.recoverOne(ctx, out, q.Confirm, h, rec, m, removed)
		}
	}
	// What the journal shows unfinished and no host listed.
	for _, st := range []markers.State{markers.Accepted, markers.Authorized, markers.AwaitingApproval, markers.Dispatched, markers.Running, markers.Unknown} {
		cursor := ""
		for {
			recs, next, err := b.journal.List(markers.Query{State: st, Limit: 500, Cursor: cursor})
			if err != nil {
				return nil, journalError(err)
			}
			for _, rec := range recs {
				if listed[rec.ID] {
					continue // decided with its marker, or on an earlier page (a review moved it to unknown)
				}
				listed[rec.ID] = true
				if why, ok := unasked[rec.Host]; ok && rec.Channel != "http" {
					out.Items = append(out.Items, itemOf(rec, nil, verdict.Recovery{Do: verdict.RecoverLeave,
						Note: fmt.Sprintf("%s could not be asked (%s): run postern recover again once it answers", rec.Host, why)}))
					out.Counts["unasked"]++
					continue
				}
				var host fleet.Host
				if rec.Channel != "http" {
					if host, err = hostOf(b.inv, rec); err != nil {
						out.Items = append(out.Items, itemOf(rec, nil, verdict.Recovery{Do: verdict.RecoverLeave, Note: err.Error()}))
						continue
					}
				}
				b.recoverOne(ctx, out, q.Confirm, host, rec, nil, false)
			}
			if next == "" {
				break
			}
			cursor = next
		}
	}
	return out, nil
}

// journalSpan is when the journal's oldest and newest executions were accepted (zero when
// it holds none): what verdict.RemovedSpan needs to tell an execution retention removed.
func (b *Engine) journalSpan() (oldest, newest time.Time, err error) {
	for _, newestFirst := range []bool{false, true} {
		recs, _, err := b.journal.List(markers.Query{Newest: newestFirst, Limit: 1})
		if err != nil || len(recs) == 0 {
			return time.Time{}, time.Time{}, err
		}
		at, ok := markers.ExecutionIDTime(recs[0].ID)
		if !ok {
			at = recs[0].CreatedAt
		}
		if newestFirst {
			newest = at
		} else {
			oldest = at
		}
	}
	return oldest, newest, nil
}

// recoverOne decides (and, confirmed, journals) one execution: rec as the journal has it
// (nil: unknown to it), m its host's marker (nil: none), removed whether the journal's
// retention removed it (verdict.RemovedSpan). Executions whose journal record agrees with
// the host, and those retention removed, are only counted.
func (b *Engine) recoverOne(ctx context.Context, out *api.Recovery, confirm bool, host fleet.Host, rec *markers.Record, m *hostproto.Marker, removed bool) {
	level, name := host.Level(), host.Name
	if rec != nil && rec.Channel == "http" {
		level, name = "", rec.Host
	}
	d := verdict.RecoverOn(rec, m, level, name, removed)
	if removed && d.Do == verdict.RecoverLeave && rec == nil {
		out.Counts["removed"]++ // ended, and past its class's retention: the journal knew it
		return
	}
	if d.Do == verdict.RecoverLeave && (rec == nil || markers.JournalGraph.Terminal(rec.State)) {
		out.Counts["known"]++ // it never ran, or the journal knows how it ended
		return
	}
	item := itemOf(rec, m, d)
	item.Host = name
	out.Counts[string(d.Do)]++
	if confirm && d.Do != verdict.RecoverLeave {
		var err error
		switch d.Do {
		case verdict.RecoverJournal:
			_, err = b.records.recovered(ctx, recoveredRecord(host, m), d.Note)
		case verdict.RecoverReview:
			_, err = b.records.reviewRecovered(ctx, rec, d.Note, markerEvidence(name, m))
		}
		if err != nil {
			item.Error = err.Error()
		} else {
			item.Journaled = true
		}
	}
	out.Items = append(out.Items, item)
}

func itemOf(rec *markers.Record, m *hostproto.Marker, d verdict.Recovery) api.RecoveryItem {
	it := api.RecoveryItem{Do: string(d.Do), Note: d.Note}
	if rec != nil {
		it.ExecutionID, it.Host, it.Journal, it.Command = rec.ID, rec.Host, rec.State, commandLine(rec)
	}
	if m != nil {
		it.ExecutionID, it.Marker = m.ID, m.State
		if it.Command == "" && len(m.Command) > 0 {
			it.Command = m.Command[len(m.Command)-1]
		}
	}
	return it
}

// hostMarkers lists every marker host keeps (created from since on, if set): the
// hostagent's through its control protocol, the marker script's with its list command; none
// for a host at level none.
func (b *Engine) hostMarkers(ctx context.Context, h fleet.Host, since time.Time) ([]*hostproto.Marker, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	switch h.Level() {
	case fleet.GuaranteeNone:
		return nil, nil
	case fleet.GuaranteeMarkerScript:
		list, err := b.hosts.listMarkerScript(ctx, h)
		if err != nil {
			return nil, err
		}
		out := make([]*hostproto.Marker, 0, len(list))
		for _, a := range list {
			out = append(out, scriptMarker(h, a))
		}
		return out, nil
	}
	cc, err := b.hosts.control(ctx, h)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	var out []*hostproto.Marker
	cursor := ""
	for range maxRecoveryPages {
		page, next, err := cc.List(ctx, hostproto.ControlListQuery{Since: since, Limit: 1000, Cursor: cursor})
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" {
			return out, nil
		}
		cursor = next
	}
	return nil, fmt.Errorf("%s lists more than %d markers: narrow it with --since", h.Name, maxRecoveryPages*1000)
}

// recoveredRecord is the journal record rebuilt from host's marker m of an execution the
// journal does not know (records.recovered): what the marker kept — the id, the command, the
// account, the working directory, the fingerprint and operation key, the outcome so far — and
// none of what only the lost journal knew (the actor, the scope, the class, the policy's
// decision, the calls).
func recoveredRecord(host fleet.Host, m *hostproto.Marker) *markers.Record {
	r := &markers.Record{
		ID: m.ID, RecoveredFrom: host.Name, Fingerprint: m.Fingerprint, OperationKey: m.OperationKey,
		Tool: "ssh_exec", Channel: "ssh", Target: intent.SSHTarget(host.Name, host.KeyType(), host.Fingerprint()),
		Host: host.Name, Account: m.Account, Command: m.Command, Cwd: m.Cwd,
		PID: m.PID, PIDStart: m.PIDStart, StartError: m.StartError,
		Evidence: markerEvidence(host.Name, m),
	}
	copyOutcome(r, m)
	return r
}

// markerEvidence is what recovery journals of host's marker m: its state and times, and the
// host's own notes.
func markerEvidence(host string, m *hostproto.Marker) []string {
	if m == nil {
		return nil
	}
	line := fmt.Sprintf("recovered from %s's marker: %s", host, m.State)
	if m.ExitCode != nil || m.Signal != "" {
		line += " (" + verdict.OutcomeNote(m) + ")"
	}
	if !m.CreatedAt.IsZero() {
		line += fmt.Sprintf(", created %s, last changed %s", m.CreatedAt.UTC().Format(time.RFC3339), m.UpdatedAt.UTC().Format(time.RFC3339))
	}
	ev := []string{line}
	for _, e := range m.Evidence {
		ev = append(ev, "host: "+e)
	}
	return ev
}
