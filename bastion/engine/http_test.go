package engine

import (
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
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
	b := &Engine{core: &core{cfg: config.Config{Credentials: []config.Credential{{Name: "api", Kind: "header", Header: "X-Api-Key", Env: "K"}}}}}
	ep := config.Endpoint{Name: "e", Credential: "api"}
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
	b := &Engine{core: &core{cfg: config.DefaultConfig("/x")}}
	one, _, ct, err := b.requestBody(api.HTTPArgs{JSON: map[string]any{"b": 1.0, "a": []any{"x", true}}})
	if err != nil || ct != "application/json" {
		t.Fatal(err, ct)
	}
	if string(one) != `{"a":["x",true],"b":1}` {
		t.Fatalf("body = %s; want RFC 8785 canonical JSON", one)
	}
	text := "hi"
	if _, _, _, err := b.requestBody(api.HTTPArgs{JSON: map[string]any{}, Text: &text}); err == nil {
		t.Fatal("json and text together were accepted")
	}
	b.cfg.MaxRequestBodyBytes = 4
	if _, _, _, err := b.requestBody(api.HTTPArgs{Text: &[]string{"12345"}[0]}); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversize body: %v", err)
	}
}

// FuzzHTTPArgs: whatever the checks accept cannot split a header or leave the prefixes.
func FuzzHTTPArgs(f *testing.F) {
	f.Add("/v1/x", "X-A", "v", "k", "v")
	f.Add("/v1/../x", "Authorization", "Bearer a\r\nB: c", "a&b", "c=d")
	b := &Engine{core: &core{cfg: config.DefaultConfig("/x")}}
	f.Fuzz(func(t *testing.T, p, hName, hValue, qKey, qValue string) {
		if checkPath(p, []string{"/v1"}) == nil && (!strings.HasPrefix(p, "/v1") || strings.Contains(p, "..") || strings.ContainsAny(p, "?#\r\n")) {
			t.Fatalf("path %q accepted", p)
		}
		if h, err := b.checkHeaders(map[string]string{hName: hValue}, config.Endpoint{}); err == nil {
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
