package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/envpolicy"
	"github.com/postern-dev/postern/markers"
)

// A claim is one call that starts work, checked and resolved to its intent: its arguments are
// bounded and validated before anything is journaled (an invalid one is refused with a
// ToolError that says what to fix), its target resolved (the host from the inventory, or the
// endpoint from the config), and its canonical action record and the record to accept built.
// Nothing here reads a secret: a credential enters only by its reference.

// Bounds on arguments, besides the configured command and body sizes.
const (
	maxEnvVars          = 32
	maxEnvValueBytes    = 4096
	maxTimeoutS         = 31 * 24 * 3600
	maxKeyBytes         = 255
	maxQueryKeys        = 64
	maxQueryBytes       = 16 << 10
	maxHeaders          = 32
	maxHeaderValueBytes = 4096
)

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
	// connectTried: submit dialed host outside the intake lock once already (a failed dial
	// is answered by the pool's backoff, under the lock, from then on).
	connectTried bool
	// fleet is set for a fleet run (fleetrun.go): its hosts, decided one by one.
	fleet *fleetClaim
}

// validate checks every argument before anything is journaled.
func (in *intake) validate(a *api.ExecArgs) error {
	switch {
	case a.Host == "":
		return api.Invalid("host is required")
	case len(a.Host) > 64:
		return api.Invalid("host is longer than 64 bytes")
	case a.Command == "" || strings.TrimSpace(a.Command) == "":
		return api.Invalid("command is required")
	case len(a.Command) > in.current().cfg.MaxCommandBytes:
		return api.Invalid("command is %d bytes; the limit is %d", len(a.Command), in.current().cfg.MaxCommandBytes)
	case len(a.Command) > hostproto.MaxCommandBytes:
		return api.Invalid("command is %d bytes; a host is sent at most %d in one request", len(a.Command), hostproto.MaxCommandBytes)
	case !utf8.ValidString(a.Command) || strings.IndexByte(a.Command, 0) >= 0:
		return api.Invalid("command must be UTF-8 text without NUL bytes")
	case len(a.Env) > maxEnvVars:
		return api.Invalid("at most %d env variables", maxEnvVars)
	case a.TimeoutS < 0 || a.TimeoutS > maxTimeoutS:
		return api.Invalid("timeout_s must be in 0..%d", maxTimeoutS)
	case !validKey(a.OperationKey) || strings.Contains(a.OperationKey, " "):
		return api.Invalid("operation_key must be at most %d visible ASCII characters", maxKeyBytes)
	case a.Account != "" && !hostproto.ValidAccountName(a.Account):
		return api.Invalid("account must be a user name of at most 64 of [A-Za-z0-9_.-] (not starting with '-'), as in a hostagent's allowed_accounts; leave it out to run as the host's enrolled account")
	}
	if a.Cwd != "" {
		if err := hostproto.CheckCwd(a.Cwd); err != nil {
			return api.Invalid("%v", err)
		}
	}
	if err := in.checkCallOptions(a.CallOptions); err != nil {
		return err
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

func (in *intake) resolveSSH(c transport.Caller, a api.ExecArgs) (*claim, error) {
	if err := in.validate(&a); err != nil {
		return nil, err
	}
	host, err := in.inv.Host(a.Host)
	if errors.Is(err, fleet.ErrUnknownHost) {
		usable, err := in.usableHosts(c)
		if err != nil {
			return nil, err
		}
		names := make([]string, len(usable))
		for i, h := range usable {
			names[i] = h.Name
		}
		return nil, unknownHost(a.Host, names).Err()
	}
	if err != nil {
		return nil, err
	}
	if err := checkHostEnv(a.Env, host); err != nil {
		return nil, err
	}
	// Run-as: the host reached as the account the call names; the enrolled one when it names
	// none (or that one), so such a call is the same intent as before run-as existed. Policy
	// decides whether the actor may use it (policy.Request.Account).
	enrolled := host.Account
	host = host.As(a.Account)
	if host.Account != enrolled && host.Level() == fleet.GuaranteeMarkerScript {
		// Its marker script lives in the enrolled account's home: another account's commands
		// would run without the markers the host's guarantee rests on.
		return nil, api.Invalid("host %s runs commands through a marker script installed for %s only, so it cannot run them as %s; leave account out", host.Name, enrolled, host.Account)
	}
	cwd := a.Cwd
	if cwd == "" {
		cwd = host.Cwd
	}
	if err := checkWire(a, cwd); err != nil {
		return nil, err
	}
	if err := checkAgentlessCall(host, a, cwd); err != nil {
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
	target := intent.SSHTarget(host.Name, host.KeyType(), host.Fingerprint())
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
		Reason:         a.Reason,
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
	if host.Account != enrolled {
		cl.ask.Account = host.Account
	}
	cl.defaultClass = config.ClassRemoteCommand
	cl.host = &host
	return cl, nil
}

// Placeholders as long as the execution id and the fingerprint a dispatch carries.
var (
	wireIDPlaceholder          = "ex_" + strings.Repeat("0", 26)
	wireFingerprintPlaceholder = "hmac-sha256:" + strings.Repeat("0", 64)
)

// checkWire refuses an ssh_exec its host could not be sent (hostproto.Exec.Check): every
// field that reaches the wire is checked here, before anything is journaled, by the rule the
// dispatch applies.
func checkWire(a api.ExecArgs, cwd string) error {
	x := hostproto.Exec{
		ExecutionID: wireIDPlaceholder, Fingerprint: wireFingerprintPlaceholder,
		Command: a.Command, OperationKey: a.OperationKey, Cwd: cwd, Env: a.Env,
		Timeout: time.Duration(a.TimeoutS) * time.Second,
	}
	if err := x.Check(); err != nil {
		return api.Invalid("%s", strings.TrimPrefix(err.Error(), hostproto.ErrInvalidExec.Error()+": "))
	}
	return nil
}

// checkCallOptions checks the options every tool that starts work takes.
func (in *intake) checkCallOptions(o api.CallOptions) error {
	maxWait := in.current().cfg.MaxWait
	switch {
	case o.WaitS != nil && (*o.WaitS < 0 || time.Duration(*o.WaitS)*time.Second > maxWait):
		return api.Invalid("wait_s must be in 0..%d", int(maxWait/time.Second))
	case o.RunID != "" && !transport.ValidRunID(o.RunID):
		return api.Invalid("run_id must be 1-128 printable ASCII characters")
	case !validKey(o.IdempotencyKey):
		return api.Invalid("idempotency_key must be at most %d printable ASCII characters", maxKeyBytes)
	case len(o.Reason) > maxReasonBytes || !utf8.ValidString(o.Reason) || strings.ContainsFunc(o.Reason, func(r rune) bool { return unicode.IsControl(r) && r != '\n' }):
		return api.Invalid("reason must be text of at most %d bytes (UTF-8, no control characters but newlines)", maxReasonBytes)
	}
	return nil
}

// maxReasonBytes bounds a call's reason.
const maxReasonBytes = 1024

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

// resolveHTTP validates an http_request and reduces it to its claim. Nothing here reads a
// secret: the credential enters only by its reference.
func (in *intake) resolveHTTP(c transport.Caller, a api.HTTPArgs) (*claim, error) {
	ep, ok := in.cfg.Endpoint(a.Endpoint)
	if !ok {
		return nil, &api.ToolError{Code: api.CodeUnknownEndpoint, Message: fmt.Sprintf("no endpoint %q is configured", a.Endpoint)}
	}
	if in.plugin == nil {
		return nil, &api.ToolError{Code: api.CodeHTTPUnavailable, Message: "no HTTP plugin is configured"}
	}
	if err := in.checkCallOptions(a.CallOptions); err != nil {
		return nil, err
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
	header, err := in.checkHeaders(a.Headers, ep)
	if err != nil {
		return nil, err
	}
	body, bodyArg, contentType, err := in.requestBody(a)
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
		Reason:         a.Reason,
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

// httpRequest is what an HTTP execution sends, as journaled (Record.Request): never the
// credential, which is resolved at each dispatch.
type httpRequest struct {
	Method string              `json:"method"`
	URL    string              `json:"url"`
	Header map[string][]string `json:"header,omitempty"`
	Body   []byte              `json:"body,omitempty"`
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
func (in *intake) checkHeaders(h map[string]string, ep config.Endpoint) (map[string][]string, error) {
	if len(h) > maxHeaders {
		return nil, api.Invalid("at most %d headers", maxHeaders)
	}
	credHeader := ""
	if cr, ok := in.cfg.Credential(ep.Credential); ok && cr.Kind == "header" {
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
func (in *intake) requestBody(a api.HTTPArgs) (body []byte, arg any, contentType string, err error) {
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
	if limit := in.current().cfg.MaxRequestBodyBytes; len(body) > limit {
		return nil, nil, "", api.Invalid("body is %d bytes; the limit is %d", len(body), limit)
	}
	return body, arg, contentType, nil
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
