package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/plugins"
)

// storedResponse is the journaled result of an HTTP execution.
type storedResponse struct {
	Status             int                 `json:"status"`
	Header             map[string][]string `json:"header,omitempty"`
	Body               []byte              `json:"body,omitempty"`
	BodyBytes          int64               `json:"body_bytes"`
	BodyTruncated      bool                `json:"body_truncated,omitempty"`
	IdempotentReplayed bool                `json:"idempotent_replayed,omitempty"`
}

// maxSecretBytes bounds a credential file.
const maxSecretBytes = 16 << 10

// secret reads a credential's value at dispatch. It is handed to the plugin over its mTLS
// channel and never stored, logged or returned: whatever comes back from the plugin (a
// response that echoes it, an error that quotes it) is redacted with its Redactor before it
// is journaled (httpJournal, statusCheck, performHTTP).
func secret(cr config.Credential) (*plugins.Credential, error) {
	var value string
	if cr.File != "" {
		data, err := os.ReadFile(cr.File)
		if err != nil {
			return nil, fmt.Errorf("credential %s: read its file: %w", cr.Name, errors.Unwrap(err))
		}
		if len(data) > maxSecretBytes {
			return nil, fmt.Errorf("credential %s: its file is larger than %d bytes", cr.Name, maxSecretBytes)
		}
		value = strings.TrimRight(string(data), "\r\n")
	} else {
		value = os.Getenv(cr.Env)
	}
	if value == "" {
		return nil, fmt.Errorf("credential %s is empty or unset", cr.Name)
	}
	return &plugins.Credential{Ref: cr.Name, Kind: cr.Kind, Header: cr.Header, Username: cr.Username, Secret: value}, nil
}

// driveHTTP carries an HTTP execution through the plugin. The plugin journals dispatched
// just before the first request byte is written and the outcome after; a crash is judged by
// the boundary the journal shows. An unknown outcome is handled by the endpoint's class.
func (d *driver) driveHTTP(asked func()) {
	if d.finishDecision() {
		return
	}
	rec := d.record()
	log := d.log.With("execution_id", rec.ID, "endpoint", rec.Host)
	defer asked()
	switch rec.State {
	case markers.Accepted:
		next, err := d.records.authorized(d.ctx, rec)
		if err != nil {
			d.journalFailed(log, "authorize", err)
			return
		}
		d.set(next)
	case markers.Dispatched, markers.Running:
		// In flight when the bastion stopped: the request may have been written.
		if !d.toUnknown("the bastion stopped while the request was in flight; whether it reached the target is unknown", false) {
			return
		}
	}
	for attempt := 1; attempt <= 2; attempt++ {
		rec = d.record()
		if rec.State == markers.Unknown {
			if !d.resolveUnknownHTTP(log) {
				return
			}
			asked()
		}
		if markers.JournalGraph.Terminal(d.record().State) {
			return
		}
		d.performHTTP(log)
		if d.record().State != markers.Unknown || d.ctx.Err() != nil {
			return
		}
	}
}

// resolveUnknownHTTP carries out verdict.DecideUnknownHTTP for an unknown HTTP execution, asking the
// endpoint's status check when its class wants one. It returns true to send it again.
func (d *driver) resolveUnknownHTTP(log interface{ Info(string, ...any) }) bool {
	rec := d.record()
	ep, configured := d.cfg.Endpoint(rec.Host)
	act := verdict.DecideUnknownHTTP(rec, configured, nil)
	var checked *plugins.HTTPResponse
	if act.Do == verdict.StatusCheck {
		var answer verdict.StatusAnswer
		answer, checked = d.statusCheck(rec, ep)
		act = verdict.DecideUnknownHTTP(rec, configured, &answer)
	}
	if act.Verdict.To == markers.Completed {
		d.finishHTTP(markers.Completed, act.Verdict.Note, checked)
		return false
	}
	if act.Do == verdict.Resend {
		log.Info("re-sending", "why", act.Verdict.Note)
	}
	return d.toUnknown(act.Verdict.Note, act.Verdict.Review) && act.Do == verdict.Resend
}

// statusCheck asks a conditional_write endpoint whether the execution took effect, and
// returns its answer (and response, to store when it proves the effect).
func (d *driver) statusCheck(rec *markers.Record, ep config.Endpoint) (verdict.StatusAnswer, *plugins.HTTPResponse) {
	if ep.StatusCheck == "" {
		return verdict.StatusAnswer{Err: fmt.Errorf("endpoint %s has no status_check", ep.Name)}, nil
	}
	base, _ := url.Parse(ep.BaseURL)
	check := *base
	check.Path = strings.TrimSuffix(base.Path, "/") + strings.ReplaceAll(ep.StatusCheck, "{execution_id}", rec.ID)
	action, err := d.httpAction(rec, ep, httpRequest{Method: http.MethodGet, URL: check.String()})
	if err != nil {
		return verdict.StatusAnswer{Err: fmt.Errorf("status check not possible: %w", err)}, nil
	}
	out, err := d.plugin.Perform(d.ctx, action, readOnlyJournal{id: rec.ID})
	redact := action.Credential.Redactor()
	switch {
	case err != nil:
		return verdict.StatusAnswer{Err: errors.New(redact.String(err.Error()))}, nil
	case out.Response == nil:
		return verdict.StatusAnswer{Err: fmt.Errorf("no response: %s", redact.String(out.Reason))}, nil
	}
	return verdict.StatusAnswer{Status: out.Response.Status}, out.Response
}

// httpAction builds what the plugin sends, with the credential resolved now.
func (d *driver) httpAction(rec *markers.Record, ep config.Endpoint, req httpRequest) (plugins.HTTPAction, error) {
	action := plugins.HTTPAction{
		ExecutionID: rec.ID, Method: req.Method, URL: req.URL, Header: req.Header, Body: req.Body,
		Timeout: ep.Timeout, MaxResponseBytes: ep.MaxResponseBytes, KeepHeaders: ep.KeepHeaders,
	}
	if ep.Credential != "" {
		cr, ok := d.cfg.Credential(ep.Credential)
		if !ok {
			return action, fmt.Errorf("credential %s is not configured", ep.Credential)
		}
		s, err := secret(cr)
		if err != nil {
			return action, err
		}
		action.Credential = s
	}
	return action, nil
}

// performHTTP sends the execution's request once through the plugin.
func (d *driver) performHTTP(log interface{ Warn(string, ...any) }) {
	rec := d.record()
	ep, ok := d.cfg.Endpoint(rec.Host)
	var req httpRequest
	if ok {
		ok = json.Unmarshal(rec.Request, &req) == nil
	}
	if !ok {
		d.settleNotSent("endpoint " + rec.Host + " or the journaled request is gone; nothing was sent")
		return
	}
	action, err := d.httpAction(rec, ep, req)
	if err != nil {
		d.settleNotSent(err.Error() + "; nothing was sent")
		return
	}
	redact := action.Credential.Redactor()
	_, err = d.plugin.Perform(d.ctx, action, httpJournal{d: d, redact: redact})
	if err == nil || d.ctx.Err() != nil {
		return
	}
	err = errors.New(redact.String(err.Error()))
	// The plugin did not see it through (crashed, or a journal call failed): the journal
	// says which boundary it reached.
	cur, gerr := d.journal.Get(rec.ID)
	if gerr != nil {
		d.journalFailed(d.log, "read after plugin error", gerr)
		return
	}
	d.set(cur)
	log.Warn("http plugin call ended without an outcome", "execution_id", rec.ID, "state", cur.State, "err", err)
	switch cur.State {
	case markers.Authorized:
		d.finishHTTP(markers.Failed, fmt.Sprintf("the plugin failed before the request was written (%v); nothing was sent", err), nil)
	case markers.Dispatched:
		d.toUnknown(fmt.Sprintf("the plugin failed after the request was dispatched (%v); whether it reached the target is unknown", err), false)
	}
}

// settleNotSent ends an execution that was not sent: failed from authorized, unknown if an
// earlier attempt may have been sent.
func (d *driver) settleNotSent(note string) {
	if d.record().State == markers.Unknown {
		d.toUnknown(note, false)
		return
	}
	d.finishHTTP(markers.Failed, note, nil)
}

// finishHTTP journals an HTTP outcome with the stored response in the same write.
func (d *driver) finishHTTP(to markers.State, note string, resp *plugins.HTTPResponse) {
	var result []byte
	var err error
	if resp != nil {
		result, err = json.Marshal(storedResponse{
			Status: resp.Status, Header: resp.Header, Body: resp.Body, BodyBytes: resp.BodyBytes,
			BodyTruncated: resp.BodyTruncated, IdempotentReplayed: resp.IdempotentReplayed,
		})
		if err != nil {
			d.log.Error("encode response", "execution_id", d.id, "err", err)
			return
		}
	}
	d.advance(to, note, false, result, func(r *markers.Record) {
		if resp != nil {
			r.HTTPStatus = resp.Status
			r.IsError = resp.Status >= 400
		}
	})
}

// httpJournal is the journal the plugin reports to for one execution (served to it through
// the go-plugin broker). Each call returns once the step is durable. What the plugin reports
// is redacted here, where it first touches the journal, whatever the plugin did.
type httpJournal struct {
	d      *driver
	redact *plugins.Redactor // the execution's credential; nil without one
}

func (j httpJournal) check(id string) error {
	if id != j.d.id {
		return fmt.Errorf("bastion: the plugin reported on %s while performing %s", id, j.d.id)
	}
	return nil
}

func (j httpJournal) Dispatched(ctx context.Context, id string) error {
	if err := j.check(id); err != nil {
		return err
	}
	rec := j.d.record()
	next, err := j.d.records.requestSent(ctx, rec)
	if err != nil {
		return err
	}
	j.d.set(next)
	j.d.metrics.dispatched.Inc()
	return nil
}

func (j httpJournal) Completed(_ context.Context, id string, resp plugins.HTTPResponse) error {
	if err := j.check(id); err != nil {
		return err
	}
	note := fmt.Sprintf("HTTP %d", resp.Status)
	if resp.IdempotentReplayed {
		note += " (the target replayed its stored response: Idempotent-Replayed)"
	}
	resp = j.redact.Response(resp)
	j.d.finishHTTP(markers.Completed, note, &resp)
	return j.outcomeErr(markers.Completed)
}

func (j httpJournal) Failed(_ context.Context, id, reason string) error {
	if err := j.check(id); err != nil {
		return err
	}
	j.d.finishHTTP(markers.Failed, "no request byte was written: "+j.redact.String(reason), nil)
	return j.outcomeErr(markers.Failed)
}

func (j httpJournal) Unknown(_ context.Context, id, reason string) error {
	if err := j.check(id); err != nil {
		return err
	}
	j.d.toUnknown("the request was written and then "+j.redact.String(reason), false)
	return j.outcomeErr(markers.Unknown)
}

// outcomeErr tells the plugin whether the outcome it reported is durable.
func (j httpJournal) outcomeErr(want markers.State) error {
	if got := j.d.record().State; got != want {
		return fmt.Errorf("bastion: journal did not record %s (execution is %s)", want, got)
	}
	return nil
}

// readOnlyJournal serves a status check: it is not an execution of its own, so nothing is
// journaled for it (its answer is journaled as evidence of the execution it checks).
type readOnlyJournal struct{ id string }

func (readOnlyJournal) Dispatched(context.Context, string) error                      { return nil }
func (readOnlyJournal) Completed(context.Context, string, plugins.HTTPResponse) error { return nil }
func (readOnlyJournal) Failed(context.Context, string, string) error                  { return nil }
func (readOnlyJournal) Unknown(context.Context, string, string) error                 { return nil }
