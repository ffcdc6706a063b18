package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/plugins"
)

// httpRequest is what an HTTP execution sends, as journaled (Record.Request): never the
// credential, which is resolved at each dispatch.
type httpRequest struct {
	Method string              `json:"method"`
	URL    string              `json:"url"`
	Header map[string][]string `json:"header,omitempty"`
	Body   []byte              `json:"body,omitempty"`
}

// storedResponse is the journaled result of an HTTP execution.
type storedResponse struct {
	Status             int                 `json:"status"`
	Header             map[string][]string `json:"header,omitempty"`
	Body               []byte              `json:"body,omitempty"`
	BodyBytes          int64               `json:"body_bytes"`
	BodyTruncated      bool                `json:"body_truncated,omitempty"`
	IdempotentReplayed bool                `json:"idempotent_replayed,omitempty"`
}

// Bounds of requests (endpoint defaults are in bastion/config).
const (
	maxQueryKeys        = 64
	maxQueryBytes       = 16 << 10
	maxHeaders          = 32
	maxHeaderValueBytes = 4096
	maxSecretBytes      = 16 << 10
)

// resolveHTTP validates an http_request and reduces it to its claim. Nothing here reads a
// secret: the credential enters only by its reference.
func (b *Engine) resolveHTTP(c transport.Caller, a api.HTTPArgs) (*claim, error) {
	ep, ok := b.cfg.Endpoint(a.Endpoint)
	if !ok {
		return nil, &api.ToolError{Code: "unknown_endpoint", Message: fmt.Sprintf("no endpoint %q is configured", a.Endpoint)}
	}
	if b.plugin == nil {
		return nil, &api.ToolError{Code: "http_unavailable", Message: "no HTTP plugin is configured"}
	}
	switch {
	case a.RunID != "" && !transport.ValidRunID(a.RunID):
		return nil, api.Invalid("run_id must be 1-128 printable ASCII characters")
	case !validKey(a.IdempotencyKey):
		return nil, api.Invalid("idempotency_key must be at most %d printable ASCII characters", maxKeyBytes)
	case a.WaitS != nil && (*a.WaitS < 0 || time.Duration(*a.WaitS)*time.Second > b.cfg.MaxWait):
		return nil, api.Invalid("wait_s must be in 0..%d", int(b.cfg.MaxWait/time.Second))
	}
	method := a.Method
	if !slices.Contains(ep.Methods, method) {
		return nil, api.Invalid("method %q is not allowed on endpoint %s (allowed: %s)", method, ep.Name, strings.Join(ep.Methods, ", "))
	}
	if err := checkPath(a.Path, ep.PathPrefixes); err != nil {
		return nil, err
	}
	query, err := normalizeQuery(a.Query)
	if err != nil {
		return nil, err
	}
	header, err := b.checkHeaders(a.Headers, ep)
	if err != nil {
		return nil, err
	}
	body, bodyArg, contentType, err := b.requestBody(a)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		header["Content-Type"] = []string{contentType}
	}
	base, _ := url.Parse(ep.BaseURL) // validated with the config
	target := *base
	target.Path = strings.TrimSuffix(base.Path, "/") + a.Path
	target.RawQuery = query.Encode()
	request, err := json.Marshal(httpRequest{Method: method, URL: target.String(), Header: header, Body: body})
	if err != nil {
		return nil, err
	}
	headerArg := map[string]any{}
	for k, v := range header {
		headerArg[strings.ToLower(k)] = v
	}
	queryArg := map[string]any{}
	for k, v := range query {
		queryArg[k] = v
	}
	targetName := "endpoint:" + ep.Name + " " + base.Scheme + "://" + base.Host + target.Path
	cl := &claim{caller: c, scope: intent.Scope(c, a.RunID)}
	cl.action = intent.ActionRecord{
		Actor:         c.Actor,
		Tool:          "http_request",
		Channel:       "http",
		Target:        targetName,
		CredentialRef: ep.Credential,
		Method:        method,
		Arguments:     map[string]any{"query": queryArg, "body": bodyArg, "headers": headerArg},
		IntentScope:   cl.scope,
	}
	cl.record = markers.Record{
		IdempotencyKey: a.IdempotencyKey,
		Tool:           "http_request",
		Channel:        "http",
		Target:         targetName,
		Command:        []string{method, target.String()},
		Host:           ep.Name,
		TimeoutSeconds: int(ep.Timeout / time.Second),
		Request:        request,
	}
	cl.ask = policy.Request{Tool: policy.ToolHTTPRequest, Endpoint: ep.Name, Method: method, Path: a.Path, EndpointClass: ep.Class}
	cl.defaultClass = ep.Class
	return cl, nil
}

// HTTPEnabled reports whether an HTTP plugin is configured: http_request exists.
func (b *Engine) HTTPEnabled() bool { return b.plugin != nil }

// HTTPRequest runs http_request: the same identity, matching rule and lifecycle as ssh_exec,
// performed by the HTTP plugin.
func (b *Engine) HTTPRequest(ctx context.Context, c transport.Caller, a api.HTTPArgs, progress func(*api.Execution)) (*api.Execution, error) {
	cl, err := b.resolveHTTP(c, a)
	if err != nil {
		b.metrics.rejected.WithLabelValues(errorCode(err)).Inc()
		return nil, err
	}
	return b.submit(ctx, cl, b.views.waitFor(a.WaitS), progress)
}

// checkPath accepts a clean absolute path under one of the prefixes (on a segment boundary).
func checkPath(p string, prefixes []string) error {
	if p == "" || p[0] != '/' || len(p) > 2048 || !utf8.ValidString(p) || strings.ContainsAny(p, "?#\\\x00\r\n") || path.Clean(p) != p && path.Clean(p)+"/" != p {
		return api.Invalid("path must be a clean absolute path without query or fragment (use query)")
	}
	for _, pre := range prefixes {
		pre = strings.TrimSuffix(pre, "/")
		if pre == "" || p == pre || strings.HasPrefix(p, pre+"/") {
			return nil
		}
	}
	return api.Invalid("path %q is not under the endpoint's allowed prefixes (%s)", p, strings.Join(prefixes, ", "))
}

// normalizeQuery bounds the query; url.Values.Encode sorts it by key.
func normalizeQuery(q map[string][]string) (url.Values, error) {
	if len(q) > maxQueryKeys {
		return nil, api.Invalid("at most %d query keys", maxQueryKeys)
	}
	out := url.Values{}
	size := 0
	for k, vs := range q {
		for _, v := range vs {
			size += len(k) + len(v)
			if !utf8.ValidString(k) || !utf8.ValidString(v) || strings.ContainsRune(k+v, 0) {
				return nil, api.Invalid("query must be UTF-8 text")
			}
		}
		out[k] = append([]string(nil), vs...)
	}
	if size > maxQueryBytes {
		return nil, api.Invalid("query is longer than %d bytes", maxQueryBytes)
	}
	return out, nil
}

// checkHeaders refuses headers the bastion sets itself (credentials above all) and values
// that could split a header (CR, LF, NUL).
func (b *Engine) checkHeaders(h map[string]string, ep config.Endpoint) (map[string][]string, error) {
	if len(h) > maxHeaders {
		return nil, api.Invalid("at most %d headers", maxHeaders)
	}
	credHeader := ""
	if cr, ok := b.cfg.Credential(ep.Credential); ok && cr.Kind == "header" {
		credHeader = http.CanonicalHeaderKey(cr.Header)
	}
	out := map[string][]string{}
	for k, v := range h {
		name := http.CanonicalHeaderKey(k)
		switch {
		case !config.ValidHeaderName(k):
			return nil, api.Invalid("header name %q is not a valid token", k)
		case config.ForbiddenHeader(name) || name == credHeader:
			return nil, api.Invalid("header %s is set by the bastion, not by the caller (credentials are injected from the endpoint's credential_ref)", name)
		case len(v) > maxHeaderValueBytes || strings.ContainsAny(v, "\r\n\x00") || !utf8.ValidString(v):
			return nil, api.Invalid("header %s: the value must be one line of UTF-8 text, at most %d bytes", name, maxHeaderValueBytes)
		}
		out[name] = []string{v}
	}
	return out, nil
}

// requestBody returns the bytes to send, the body as it enters the fingerprint, and its
// content type. A JSON body is sent in its RFC 8785 canonical form, so what is fingerprinted
// is exactly what is sent.
func (b *Engine) requestBody(a api.HTTPArgs) (body []byte, arg any, contentType string, err error) {
	switch {
	case a.JSON != nil && a.Text != nil:
		return nil, nil, "", api.Invalid("give json or text, not both")
	case a.JSON != nil:
		raw, err := json.Marshal(a.JSON)
		if err != nil {
			return nil, nil, "", api.Invalid("json body: %v", err)
		}
		if body, err = jcs.Transform(raw); err != nil {
			return nil, nil, "", api.Invalid("json body: %v", err)
		}
		arg = map[string]any{"json": a.JSON}
		contentType = "application/json"
	case a.Text != nil:
		if !utf8.ValidString(*a.Text) {
			return nil, nil, "", api.Invalid("text body must be UTF-8")
		}
		body, arg, contentType = []byte(*a.Text), map[string]any{"text": *a.Text}, "text/plain; charset=utf-8"
	}
	if len(body) > b.cfg.MaxRequestBodyBytes {
		return nil, nil, "", api.Invalid("body is %d bytes; the limit is %d", len(body), b.cfg.MaxRequestBodyBytes)
	}
	return body, arg, contentType, nil
}

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
		answer, checked = d.e.statusCheck(rec, ep)
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
func (b *Engine) statusCheck(rec *markers.Record, ep config.Endpoint) (verdict.StatusAnswer, *plugins.HTTPResponse) {
	if ep.StatusCheck == "" {
		return verdict.StatusAnswer{Err: fmt.Errorf("endpoint %s has no status_check", ep.Name)}, nil
	}
	base, _ := url.Parse(ep.BaseURL)
	check := *base
	check.Path = strings.TrimSuffix(base.Path, "/") + strings.ReplaceAll(ep.StatusCheck, "{execution_id}", rec.ID)
	action, err := b.httpAction(rec, ep, httpRequest{Method: http.MethodGet, URL: check.String()})
	if err != nil {
		return verdict.StatusAnswer{Err: fmt.Errorf("status check not possible: %w", err)}, nil
	}
	out, err := b.plugin.Perform(b.ctx, action, readOnlyJournal{id: rec.ID})
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
func (b *Engine) httpAction(rec *markers.Record, ep config.Endpoint, req httpRequest) (plugins.HTTPAction, error) {
	action := plugins.HTTPAction{
		ExecutionID: rec.ID, Method: req.Method, URL: req.URL, Header: req.Header, Body: req.Body,
		Timeout: ep.Timeout, MaxResponseBytes: ep.MaxResponseBytes, KeepHeaders: ep.KeepHeaders,
	}
	if ep.Credential != "" {
		cr, ok := b.cfg.Credential(ep.Credential)
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
	action, err := d.e.httpAction(rec, ep, req)
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
