package integration

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
)

// TestHTTPReflectedCredentialIsRedacted: an endpoint that echoes the request's headers sends
// the credential back, in response headers and body, raw, as the bearer value, as base64 of
// user:pass and as the whole Basic value, escaped in JSON, and cut by the body cap. Through the
// real plugin process, the journal (every file of the state dir), the audit export, the logs
// and every tool result hold the marker and no form of the secret.
func TestHTTPReflectedCredentialIsRedacted(t *testing.T) {
	target := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{})
	dir := t.TempDir()
	secret := "echo-s3cr3t-" + newID(t)[3:]
	if err := os.WriteFile(filepath.Join(dir, "s"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const capBytes = 200
	endpoint := func(name, cred string) string {
		return fmt.Sprintf("[[endpoints]]\nname = %q\nbase_url = %q\nmethods = [\"GET\"]\npath_prefixes = [\"/v1\"]\nclass = \"read_only\"\ncredential = %q\n"+
			"keep_headers = [\"Content-Type\", \"Echo-Authorization\", \"Echo-X-Api-Key\"]\nmax_response_bytes = %d\n", name, target.URL, cred, capBytes)
	}
	f := newHTTPFleet(t, httpFleetOptions{endpoints: []string{
		fmt.Sprintf("[[credentials]]\nname = \"echo-bearer\"\nkind = \"bearer\"\nfile = %q", filepath.Join(dir, "s")),
		fmt.Sprintf("[[credentials]]\nname = \"echo-basic\"\nkind = \"basic\"\nusername = \"bot\"\nfile = %q", filepath.Join(dir, "s")),
		fmt.Sprintf("[[credentials]]\nname = \"echo-key\"\nkind = \"header\"\nheader = \"X-Api-Key\"\nfile = %q", filepath.Join(dir, "s")),
		endpoint("echo-bearer", "echo-bearer"), endpoint("echo-basic", "echo-basic"), endpoint("echo-key", "echo-key"),
	}})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-echo"))
	basicValue := "Basic " + base64.StdEncoding.EncodeToString([]byte("bot:"+secret))
	tests := []struct {
		name, endpoint string
		query          map[string]any
		marker         string
	}{
		{name: "bearer, every header", endpoint: "echo-bearer", query: map[string]any{}, marker: "[REDACTED:echo-bearer]"},
		{name: "bearer, json", endpoint: "echo-bearer", query: map[string]any{"format": []string{"json"}}, marker: "[REDACTED:echo-bearer]"},
		{name: "basic, every header", endpoint: "echo-basic", query: map[string]any{}, marker: "[REDACTED:echo-basic]"},
		{name: "named header", endpoint: "echo-key", query: map[string]any{"header": []string{"X-Api-Key"}}, marker: "[REDACTED:echo-key]"},
		// The body cap falls inside the echoed value.
		{name: "bearer cut by the cap", endpoint: "echo-bearer", marker: "[REDACTED:echo-bearer]",
			query: map[string]any{"header": []string{"Authorization"}, "pad": []string{fmt.Sprint(capBytes - len("Bearer ") - len(secret)/2)}}},
		{name: "basic cut by the cap", endpoint: "echo-basic", marker: "[REDACTED:echo-basic]",
			query: map[string]any{"header": []string{"Authorization"}, "pad": []string{fmt.Sprint(capBytes - len(basicValue)/2)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(target.RequestsTo("/v1/echo"))
			x := f.mustCall(t, ctx, cs, map[string]any{"endpoint": tt.endpoint, "method": "GET", "path": "/v1/echo", "query": tt.query, "wait_s": 60})
			if x.State != "completed" || x.HTTPStatus != 200 || len(target.RequestsTo("/v1/echo")) != before+1 {
				t.Fatalf("http_request = %+v; want completed 200, one request", x)
			}
			seen := x.ResponseBody + fmt.Sprint(x.ResponseHeader)
			if strings.Contains(seen, secret[:len(secret)/2]) || strings.Contains(seen, basicValue[:len(basicValue)/2]) {
				t.Fatalf("the result holds (part of) the secret: %q", redact(redact(seen, secret), basicValue[len("Basic "):]))
			}
			if !strings.Contains(fmt.Sprint(x.ResponseHeader), tt.marker) {
				t.Errorf("response headers %v; want the echoed credential as %s", x.ResponseHeader, tt.marker)
			}
		})
	}
	f.secret = secret
	f.assertSecretNowhere(t)
}
