package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/postern-dev/postern/bastion/oauth"
)

// DefaultMaxBodyBytes bounds a request body when the options leave it zero. MCP requests are
// small JSON; 1 MiB leaves room for large tool arguments without letting a client pin memory.
const DefaultMaxBodyBytes = 1 << 20

// RunHeader is the header a remote agent may send to name its run (the intent scope).
const RunHeader = "Postern-Run"

// maxRunIDBytes bounds a Postern-Run value.
const maxRunIDBytes = 128

// HTTPOptions configures HTTPHandler.
type HTTPOptions struct {
	// Actors are the remote agents and their token hashes. Names and hashes must be unique.
	// Ignored when ActorSet is given.
	Actors []Actor
	// ActorSet, when given, is the actors in force, which its owner may replace while the
	// handler serves (a reload).
	ActorSet *ActorSet
	// MaxBodyBytes bounds a request body; a larger one is answered 413 and the MCP handler
	// never sees it. Default (zero or negative) DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a request's body may take to arrive (408 after it).
	// Default DefaultBodyTimeout.
	BodyTimeout time.Duration
	// MaxBodiesPerActor bounds the requests of one actor whose bodies are arriving at once
	// (429 past it). Default DefaultMaxBodiesPerActor.
	MaxBodiesPerActor int
	// AllowedHosts are extra Host header values accepted on a listen that is not loopback
	// (host, any port; or host:port). Loopback names (localhost, 127.0.0.1, ::1) and the
	// local address the connection arrived on are always accepted: a DNS-rebinding page can
	// send neither. On a loopback listen only loopback names are (see origin.go).
	AllowedHosts []string
	// AllowedOrigins lists the Origin values accepted (http(s)://host[:port]) besides the
	// loopback ones on a loopback listen. A request with another Origin header is refused
	// 403; no Origin header is fine (non-browser clients send none).
	AllowedOrigins []string
	// Logger receives refusals (never a token), a few lines per reason and minute and then
	// a summary with the count (internal/ratelog). Default: discard.
	Logger *slog.Logger
	// CountRefusal is told of every refused request (WhereHTTP). Default: none.
	CountRefusal CountRefusal
	// OAuth, when set, also accepts OAuth access tokens (JWTs) it validates and maps to
	// actors, and names its protected resource metadata in every 401 (oauth.go). Serve
	// OAuthMetadataHandler at its MetadataPaths. Default: bearer tokens of ActorSet only.
	OAuth *oauth.Verifier
}

// HTTPHandler wraps mcpHandler for remote agents: a DNS-rebinding guard (Host and Origin,
// with CORS for the browser clients it admits, preflights answered before auth),
// Postern-Run validation (400), bearer-token auth (401 with WWW-Authenticate: Bearer), a
// body bound (413), then the MCP handler, with the Caller reachable from tool handlers via
// CallerFromTokenInfo(req.Extra.TokenInfo). The Authorization header is removed before
// mcpHandler runs, so tool handlers cannot log it from req.Extra.Header.
func HTTPHandler(mcpHandler http.Handler, opts HTTPOptions) (http.Handler, error) {
	actors := opts.ActorSet
	if actors == nil {
		var err error
		if actors, err = NewActorSet(opts.Actors, nil, nil); err != nil {
			return nil, err
		}
	}
	guard, err := newGuard(opts.AllowedHosts, opts.AllowedOrigins)
	if err != nil {
		return nil, err
	}
	refusals := newRefusalLog(loggerOrDiscard(opts.Logger), WhereHTTP, opts.CountRefusal)
	var front *oauthFront
	if opts.OAuth != nil {
		front = &oauthFront{verifier: opts.OAuth, refusals: refusals}
	}

	bounded := limitBody(front.gateTools(mcpHandler), bodyLimits{max: opts.MaxBodyBytes, timeout: opts.BodyTimeout, perActor: opts.MaxBodiesPerActor}, refusals)
	authenticated := auth.RequireBearerToken(withOAuth(actors.verifier()), &auth.RequireBearerTokenOptions{
		AllowMissingExpiration: true,
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st, ok := r.Context().Value(authStateKey{}).(*authState); ok {
			st.authenticated = true
		}
		markAuthenticated(w, r) // its connection may stay open (NewHTTPServer)
		// Authenticated: the challenge set for the 401 path does not belong on this response.
		w.Header().Del("WWW-Authenticate")
		r.Header.Del("Authorization")
		bounded.ServeHTTP(w, r)
	}))

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse := func(code int, reason, detail string) {
			refusals.Log(slog.LevelInfo, reason, "refused request", "remote", r.RemoteAddr, "status", code, "detail", detail)
			http.Error(w, detail, code)
		}
		v := guard.decide(r.Host, r.Header.Values("Origin"), localAddr(r))
		preflight := isPreflight(r)
		setCORS(w.Header(), v.allowOrigin, preflight)
		if v.status != 0 {
			refuse(v.status, ReasonHostOrOrigin, v.reason)
			return
		}
		if preflight {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if _, err := runIDFromHeader(r.Header); err != nil {
			refuse(http.StatusBadRequest, ReasonBadRunHeader, err.Error())
			return
		}
		// The challenge of a 401 (RFC 6750 section 3): without a token, just the scheme (and,
		// with OAuth, the resource metadata URL a client discovers its authorization server
		// from, RFC 9728); with one that is not (or no longer) good, error="invalid_token",
		// which tells an MCP client to get a new token rather than retry this one.
		st := &authState{header: w.Header(), challenge: front.challenge()}
		w.Header().Set("WWW-Authenticate", st.challenge)
		if front.authenticate(w, r, st) {
			return
		}
		authenticated.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), authStateKey{}, st)))
		if st.authenticated {
			return
		}
		// go-sdk answered 401: no token, or none that is good now.
		switch {
		case errors.Is(st.refused, errTokenExpired):
			refusals.Log(slog.LevelWarn, ReasonTokenExpired, "refused an expired token", "remote", r.RemoteAddr, "status", http.StatusUnauthorized)
		case errors.Is(st.refused, errTokenRevoked):
			refusals.Log(slog.LevelWarn, ReasonTokenRevoked, "refused a revoked token", "remote", r.RemoteAddr, "status", http.StatusUnauthorized)
		default:
			refusals.Log(slog.LevelInfo, ReasonUnauthenticated, "refused request", "remote", r.RemoteAddr, "status", http.StatusUnauthorized)
		}
	}), nil
}

// authState is what authenticating one request found: set by the verifier and the
// authenticated handler, read by HTTPHandler after them. One request's, never shared.
type authState struct {
	authenticated bool
	// refused is why a presented token was refused (errUnknownToken, errTokenExpired,
	// errTokenRevoked); nil if none was presented.
	refused error
	header  http.Header
	// challenge is the WWW-Authenticate value of a 401 without a token (oauthFront).
	challenge string
	// oauth is the TokenInfo of an OAuth access token oauthFront accepted; nil for others.
	oauth *auth.TokenInfo
}

// authStateKey carries a request's *authState in its context.
type authStateKey struct{}

// refuse notes why a presented token was refused and puts error="invalid_token" in the
// challenge of the 401 that go-sdk writes next.
func (st *authState) refuse(why error) {
	st.refused = why
	st.header.Set("WWW-Authenticate", fmt.Sprintf(`%s, error="invalid_token", error_description=%q`, st.challenge, why.Error()))
}

// errBadRunID is the client-visible reason for a 400 on Postern-Run.
var errBadRunID = fmt.Errorf("%s header must be one value of 1 to %d printable ASCII characters without spaces", RunHeader, maxRunIDBytes)

// runIDFromHeader returns the Postern-Run value, "" if absent, or errBadRunID.
func runIDFromHeader(h http.Header) (string, error) {
	values := h.Values(RunHeader)
	switch len(values) {
	case 0:
		return "", nil
	case 1:
		if !ValidRunID(values[0]) {
			return "", errBadRunID
		}
		return values[0], nil
	default:
		return "", errBadRunID
	}
}

// ValidRunID reports whether s is an acceptable Postern-Run value: 1 to 128 bytes of
// printable ASCII without spaces (it becomes part of a scope key and of logs).
func ValidRunID(s string) bool {
	if len(s) == 0 || len(s) > maxRunIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// hostAllowlist decides whether a Host header is acceptable (see HTTPOptions.AllowedHosts).
type hostAllowlist struct {
	anyPort  map[string]bool // host names/IPs accepted with any port
	withPort map[string]bool // exact host:port values
}

func newHostAllowlist(extra []string) (*hostAllowlist, error) {
	l := &hostAllowlist{
		anyPort:  map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true},
		withPort: map[string]bool{},
	}
	for _, h := range extra {
		host, port := splitHost(h)
		if host == "" {
			return nil, fmt.Errorf("transport: allowed host %q: empty host", h)
		}
		if port == "" {
			l.anyPort[host] = true
		} else {
			l.withPort[net.JoinHostPort(host, port)] = true
		}
	}
	return l, nil
}

// allows reports whether Host host[:port] is acceptable on a connection that arrived on
// lhost:lport ("" if unknown).
func (l *hostAllowlist) allows(host, port, lhost, lport string) bool {
	if l.anyPort[host] || (port != "" && l.withPort[net.JoinHostPort(host, port)]) {
		return true
	}
	// The address the client connected to, as an IP literal, cannot be a rebinding.
	return lhost != "" && host == lhost && (port == "" || port == lport)
}

// splitHost splits host[:port] (IPv6 in brackets) into a lower-case host and a port.
func splitHost(hostport string) (host, port string) {
	host, port = splitHostExact(strings.TrimSpace(hostport))
	return strings.ToLower(host), port
}

// splitHostExact is splitHost without changing case, as the go-sdk splits a Host.
func splitHostExact(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), ""
}

func loggerOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
