package config

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/postern-dev/postern/markers"
)

// Defaults of endpoints.
const (
	defaultEndpointTimeout  = 30 * time.Second
	defaultMaxResponseBytes = 256 << 10
)

var defaultKeepHeaders = []string{"Content-Type", "Location", "Idempotent-Replayed", "Retry-After"}

// forbiddenHeaders are set by the bastion or the transport, never by an agent.
var forbiddenHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Host": true,
	"Content-Length": true, "Transfer-Encoding": true, "Connection": true, "Upgrade": true,
	"Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true, "Idempotency-Key": true,
	"Expect": true,
}

// headerName is an HTTP token (RFC 9110), as header names and methods are.
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")

// validateHTTP checks the endpoints, credentials and plugin of a config.
func (c Config) validateHTTP(classes map[string]bool) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: "+format, args...)) }
	if (c.HTTPPlugin.Path == "") != (c.HTTPPlugin.SHA256 == "") {
		bad("http_plugin: path and sha256 go together (sha256sum the binary to pin it)")
	}
	if len(c.Endpoints) > 0 && c.HTTPPlugin.Path == "" {
		bad("endpoints need an [http_plugin] path and sha256")
	}
	creds := map[string]bool{}
	for i, cr := range c.Credentials {
		switch {
		case !actorName.MatchString(cr.Name):
			bad("credentials[%d]: invalid name %q", i, cr.Name)
		case creds[cr.Name]:
			bad("credentials[%d]: duplicate name %q", i, cr.Name)
		case cr.Kind != "bearer" && cr.Kind != "basic" && cr.Kind != "header":
			bad("credentials[%d] (%s): kind must be bearer, basic or header", i, cr.Name)
		case cr.Kind == "header" && (!headerName.MatchString(cr.Header) || forbiddenHeaders[http.CanonicalHeaderKey(cr.Header)] && http.CanonicalHeaderKey(cr.Header) != "Authorization"):
			bad("credentials[%d] (%s): header must be a valid header name", i, cr.Name)
		case cr.Kind == "basic" && cr.Username == "":
			bad("credentials[%d] (%s): basic needs a username", i, cr.Name)
		case (cr.File == "") == (cr.Env == ""):
			bad("credentials[%d] (%s): exactly one of file and env holds the secret", i, cr.Name)
		case cr.File != "" && !strings.HasPrefix(cr.File, "/"):
			bad("credentials[%d] (%s): file must be an absolute path", i, cr.Name)
		}
		creds[cr.Name] = true
	}
	names := map[string]bool{}
	for i, e := range c.Endpoints {
		if !actorName.MatchString(e.Name) || names[e.Name] {
			bad("endpoints[%d]: invalid or duplicate name %q", i, e.Name)
		}
		names[e.Name] = true
		u, err := url.Parse(e.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			bad("endpoints[%d] (%s): base_url must be an http(s) URL without credentials, query or fragment", i, e.Name)
		}
		for _, m := range e.Methods {
			if m != strings.ToUpper(m) || !headerName.MatchString(m) {
				bad("endpoints[%d] (%s): method %q must be an upper-case token", i, e.Name, m)
			}
		}
		for _, p := range e.PathPrefixes {
			if !strings.HasPrefix(p, "/") || path.Clean(p) != strings.TrimSuffix(p, "/") && p != "/" {
				bad("endpoints[%d] (%s): path prefix %q must be a clean absolute path", i, e.Name, p)
			}
		}
		if e.Class != "" && !classes[e.Class] {
			bad("endpoints[%d] (%s): unknown class %q", i, e.Name, e.Class)
		}
		if e.Credential != "" && !creds[e.Credential] {
			bad("endpoints[%d] (%s): unknown credential %q", i, e.Name, e.Credential)
		}
		if e.Timeout < 0 || e.MaxResponseBytes < 0 || e.MaxResponseBytes > markers.MaxResultBytes/2 {
			bad("endpoints[%d] (%s): timeout and max_response_bytes (≤ %d) must not be negative", i, e.Name, markers.MaxResultBytes/2)
		}
		if e.Class == ClassConditionalWrite && e.StatusCheck == "" {
			bad("endpoints[%d] (%s): a conditional_write endpoint needs a status_check path", i, e.Name)
		}
	}
	return errs
}

// ForbiddenHeader reports whether the header (canonical form) is one the bastion or the
// transport sets, never a caller.
func ForbiddenHeader(name string) bool { return forbiddenHeaders[name] }

// ValidHeaderName reports whether name is an HTTP token usable as a header name.
func ValidHeaderName(name string) bool { return headerName.MatchString(name) }

// Endpoint returns the configured endpoint name with its defaults applied.
func (c Config) Endpoint(name string) (Endpoint, bool) {
	for _, e := range c.Endpoints {
		if e.Name == name {
			if len(e.Methods) == 0 {
				e.Methods = []string{"GET"}
			}
			if len(e.PathPrefixes) == 0 {
				e.PathPrefixes = []string{"/"}
			}
			if e.Class == "" {
				e.Class = ClassIdempotentWrite
			}
			if e.Timeout == 0 {
				e.Timeout = defaultEndpointTimeout
			}
			if e.MaxResponseBytes == 0 {
				e.MaxResponseBytes = defaultMaxResponseBytes
			}
			if len(e.KeepHeaders) == 0 {
				e.KeepHeaders = defaultKeepHeaders
			}
			return e, true
		}
	}
	return Endpoint{}, false
}

// Credential returns the configured credential name.
func (c Config) Credential(name string) (Credential, bool) {
	for _, cr := range c.Credentials {
		if cr.Name == name {
			return cr, true
		}
	}
	return Credential{}, false
}
