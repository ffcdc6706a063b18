package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// conformanceScenarios are the MCP conformance suite's server scenarios that apply to
// Postern's capabilities (tools, logging; no resources, prompts, completions or sampling),
// with the checks each must pass.
var conformanceScenarios = []struct {
	name   string
	checks []string
}{
	{"server-initialize", []string{"server-initialize"}},
	{"ping", []string{"ping"}},
	{"tools-list", []string{"tools-list"}},
	{"logging-set-level", []string{"logging-set-level"}},
	{"dns-rebinding-protection", []string{"localhost-host-rebinding-rejected", "localhost-host-valid-accepted"}},
}

// conformanceCheck is one check of the suite's checks.json.
type conformanceCheck struct {
	ID           string `json:"id"`
	Status       string `json:"status"`
	ErrorMessage string `json:"errorMessage"`
	Details      any    `json:"details"`
}

// TestConformance runs the MCP conformance suite (@modelcontextprotocol/conformance, pinned
// in tsclient/package.json) against a real `postern up` on 127.0.0.1, port 0, and requires
// every check of the applicable scenarios to pass.
//
// The suite sends no credentials, and Postern's HTTP endpoint has no unauthenticated mode.
// So the suite talks to a loopback reverse proxy that adds the up's bearer token and
// forwards everything else untouched — the Host and Origin headers included, so the
// dns-rebinding checks exercise Postern's own guard (and the go-sdk's, behind it).
func TestConformance(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed, so the MCP conformance suite cannot run (.ci/run installs it)")
	}
	suite, err := filepath.Abs(filepath.Join(tsClientDir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(suite); err != nil {
		t.Fatalf("the MCP conformance suite is not installed: run `npm ci --prefix integration/tsclient` (scripts/test does): %v", err)
	}

	bin := harness.Binary(t, "postern")
	dir := filepath.Join(sockdir.New(t), "state")
	up, stdout, stderr := startUp(t, bin, dir, "127.0.0.1:0", "127.0.0.1:0")
	t.Cleanup(func() {
		up.Process.Signal(syscall.SIGTERM)
		if err := up.Wait(); err != nil {
			t.Errorf("up exited with %v\n%s", err, stderr.String())
		}
	})
	target, err := url.Parse(upURL(t, readUntil(t, stdout, "Operator:")))
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	proxyURL := startBearerProxy(t, target, strings.TrimSpace(string(token)))

	var ran []string
	for _, sc := range conformanceScenarios {
		out := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, node, suite, "server", "--url", proxyURL, "--scenario", sc.name, "-o", out)
		cmd.Dir = tsClientDir
		printed, err := cmd.CombinedOutput()
		cancel()
		checks := readConformanceChecks(t, out)
		if err != nil {
			t.Errorf("scenario %s: %v\n%s", sc.name, err, printed)
		}
		got := map[string]conformanceCheck{}
		for _, c := range checks {
			if c.Status == "FAILURE" {
				t.Errorf("scenario %s: check %s failed: %s (details %v)", sc.name, c.ID, c.ErrorMessage, c.Details)
			}
			got[c.ID] = c
		}
		for _, id := range sc.checks {
			if got[id].Status != "SUCCESS" {
				t.Errorf("scenario %s: check %s = %q; want SUCCESS (all checks: %+v)", sc.name, id, got[id].Status, checks)
			}
		}
		ran = append(ran, sc.name+" ("+strings.Join(sc.checks, ", ")+")")
	}
	t.Logf("conformance scenarios run against postern up: %s", strings.Join(ran, "; "))
}

// readConformanceChecks reads the checks.json the suite wrote under out.
func readConformanceChecks(t *testing.T, out string) []conformanceCheck {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(out, "*", "checks.json"))
	if err != nil || len(files) != 1 {
		t.Fatalf("conformance results under %s: %q, %v; want one checks.json", out, files, err)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var checks []conformanceCheck
	if err := json.Unmarshal(data, &checks); err != nil {
		t.Fatalf("%s: %v", files[0], err)
	}
	return checks
}

// startBearerProxy serves, on 127.0.0.1 (port 0), a reverse proxy to target that adds
// Authorization: Bearer token and keeps the client's Host and Origin. It returns the proxy's
// MCP URL.
func startBearerProxy(t *testing.T, target *url.URL, token string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(&url.URL{Scheme: target.Scheme, Host: target.Host})
		r.Out.Host = r.In.Host
		r.Out.Header.Set("Authorization", "Bearer "+token)
	}}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String() + bastion.MCPPath
}
