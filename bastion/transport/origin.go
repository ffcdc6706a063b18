package transport

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// The DNS-rebinding guard decides from three facts — the Host header, the Origin header and
// the local address the connection arrived on (per connection, not per listen: on a wildcard
// listen a connection to 127.0.0.1 is a loopback one, as for the go-sdk) — before
// authentication, so a browser's CORS preflight (which carries no credentials) gets its
// answer here.
//
//   - Host. On a loopback listen only loopback names are accepted (localhost in lower case,
//     127.0.0.1 and the rest of 127/8, ::1, any port): the go-sdk's streamable handler refuses
//     any other Host on a loopback local address too, and the two layers must agree
//     (TestGuardAgreesWithSDKOnHost). Elsewhere the
//     loopback names, AllowedHosts and the IP literal the connection arrived on are accepted.
//   - Origin. None is fine (non-browser clients send none). One is parsed strictly as
//     http(s)://host[:port]: no userinfo, path, query or fragment, the default port dropped.
//     On a loopback listen a loopback Origin (a local tool such as the MCP Inspector) is
//     accepted on any port; any other Origin must be listed in AllowedOrigins. "null" (sent
//     by sandboxed frames and file: pages, so any page can send it) is never accepted, and
//     cannot be listed.
//
// An accepted Origin is echoed in Access-Control-Allow-Origin; a refused one gets 403 and a
// body that says how to allow it.

// maxOriginBytes bounds an Origin value: a scheme, a DNS name of at most 253 bytes, a port.
const maxOriginBytes = 300

// ErrNullOrigin is returned for the Origin "null", which is never accepted.
var ErrNullOrigin = errors.New(`origin "null" is sent by sandboxed and file: pages, so any page can send it; it cannot be allowed`)

// origin is a parsed Origin value: a lower-case scheme and host (an IPv6 host without
// brackets) and a port, "" when it is the scheme's default.
type origin struct {
	scheme, host, port string
}

func (o origin) String() string {
	h := o.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if o.port != "" {
		h += ":" + o.port
	}
	return o.scheme + "://" + h
}

// parseOrigin parses an Origin header value (RFC 6454 serialization) strictly.
func parseOrigin(s string) (origin, error) {
	if len(s) > maxOriginBytes {
		return origin{}, fmt.Errorf("origin longer than %d bytes", maxOriginBytes)
	}
	if s == "null" {
		return origin{}, ErrNullOrigin
	}
	scheme, authority, ok := strings.Cut(s, "://")
	if !ok {
		return origin{}, errors.New("origin is not scheme://host[:port]")
	}
	scheme = strings.ToLower(scheme)
	if scheme != "http" && scheme != "https" {
		return origin{}, fmt.Errorf("origin scheme %q is not http or https", scheme)
	}
	if i := strings.IndexAny(authority, "/?#@\\"); i >= 0 {
		return origin{}, fmt.Errorf("origin has %q: only scheme://host[:port] (no userinfo, path, query or fragment)", authority[i])
	}
	host, port := authority, ""
	if strings.HasPrefix(authority, "[") {
		end := strings.IndexByte(authority, ']')
		if end < 0 {
			return origin{}, errors.New("origin has an unclosed [")
		}
		host, port = authority[1:end], authority[end+1:]
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return origin{}, errors.New("origin has a bad IPv6 literal")
		}
		host = ip.String()
		if port != "" {
			if port[0] != ':' {
				return origin{}, errors.New("origin has bytes after ]")
			}
			port = port[1:]
			if port == "" {
				return origin{}, errors.New("origin has an empty port")
			}
		}
	} else {
		if h, p, found := strings.Cut(authority, ":"); found {
			if p == "" {
				return origin{}, errors.New("origin has an empty port")
			}
			host, port = h, p
		}
		host = strings.ToLower(host)
		if !validHostName(host) {
			return origin{}, errors.New("origin host is not a DNS name or an IPv4 address")
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
			return origin{}, fmt.Errorf("origin port %q is not 1 to 65535", port)
		}
		port = strconv.Itoa(n)
		if (scheme == "http" && n == 80) || (scheme == "https" && n == 443) {
			port = ""
		}
	}
	return origin{scheme: scheme, host: host, port: port}, nil
}

// validHostName: letters, digits, '-' and '.', 1 to 253 bytes, no empty label.
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// ParseAllowedOrigin checks and normalizes a configured origin (allowed_origins,
// --allow-origin). One trailing "/" is tolerated; "null" is refused (ErrNullOrigin).
func ParseAllowedOrigin(s string) (string, error) {
	o, err := parseAllowedOrigin(s)
	if err != nil {
		return "", err
	}
	return o.String(), nil
}

func parseAllowedOrigin(s string) (origin, error) {
	o, err := parseOrigin(strings.TrimSuffix(strings.TrimSpace(s), "/"))
	if err != nil {
		return origin{}, fmt.Errorf("allowed origin %q: %w", s, err)
	}
	return o, nil
}

// isLoopbackHost reports whether a host (lower case, no brackets, no port) is a loopback
// name: "localhost" or a loopback IP.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.IsLoopback()
}

// guard is the DNS-rebinding policy of an HTTP listener.
type guard struct {
	hosts   *hostAllowlist
	origins map[origin]bool
}

func newGuard(allowedHosts, allowedOrigins []string) (*guard, error) {
	hosts, err := newHostAllowlist(allowedHosts)
	if err != nil {
		return nil, err
	}
	g := &guard{hosts: hosts, origins: map[origin]bool{}}
	for _, s := range allowedOrigins {
		o, err := parseAllowedOrigin(s)
		if err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
		g.origins[o] = true
	}
	return g, nil
}

// verdict is the guard's answer: refused with a status and a client-visible reason, or
// admitted, with the Origin to echo in Access-Control-Allow-Origin ("" without one).
type verdict struct {
	status      int // 0: admitted
	reason      string
	allowOrigin string
}

// decide is the guard's decision from a request's Host header, its Origin header values and
// the local address it arrived on ("" if unknown).
func (g *guard) decide(hostHeader string, originHeaders []string, localAddr string) verdict {
	lhost, lport := splitHost(localAddr)
	loopbackListen := localAddr != "" && isLoopbackHost(lhost)

	host, port := splitHost(hostHeader)
	// Case kept: the go-sdk's own check, behind this one, takes only a lower-case "localhost".
	exactHost, _ := splitHostExact(hostHeader)
	switch {
	case host == "":
		return verdict{status: http.StatusForbidden, reason: "missing Host header"}
	case loopbackListen && !isLoopbackHost(exactHost):
		return verdict{status: http.StatusForbidden, reason: fmt.Sprintf(
			"Host %q refused: on a loopback listen only localhost (lower case), 127.0.0.1 and [::1] are accepted (DNS-rebinding protection)", printableHead(hostHeader))}
	case !loopbackListen && !g.hosts.allows(host, port, lhost, lport):
		return verdict{status: http.StatusForbidden, reason: fmt.Sprintf(
			"Host %q refused: add it to allowed_hosts in the config (DNS-rebinding protection)", printableHead(hostHeader))}
	}

	switch len(originHeaders) {
	case 0:
		return verdict{}
	case 1:
	default:
		return verdict{status: http.StatusForbidden, reason: "more than one Origin header"}
	}
	raw := originHeaders[0]
	o, err := parseOrigin(raw)
	if err != nil {
		return verdict{status: http.StatusForbidden, reason: fmt.Sprintf("Origin %q refused: %v", printableHead(raw), err)}
	}
	if g.origins[o] || (loopbackListen && isLoopbackHost(o.host)) {
		return verdict{allowOrigin: raw}
	}
	return verdict{status: http.StatusForbidden, reason: fmt.Sprintf(
		"Origin %s refused: browser pages may connect only from an allowed origin; allow this one with `postern up --allow-origin %s` or allowed_origins = [%q] in the config",
		o, o, o.String())}
}

// printableHead is s cut to maxOriginBytes, for quoting untrusted input in a reason.
func printableHead(s string) string {
	if len(s) > maxOriginBytes {
		return s[:maxOriginBytes] + "…"
	}
	return s
}

// CORS for the browser clients the guard admits. The bearer token travels in Authorization,
// not in a cookie, so credentials mode is not needed.
const (
	corsAllowMethods  = "GET, POST, DELETE, OPTIONS"
	corsAllowHeaders  = "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID, " + RunHeader
	corsExposeHeaders = "Mcp-Session-Id, Mcp-Protocol-Version, WWW-Authenticate"
	corsMaxAge        = "600"
)

// isPreflight reports whether r is a CORS preflight request.
func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// setCORS adds the CORS response headers for an admitted Origin; preflight adds the ones a
// preflight answer needs.
func setCORS(h http.Header, allowOrigin string, preflight bool) {
	h.Add("Vary", "Origin")
	if allowOrigin == "" {
		return
	}
	h.Set("Access-Control-Allow-Origin", allowOrigin)
	h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
	if preflight {
		h.Set("Access-Control-Allow-Methods", corsAllowMethods)
		h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
		h.Set("Access-Control-Max-Age", corsMaxAge)
	}
}

// localAddr is the address r arrived on, "" if the server did not record it.
func localAddr(r *http.Request) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && a != nil {
		return a.String()
	}
	return ""
}
