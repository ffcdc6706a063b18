// Package httpchannel performs HTTP actions for the postern-plugin-http plugin process and
// reports each one's lifecycle points into the bastion's journal.
//
// # Invariants
//
//   - One execution per TCP connection (keep-alives off, one dial per action), so the
//     connection knows its execution.
//   - Dispatched is journaled, synchronously, by the connection's first Write: before the first
//     request byte reaches the OS and after the TLS handshake (handshake bytes are not request
//     bytes). If it fails, nothing is written and the action is Failed.
//   - The outcome follows the bytes: a response → Completed; an error with no request byte
//     written → Failed (provably no effect); an error after → Unknown.
//   - Every request carries Idempotency-Key: "<execution id>" (RFC 8941 sf-string); agent
//     headers that carry authority (Authorization, Proxy-Authorization, Cookie, the credential's
//     header, Idempotency-Key) are dropped and the credential injected. The secret is never
//     logged and never returned: credential-bearing response headers are dropped, and every
//     form of the secret in the kept headers, the body and every reason is replaced by
//     "[REDACTED:<ref>]" (plugins.Redactor) before it is journaled.
//   - Redirects are not followed and no proxy is used: the request goes to the URL the bastion
//     authorized, once.
package httpchannel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postern-dev/postern/plugins"
)

// Defaults and ceilings; see Options.
const (
	DefaultTimeout          = 30 * time.Second
	DefaultMaxTimeout       = 10 * time.Minute
	DefaultMaxResponseBytes = 1 << 20
	// MaxResponseBytesCeiling keeps an outcome well below the plugin's 64 MiB gRPC message limit.
	MaxResponseBytesCeiling = 32 << 20
	// maxResponseHeaderBytes bounds the status line and headers the target may send.
	maxResponseHeaderBytes = 256 << 10
	// journalTimeout bounds each final journal call, which runs detached from the request's
	// deadline so an expired request can still be recorded.
	journalTimeout = 30 * time.Second
)

// Options configures a Channel. The zero value is usable.
type Options struct {
	// Logger receives one line per action (never the secret). Default: slog.Default().
	Logger *slog.Logger
	// TLSConfig is the base client TLS configuration (e.g. RootCAs for a private CA). It is
	// cloned per connection; ServerName is set from the URL. Default: system roots.
	TLSConfig *tls.Config
	// MaxTimeout is the largest HTTPAction.Timeout accepted. Default: DefaultMaxTimeout.
	MaxTimeout time.Duration
}

// Channel is the HTTP implementation of plugins.Channel. Safe for concurrent use.
type Channel struct {
	logger     *slog.Logger
	tlsConfig  *tls.Config
	maxTimeout time.Duration
}

var _ plugins.Channel = (*Channel)(nil)

// New returns a Channel.
func New(opts Options) *Channel {
	c := &Channel{logger: opts.Logger, tlsConfig: opts.TLSConfig, maxTimeout: opts.MaxTimeout}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.tlsConfig == nil {
		c.tlsConfig = &tls.Config{}
	}
	if c.maxTimeout <= 0 {
		c.maxTimeout = DefaultMaxTimeout
	}
	return c
}

// Perform sends action once and journals its lifecycle. The returned Outcome is already in the
// journal. An error means a journal call failed (the caller fails closed): the outcome of the
// action is then whatever the journal last recorded.
func (c *Channel) Perform(ctx context.Context, action plugins.HTTPAction, journal plugins.Journal) (plugins.Outcome, error) {
	logger := c.logger.With("execution_id", action.ExecutionID, "method", action.Method)
	// Every reason reported or logged goes through redact: an error may quote what the
	// target sent back.
	redact := action.Credential.Redactor()
	req, limits, err := c.buildRequest(action)
	if err != nil {
		// Nothing was dialed: provably no effect.
		return c.fail(ctx, logger, journal, action.ExecutionID, redact.String(fmt.Sprintf("invalid action: %v", err)))
	}
	logger = logger.With("host", req.URL.Host, "path", req.URL.Path)

	ctx, cancel := context.WithTimeout(ctx, limits.timeout)
	defer cancel()
	ex := &exchange{ctx: ctx, executionID: action.ExecutionID, journal: journal}
	transport := c.transport(ex)
	defer transport.CloseIdleConnections()
	client := &http.Client{
		Transport: transport,
		// A redirect would be a second request the bastion did not authorize.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}

	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		written, dispatchErr := ex.seal()
		if dispatchErr != nil {
			return c.fail(ctx, logger, journal, action.ExecutionID, redact.String(fmt.Sprintf("not sent: %v", dispatchErr)))
		}
		if written == 0 {
			return c.fail(ctx, logger, journal, action.ExecutionID, redact.String(fmt.Sprintf("not sent: %v", err)))
		}
		reason := redact.String(fmt.Sprintf("request written (%d bytes), no response: %v", written, err))
		jctx, jcancel := journalContext(ctx)
		defer jcancel()
		if jerr := journal.Unknown(jctx, action.ExecutionID, reason); jerr != nil {
			return plugins.Outcome{}, fmt.Errorf("httpchannel: journal unknown for %s: %w", action.ExecutionID, jerr)
		}
		logger.Warn("http action outcome unknown", "reason", reason)
		return plugins.Outcome{State: plugins.StateUnknown, Reason: reason}, nil
	}
	defer func() { _ = resp.Body.Close() }()

	out, bodyErr := readResponse(resp, limits.maxResponseBytes, action.KeepHeaders, action.Credential)
	var reason string
	if bodyErr != nil {
		// The target answered, so the request took effect as its status says; only the body is
		// incomplete, and it is marked truncated.
		reason = redact.String(fmt.Sprintf("response body incomplete after %d bytes: %v", out.BodyBytes, bodyErr))
	}
	jctx, jcancel := journalContext(ctx)
	defer jcancel()
	if jerr := journal.Completed(jctx, action.ExecutionID, out); jerr != nil {
		return plugins.Outcome{}, fmt.Errorf("httpchannel: journal completed for %s: %w", action.ExecutionID, jerr)
	}
	logger.Info("http action completed", "status", out.Status, "body_bytes", out.BodyBytes,
		"body_truncated", out.BodyTruncated, "idempotent_replayed", out.IdempotentReplayed)
	return plugins.Outcome{State: plugins.StateCompleted, Response: &out, Reason: reason}, nil
}

// fail journals Failed (no request byte was written) and returns the failed outcome.
func (c *Channel) fail(ctx context.Context, logger *slog.Logger, journal plugins.Journal, executionID, reason string) (plugins.Outcome, error) {
	jctx, cancel := journalContext(ctx)
	defer cancel()
	if err := journal.Failed(jctx, executionID, reason); err != nil {
		return plugins.Outcome{}, fmt.Errorf("httpchannel: journal failed for %s: %w", executionID, err)
	}
	logger.Warn("http action failed before sending", "reason", reason)
	return plugins.Outcome{State: plugins.StateFailed, Reason: reason}, nil
}

func journalContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), journalTimeout)
}

type limits struct {
	timeout          time.Duration
	maxResponseBytes int64
}

// transport returns a single-use transport whose connections journal Dispatched on first write.
func (c *Channel) transport(ex *exchange) *http.Transport {
	dialer := &net.Dialer{}
	return &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		// No connection reuse and no HTTP/2: one request, one connection, one execution.
		ForceAttemptHTTP2:      false,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if err := ex.claimDial(); err != nil {
				return nil, err
			}
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return ex.wrap(conn), nil
		},
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if err := ex.claimDial(); err != nil {
				return nil, err
			}
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("tls dial %s: %w", addr, err)
			}
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cfg := c.tlsConfig.Clone()
			cfg.ServerName = host
			cfg.NextProtos = []string{"http/1.1"}
			if cfg.MinVersion < tls.VersionTLS12 {
				cfg.MinVersion = tls.VersionTLS12
			}
			conn := tls.Client(raw, cfg)
			if err := conn.HandshakeContext(ctx); err != nil {
				_ = raw.Close()
				return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
			}
			return ex.wrap(conn), nil
		},
	}
}

// exchange is the state of one action's single connection.
type exchange struct {
	ctx         context.Context
	executionID string
	journal     plugins.Journal

	dialed atomic.Bool
	conn   atomic.Pointer[journaledConn] // the connection once dialed

	// mu guards the fields below and is held across each Write, so that seal sees every byte
	// that reached the OS and no byte is written after it.
	mu          sync.Mutex
	dispatchErr error // the Dispatched journal error, if it failed
	dispatched  bool  // Dispatched was journaled
	written     int64
	sealed      bool
}

var (
	errSecondDial = errors.New("a second connection for the same execution refused")
	errSealed     = errors.New("the execution's outcome is decided; write refused")
)

func (ex *exchange) claimDial() error {
	if !ex.dialed.CompareAndSwap(false, true) {
		return errSecondDial
	}
	return nil
}

func (ex *exchange) wrap(conn net.Conn) net.Conn {
	jc := &journaledConn{Conn: conn, ex: ex}
	ex.conn.Store(jc)
	return jc
}

// seal closes the connection (unblocking a write in progress), refuses any later write, and
// returns how many request bytes reached the OS and the Dispatched journal error, if any.
func (ex *exchange) seal() (written int64, dispatchErr error) {
	if jc := ex.conn.Load(); jc != nil {
		_ = jc.Conn.Close()
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.sealed = true
	return ex.written, ex.dispatchErr
}

// journaledConn journals Dispatched before its first byte goes to the OS and counts what it
// wrote.
type journaledConn struct {
	net.Conn
	ex *exchange
}

func (c *journaledConn) Write(p []byte) (int, error) {
	ex := c.ex
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.sealed {
		return 0, errSealed
	}
	if ex.dispatchErr != nil {
		return 0, ex.dispatchErr
	}
	if !ex.dispatched {
		if err := ex.journal.Dispatched(ex.ctx, ex.executionID); err != nil {
			ex.dispatchErr = fmt.Errorf("journal dispatched: %w", err)
			return 0, ex.dispatchErr
		}
		ex.dispatched = true
	}
	n, err := c.Conn.Write(p)
	ex.written += int64(n)
	return n, err
}

// Headers an agent may not set: they carry authority or the idempotency identity, which the
// channel sets itself.
var reservedRequestHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Idempotency-Key"}

// Response headers never returned, even when asked for.
var secretResponseHeaders = map[string]bool{
	"Set-Cookie":          true,
	"Set-Cookie2":         true,
	"Authorization":       true,
	"Proxy-Authorization": true,
	"Www-Authenticate":    true,
	"Proxy-Authenticate":  true,
	"Cookie":              true,
}

func (c *Channel) buildRequest(action plugins.HTTPAction) (*http.Request, limits, error) {
	var problems []string
	lim := limits{timeout: action.Timeout, maxResponseBytes: action.MaxResponseBytes}
	switch {
	case lim.timeout == 0:
		lim.timeout = DefaultTimeout
	case lim.timeout < 0 || lim.timeout > c.maxTimeout:
		problems = append(problems, fmt.Sprintf("timeout %s outside (0, %s]", action.Timeout, c.maxTimeout))
	}
	switch {
	case lim.maxResponseBytes == 0:
		lim.maxResponseBytes = DefaultMaxResponseBytes
	case lim.maxResponseBytes < 0 || lim.maxResponseBytes > MaxResponseBytesCeiling:
		problems = append(problems, fmt.Sprintf("max_response_bytes %d outside (0, %d]", action.MaxResponseBytes, MaxResponseBytesCeiling))
	}
	key, err := idempotencyKey(action.ExecutionID)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if !validToken(action.Method) {
		problems = append(problems, fmt.Sprintf("method %q is not an HTTP token", action.Method))
	}
	u, err := url.Parse(action.URL)
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("url: %v", err))
	case u.Scheme != "http" && u.Scheme != "https":
		problems = append(problems, fmt.Sprintf("url scheme %q is not http or https", u.Scheme))
	case u.Host == "":
		problems = append(problems, "url has no host")
	case u.User != nil:
		problems = append(problems, "url carries userinfo")
	}
	credHeader, err := validateCredential(action.Credential)
	if err != nil {
		problems = append(problems, err.Error())
	}
	for name, values := range action.Header {
		if !validToken(name) {
			problems = append(problems, fmt.Sprintf("header name %q is invalid", name))
			continue
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				problems = append(problems, fmt.Sprintf("header %s has an invalid value (control characters)", name))
			}
		}
	}
	if len(problems) > 0 {
		return nil, limits{}, errors.New(strings.Join(problems, "; "))
	}

	req, err := http.NewRequest(action.Method, u.String(), bytes.NewReader(action.Body))
	if err != nil {
		return nil, limits{}, err
	}
	// No GetBody: the transport must never re-send the body on its own.
	req.GetBody = nil
	req.ContentLength = int64(len(action.Body))
	if len(action.Body) == 0 {
		req.Body = http.NoBody
	}
	for name, values := range action.Header {
		req.Header[http.CanonicalHeaderKey(name)] = append([]string(nil), values...)
	}
	for _, name := range reservedRequestHeaders {
		req.Header.Del(name)
	}
	if credHeader != "" {
		req.Header.Del(credHeader)
	}
	req.Header.Set("Idempotency-Key", key)
	switch cred := action.Credential; {
	case cred == nil:
	case cred.Kind == plugins.CredentialBearer:
		req.Header.Set("Authorization", "Bearer "+cred.Secret)
	case cred.Kind == plugins.CredentialBasic:
		req.SetBasicAuth(cred.Username, cred.Secret)
	case cred.Kind == plugins.CredentialHeader:
		req.Header.Set(credHeader, cred.Secret)
	}
	return req, lim, nil
}

// validateCredential checks cred's shape (never echoing the secret) and returns the canonical
// name of a named-header credential.
func validateCredential(cred *plugins.Credential) (string, error) {
	if cred == nil {
		return "", nil
	}
	if !validHeaderValue(cred.Secret) || cred.Secret == "" {
		return "", fmt.Errorf("credential (%s) secret is empty or has control characters", cred.Kind)
	}
	switch cred.Kind {
	case plugins.CredentialBearer:
		return "", nil
	case plugins.CredentialBasic:
		if strings.Contains(cred.Username, ":") || !validHeaderValue(cred.Username) {
			return "", errors.New("credential (basic) username contains ':' or control characters")
		}
		return "", nil
	case plugins.CredentialHeader:
		name := http.CanonicalHeaderKey(cred.Header)
		if !validToken(name) {
			return "", fmt.Errorf("credential header name %q is invalid", cred.Header)
		}
		switch name {
		case "Idempotency-Key", "Host", "Content-Length", "Transfer-Encoding", "Content-Type":
			return "", fmt.Errorf("credential header %s is reserved", name)
		}
		return name, nil
	default:
		return "", fmt.Errorf("credential kind %q is not bearer, basic or header", cred.Kind)
	}
}

// idempotencyKey renders the execution id as an RFC 8941 sf-string.
func idempotencyKey(executionID string) (string, error) {
	if executionID == "" || len(executionID) > 256 {
		return "", fmt.Errorf("execution id must be 1..256 bytes, got %d", len(executionID))
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(executionID); i++ {
		ch := executionID[i]
		if ch < 0x20 || ch > 0x7e {
			return "", fmt.Errorf("execution id %q has a character an sf-string cannot carry", executionID)
		}
		if ch == '"' || ch == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(ch)
	}
	b.WriteByte('"')
	return b.String(), nil
}

// validToken reports whether s is an RFC 9110 token (method, header name).
func validToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(ch)) {
			return false
		}
	}
	return true
}

// validHeaderValue rejects CR, LF, NUL and other control characters (header injection).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if ch := v[i]; ch < 0x20 && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

// readResponse reduces resp to what may be stored: the kept headers and at most maxBody body
// bytes (the rest read, counted and discarded), with the credential's secret redacted from
// both. The error is a body read error, if any; the returned response is still valid and
// marked truncated then.
func readResponse(resp *http.Response, maxBody int64, keep []string, cred *plugins.Credential) (plugins.HTTPResponse, error) {
	out := plugins.HTTPResponse{Status: resp.StatusCode}
	redactor := cred.Redactor()
	credHeader := ""
	if cred != nil && cred.Kind == plugins.CredentialHeader {
		credHeader = http.CanonicalHeaderKey(cred.Header)
	}
	for _, name := range keep {
		name = http.CanonicalHeaderKey(name)
		if secretResponseHeaders[name] || name == credHeader {
			continue
		}
		if values := resp.Header.Values(name); len(values) > 0 {
			if out.Header == nil {
				out.Header = make(map[string][]string)
			}
			out.Header[name] = append([]string(nil), values...)
		}
	}
	out.Header = redactor.Header(out.Header)
	out.IdempotentReplayed = isTrue(resp.Header.Get("Idempotent-Replayed"))

	// Read past the cap by the longest form of the secret, so that a secret straddling the
	// cap is redacted whole before the body is cut.
	var body bytes.Buffer
	n, err := io.Copy(&body, io.LimitReader(resp.Body, maxBody+int64(redactor.Lookahead())))
	out.BodyBytes = n
	if err == nil {
		var rest int64
		rest, err = io.Copy(io.Discard, resp.Body)
		out.BodyBytes += rest
	}
	out.BodyTruncated = err != nil || out.BodyBytes > maxBody
	out.Body = redactor.Bytes(body.Bytes())
	if int64(len(out.Body)) > maxBody {
		out.Body = out.Body[:maxBody]
	}
	if out.BodyTruncated {
		out.Body = redactor.TrimPartial(out.Body)
	}
	return out, err
}

// isTrue accepts both the draft's "true" and the structured-field boolean "?1".
func isTrue(v string) bool {
	v = strings.TrimSpace(v)
	return strings.EqualFold(v, "true") || v == "?1"
}
