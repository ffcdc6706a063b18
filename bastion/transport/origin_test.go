package transport

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestParseOrigin(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" = refused
	}{
		{"http://localhost:6274", "http://localhost:6274"},
		{"HTTP://LocalHost:6274", "http://localhost:6274"},
		{"http://127.0.0.1", "http://127.0.0.1"},
		{"http://127.0.0.1:80", "http://127.0.0.1"},
		{"https://console.example:443", "https://console.example"},
		{"https://console.example:8443", "https://console.example:8443"},
		{"http://[::1]:6274", "http://[::1]:6274"},
		{"http://[0:0:0:0:0:0:0:1]", "http://[::1]"},
		{"http://localhost:06274", "http://localhost:6274"},
		{"null", ""},
		{"", ""},
		{"localhost:6274", ""},
		{"file://", ""},
		{"ftp://localhost", ""},
		{"http://", ""},
		{"http://localhost/", ""},
		{"http://localhost/path", ""},
		{"http://localhost?q", ""},
		{"http://localhost#f", ""},
		{"http://user@localhost", ""},
		{"http://user:pw@evil.example", ""},
		{"http://localhost:", ""},
		{"http://localhost:0", ""},
		{"http://localhost:65536", ""},
		{"http://localhost:+80", ""},
		{"http://localhost:80:80", ""},
		{"http://[::1", ""},
		{"http://[::1]x", ""},
		{"http://[fe80::1%eth0]", ""},
		{"http://[127.0.0.1]", ""},
		{"http://loc alhost", ""},
		{"http://a..b", ""},
		{"http://evil.example\\@localhost", ""},
		{"http://" + strings.Repeat("a", 300), ""},
	}
	for _, tt := range tests {
		o, err := parseOrigin(tt.in)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("parseOrigin(%q) = %v; want an error", tt.in, o)
		case tt.want != "" && err != nil:
			t.Errorf("parseOrigin(%q): %v; want %s", tt.in, err, tt.want)
		case tt.want != "" && o.String() != tt.want:
			t.Errorf("parseOrigin(%q) = %s; want %s", tt.in, o, tt.want)
		}
	}
	if _, err := parseOrigin("null"); !errors.Is(err, ErrNullOrigin) {
		t.Errorf("parseOrigin(null) = %v; want ErrNullOrigin", err)
	}
}

// TestGuardDecide is the Host/Origin decision table: the listen's local address, the Host
// header and the Origin header(s) against allowed_hosts = ["postern.example"] and
// allowed_origins = ["https://console.example"].
func TestGuardDecide(t *testing.T) {
	g, err := newGuard([]string{"postern.example"}, []string{"https://console.example/"})
	if err != nil {
		t.Fatal(err)
	}
	const (
		loop   = "127.0.0.1:7410"
		loop6  = "[::1]:7410"
		public = "10.0.0.5:7410"
	)
	tests := []struct {
		name    string
		local   string
		host    string
		origins []string
		status  int    // 0 admitted
		cors    string // Access-Control-Allow-Origin
		reason  string // part of the refusal body
	}{
		{name: "loopback, no origin", local: loop, host: "127.0.0.1:7410"},
		{name: "loopback, localhost host any port", local: loop, host: "localhost:1234"},
		{name: "loopback v6 host", local: loop6, host: "[::1]:7410"},
		{name: "loopback, other 127/8 host", local: loop, host: "127.0.0.2"},
		{name: "loopback, upper-case localhost (the go-sdk refuses it too)", local: loop, host: "LOCALHOST:7410", status: 403},
		{name: "loopback, rebinding host", local: loop, host: "evil.example.com", status: 403, reason: "DNS-rebinding"},
		{name: "loopback, allowed_hosts does not open a loopback listen", local: loop, host: "postern.example", status: 403},
		{name: "loopback, empty host", local: loop, host: "", status: 403},
		{name: "loopback, inspector origin", local: loop, host: "localhost:7410", origins: []string{"http://localhost:6274"}, cors: "http://localhost:6274"},
		{name: "loopback, 127.0.0.1 origin https", local: loop, host: "127.0.0.1:7410", origins: []string{"https://127.0.0.1:5173"}, cors: "https://127.0.0.1:5173"},
		{name: "loopback, [::1] origin", local: loop6, host: "[::1]:7410", origins: []string{"http://[::1]:3000"}, cors: "http://[::1]:3000"},
		{name: "loopback, listed origin", local: loop, host: "localhost:7410", origins: []string{"https://console.example"}, cors: "https://console.example"},
		{name: "loopback, listed origin default port", local: loop, host: "localhost:7410", origins: []string{"https://console.example:443"}, cors: "https://console.example:443"},
		{name: "loopback, foreign origin", local: loop, host: "localhost:7410", origins: []string{"http://evil.example.com"}, status: 403, reason: "--allow-origin http://evil.example.com"},
		{name: "loopback, listed host wrong scheme", local: loop, host: "localhost:7410", origins: []string{"http://console.example"}, status: 403, reason: "allowed_origins"},
		{name: "loopback, rebinding host and origin", local: loop, host: "evil.example.com", origins: []string{"http://evil.example.com"}, status: 403, reason: "Host"},
		{name: "loopback, null origin", local: loop, host: "localhost:7410", origins: []string{"null"}, status: 403, reason: "null"},
		{name: "loopback, origin with path", local: loop, host: "localhost:7410", origins: []string{"http://localhost:6274/app"}, status: 403},
		{name: "loopback, origin with userinfo", local: loop, host: "localhost:7410", origins: []string{"http://localhost@evil.example"}, status: 403},
		{name: "loopback, localhost subdomain origin", local: loop, host: "localhost:7410", origins: []string{"http://evil.localhost"}, status: 403},
		{name: "loopback, two origins", local: loop, host: "localhost:7410", origins: []string{"http://localhost", "http://localhost"}, status: 403},
		{name: "public, allowed host", local: public, host: "postern.example"},
		{name: "public, own IP literal", local: public, host: "10.0.0.5:7410"},
		{name: "public, own IP other port", local: public, host: "10.0.0.5:1", status: 403},
		{name: "public, localhost host", local: public, host: "localhost"},
		{name: "public, unknown host", local: public, host: "evil.example.com", status: 403, reason: "allowed_hosts"},
		{name: "public, loopback origin must be listed", local: public, host: "postern.example", origins: []string{"http://localhost:6274"}, status: 403},
		{name: "public, listed origin", local: public, host: "postern.example", origins: []string{"https://console.example"}, cors: "https://console.example"},
		{name: "unknown local address, loopback origin must be listed", local: "", host: "localhost", origins: []string{"http://localhost"}, status: 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := g.decide(tt.host, tt.origins, tt.local)
			if v.status != tt.status {
				t.Fatalf("status = %d (%s); want %d", v.status, v.reason, tt.status)
			}
			if v.allowOrigin != tt.cors {
				t.Errorf("allowOrigin = %q; want %q", v.allowOrigin, tt.cors)
			}
			if !strings.Contains(v.reason, tt.reason) {
				t.Errorf("reason = %q; want it to contain %q", v.reason, tt.reason)
			}
		})
	}
}

func TestGuardRejectsBadConfig(t *testing.T) {
	for _, o := range []string{"null", "localhost:3000", "http://localhost:3000/app", "http://u@localhost"} {
		if _, err := newGuard(nil, []string{o}); err == nil {
			t.Errorf("allowed origin %q accepted; want an error", o)
		}
	}
}

// FuzzParseOrigin: whatever the input, a parsed origin is the canonical form of itself,
// carries nothing but scheme, host and port, and is safe to echo in a header.
func FuzzParseOrigin(f *testing.F) {
	for _, s := range []string{"http://localhost:6274", "https://[::1]:443", "null", "http://a@b", "http://x/y", "HTTP://A.B:080"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := parseOrigin(s)
		if err != nil {
			return
		}
		if o.scheme != "http" && o.scheme != "https" {
			t.Fatalf("scheme %q", o.scheme)
		}
		c := o.String()
		if strings.ContainsAny(c[len(o.scheme)+3:], "/?#@\\ \r\n\t") {
			t.Fatalf("parseOrigin(%q) = %q carries more than host and port", s, c)
		}
		again, err := parseOrigin(c)
		if err != nil || again != o {
			t.Fatalf("parseOrigin(%q) = %q, which parses as %v, %v", s, c, again, err)
		}
		if strings.ContainsAny(s, "\r\n\x00") {
			t.Fatalf("parseOrigin accepted control bytes in %q", s)
		}
	})
}

// TestHTTPHandlerCORS: a browser's preflight from the Inspector's loopback origin is
// answered before authentication with what the browser needs; a foreign origin's is refused
// with a body that says how to allow it; the actual request carries the CORS headers even
// on 401, so the page can read the challenge.
func TestHTTPHandlerCORS(t *testing.T) {
	f := newHTTPFixture(t)
	do := func(method, origin string, header map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, f.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", origin)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	preflight := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type,mcp-protocol-version"}

	resp := do(http.MethodOptions, "http://localhost:6274", preflight)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("inspector preflight status = %d; want 204", resp.StatusCode)
	}
	for k, want := range map[string]string{
		"Access-Control-Allow-Origin":   "http://localhost:6274",
		"Access-Control-Allow-Headers":  corsAllowHeaders,
		"Access-Control-Allow-Methods":  corsAllowMethods,
		"Access-Control-Expose-Headers": corsExposeHeaders,
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("preflight %s = %q; want %q", k, got, want)
		}
	}
	for _, h := range []string{"Authorization", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID"} {
		if !strings.Contains(corsAllowHeaders, h) {
			t.Errorf("Access-Control-Allow-Headers lacks %s", h)
		}
	}

	resp = do(http.MethodOptions, "http://evil.example.com", preflight)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" ||
		!strings.Contains(string(body), "--allow-origin http://evil.example.com") {
		t.Errorf("foreign preflight = %d, ACAO %q, body %q; want 403 without ACAO, naming --allow-origin",
			resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"), body)
	}

	resp = do(http.MethodPost, "http://127.0.0.1:6274", map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Access-Control-Allow-Origin") != "http://127.0.0.1:6274" {
		t.Errorf("unauthenticated POST from a loopback origin = %d, ACAO %q; want 401 with ACAO", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
}
