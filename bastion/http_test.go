package bastion

import (
	"strings"
	"testing"
)

func TestCheckPath(t *testing.T) {
	prefixes := []string{"/v1/payments", "/v1/refunds/"}
	tests := []struct {
		path    string
		wantErr string
	}{
		{"/v1/payments", ""},
		{"/v1/payments/p_1", ""},
		{"/v1/refunds/r_1", ""},
		{"/v1/paymentsX", "not under"},
		{"/v2/payments", "not under"},
		{"/v1/payments/../admin", "clean"},
		{"/v1/payments/./x", "clean"},
		{"/v1/payments?x=1", "clean"},
		{"/v1/payments#f", "clean"},
		{"v1/payments", "clean"},
		{"/v1/payments/a\r\nX: y", "clean"},
		{"", "clean"},
	}
	for _, tt := range tests {
		err := checkPath(tt.path, prefixes)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("checkPath(%q) = %v; want %q", tt.path, err, tt.wantErr)
		}
	}
}

func TestCheckHeaders(t *testing.T) {
	b := &Bastion{cfg: Config{Credentials: []CredentialConfig{{Name: "api", Kind: "header", Header: "X-Api-Key", Env: "K"}}}}
	ep := EndpointConfig{Name: "e", Credential: "api"}
	tests := []struct {
		name    string
		headers map[string]string
		wantErr string
	}{
		{"plain", map[string]string{"X-Request-Source": "agent", "accept": "application/json"}, ""},
		{"authorization", map[string]string{"authorization": "Bearer mine"}, "set by the bastion"},
		{"credential header", map[string]string{"x-api-key": "mine"}, "set by the bastion"},
		{"idempotency key", map[string]string{"Idempotency-Key": "k"}, "set by the bastion"},
		{"host", map[string]string{"Host": "evil"}, "set by the bastion"},
		{"CRLF injection", map[string]string{"X-A": "v\r\nAuthorization: Bearer x"}, "one line"},
		{"bad name", map[string]string{"X A": "v"}, "not a valid token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.checkHeaders(tt.headers, ep)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("checkHeaders = %v; want %q", err, tt.wantErr)
			}
		})
	}
}

func TestRequestBodyIsCanonical(t *testing.T) {
	b := &Bastion{cfg: DefaultConfig("/x")}
	one, _, ct, err := b.requestBody(HTTPArgs{JSON: map[string]any{"b": 1.0, "a": []any{"x", true}}})
	if err != nil || ct != "application/json" {
		t.Fatal(err, ct)
	}
	if string(one) != `{"a":["x",true],"b":1}` {
		t.Fatalf("body = %s; want RFC 8785 canonical JSON", one)
	}
	text := "hi"
	if _, _, _, err := b.requestBody(HTTPArgs{JSON: map[string]any{}, Text: &text}); err == nil {
		t.Fatal("json and text together were accepted")
	}
	b.cfg.MaxRequestBodyBytes = 4
	if _, _, _, err := b.requestBody(HTTPArgs{Text: &[]string{"12345"}[0]}); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversize body: %v", err)
	}
}

func TestValidateHTTPConfig(t *testing.T) {
	base := func() Config {
		c := DefaultConfig("/x")
		c.HTTPPlugin = PluginConfig{Path: "/usr/lib/postern/postern-plugin-http", SHA256: strings.Repeat("a", 64)}
		c.Credentials = []CredentialConfig{{Name: "api", Kind: "bearer", File: "/etc/postern/api"}}
		c.Endpoints = []EndpointConfig{{Name: "pay", BaseURL: "https://pay.example/api", Methods: []string{"POST"}, PathPrefixes: []string{"/v1"}, Class: ClassIrreversible, Credential: "api"}}
		return c
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"ok", func(*Config) {}, ""},
		{"endpoints without plugin", func(c *Config) { c.HTTPPlugin = PluginConfig{} }, "http_plugin"},
		{"credential in the URL", func(c *Config) { c.Endpoints[0].BaseURL = "https://u:p@pay.example" }, "without credentials"},
		{"unknown credential", func(c *Config) { c.Endpoints[0].Credential = "nope" }, "unknown credential"},
		{"secret in two places", func(c *Config) { c.Credentials[0].Env = "X" }, "exactly one"},
		{"conditional without status check", func(c *Config) { c.Endpoints[0].Class = ClassConditionalWrite }, "status_check"},
		{"lower-case method", func(c *Config) { c.Endpoints[0].Methods = []string{"post"} }, "upper-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Validate = %v; want %q", err, tt.wantErr)
			}
		})
	}
}

// FuzzHTTPArgs: whatever the checks accept cannot split a header or leave the prefixes.
func FuzzHTTPArgs(f *testing.F) {
	f.Add("/v1/x", "X-A", "v", "k", "v")
	f.Add("/v1/../x", "Authorization", "Bearer a\r\nB: c", "a&b", "c=d")
	b := &Bastion{cfg: DefaultConfig("/x")}
	f.Fuzz(func(t *testing.T, p, hName, hValue, qKey, qValue string) {
		if checkPath(p, []string{"/v1"}) == nil && (!strings.HasPrefix(p, "/v1") || strings.Contains(p, "..") || strings.ContainsAny(p, "?#\r\n")) {
			t.Fatalf("path %q accepted", p)
		}
		if h, err := b.checkHeaders(map[string]string{hName: hValue}, EndpointConfig{}); err == nil {
			for k, vs := range h {
				if strings.ContainsAny(k+strings.Join(vs, ""), "\r\n\x00") || k == "Authorization" {
					t.Fatalf("header %q: %q accepted", k, vs)
				}
			}
		}
		if q, err := normalizeQuery(map[string][]string{qKey: {qValue}}); err == nil && strings.ContainsAny(q.Encode(), "\r\n ") {
			t.Fatalf("query encodes to %q", q.Encode())
		}
	})
}
