package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/plugins"
)

const (
	// httpSamples is how many calls each side of BenchmarkHTTPRequest makes; httpBlock how
	// many one side makes before the next takes over.
	httpSamples = 300
	httpBlock   = 25
)

// discardJournal stands in for the bastion's journal when the plugin is driven directly.
type discardJournal struct{}

func (discardJournal) Dispatched(context.Context, string) error                      { return nil }
func (discardJournal) Completed(context.Context, string, plugins.HTTPResponse) error { return nil }
func (discardJournal) Failed(context.Context, string, string) error                  { return nil }
func (discardJournal) Unknown(context.Context, string, string) error                 { return nil }

// BenchmarkHTTPRequest is the latency of one http_request POST end to end — a go-sdk MCP
// client over Streamable HTTP → `postern serve` (journal, fingerprint) → postern-plugin-http
// over go-plugin gRPC (with the journal callbacks over the broker) → a local target — against
// a direct Go net/http POST to the same target, in alternating blocks. The layers in between
// are measured in the same run to split the overhead: the bastion in-process (no MCP), the
// plugin driven directly through plugins.Manager (no journal), and net/http on a fresh
// connection per request (the plugin opens one per execution, by design).
func BenchmarkHTTPRequest(b *testing.B) {
	target := testutil.StartHTTPTarget(b, testutil.HTTPTargetOptions{})
	pluginPath, sum := harness.HTTPPlugin(b)
	secretFile := filepath.Join(b.TempDir(), "api.secret")
	if err := os.WriteFile(secretFile, []byte("bench-secret\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	const endpoint = "bench"
	bs := harness.NewBastion(b, testutil.NewSSHKey(b),
		fmt.Sprintf("[http_plugin]\npath = %q\nsha256 = %q", pluginPath, sum),
		fmt.Sprintf("[[credentials]]\nname = \"api\"\nkind = \"bearer\"\nfile = %q", secretFile),
		endpointTable(endpoint, target.URL, config.ClassIdempotentWrite))
	bs.Start(b)
	cs := bs.Connect(b, "agent", runHeader("bench"))
	ctx := context.Background()

	// The same bastion code in this process, on its own state dir: no MCP, no HTTP transport.
	cfg := config.DefaultConfig(filepath.Join(sockdir.New(b), "state"))
	cfg.Listen = ""
	cfg.Actors = []policy.Actor{{Name: "bench", TokenSHA256: transport.HashToken("bench")}}
	cfg.HTTPPlugin = config.Plugin{Path: pluginPath, SHA256: sum}
	cfg.Credentials = []config.Credential{{Name: "api", Kind: "bearer", File: secretFile}}
	cfg.Endpoints = []config.Endpoint{{Name: endpoint, BaseURL: target.URL, Methods: []string{"POST"}, PathPrefixes: []string{"/v1"},
		Class: config.ClassIdempotentWrite, Credential: "api", Timeout: 30 * time.Second}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	inproc, err := bastion.Open(bastion.Options{Config: cfg, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer inproc.Close()
	if err := inproc.Recover(ctx); err != nil {
		b.Fatal(err)
	}

	manager, err := plugins.NewManager(plugins.ManagerOptions{Path: pluginPath, SHA256: sum, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer manager.Close()

	body := []byte(`{"amount":1,"currency":"EUR"}`)
	keepAlive := &http.Client{Transport: &http.Transport{}}
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer keepAlive.CloseIdleConnections()

	calls := 0
	// Each call is a new intent (its own query value) and a new Idempotency-Key.
	next := func() string { calls++; return strconv.Itoa(calls) }
	args := func(n string) map[string]any {
		return map[string]any{"endpoint": endpoint, "method": "POST", "path": "/v1/payments", "query": map[string]any{"n": []string{n}},
			"json": map[string]any{"amount": 1, "currency": "EUR"}}
	}
	viaMCP := func() error {
		n := next()
		x, err := callExecution(ctx, cs, "http_request", args(n))
		if err != nil || x.State != "completed" || x.HTTPStatus != http.StatusOK || x.Replayed {
			return fmt.Errorf("http_request %s: %+v, %v", n, x, err)
		}
		return nil
	}
	caller := transport.Caller{Actor: "token:bench", RunID: "bench"}
	inProcess := func() error {
		n := next()
		x, err := inproc.Engine().HTTPRequest(ctx, caller, api.HTTPArgs{Endpoint: endpoint, Method: "POST", Path: "/v1/payments",
			Query: map[string][]string{"n": {n}}, JSON: map[string]any{"amount": 1, "currency": "EUR"}}, nil)
		if err != nil || x.State != "completed" || x.HTTPStatus != http.StatusOK {
			return fmt.Errorf("in-process HTTPRequest %s: %+v, %v", n, x, err)
		}
		return nil
	}
	pluginDirect := func() error {
		id := newID(b)
		out, err := manager.Perform(ctx, plugins.HTTPAction{
			ExecutionID: id, Method: "POST", URL: target.URL + "/v1/payments?n=" + next(),
			Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body,
			Credential: &plugins.Credential{Kind: plugins.CredentialBearer, Secret: "bench-secret"}, Timeout: 30 * time.Second,
		}, discardJournal{})
		if err != nil || out.State != plugins.StateCompleted || out.Response.Status != http.StatusOK {
			return fmt.Errorf("plugin Perform %s: %+v, %v", id, out, err)
		}
		return nil
	}
	direct := func(hc *http.Client) func() error {
		return func() error {
			req, err := http.NewRequest("POST", target.URL+"/v1/payments?n="+next(), bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer bench-secret")
			req.Header.Set("Idempotency-Key", `"`+newID(b)+`"`)
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
				return fmt.Errorf("direct POST: %s, %v", resp.Status, err)
			}
			return nil
		}
	}
	sides := []*benchSide{
		{name: "postern (MCP → bastion → plugin → target)", call: viaMCP},
		{name: "bastion in-process (journal → plugin → target)", call: inProcess},
		{name: "plugin direct (Manager.Perform, no journal)", call: pluginDirect},
		{name: "net/http direct, new connection per request", call: direct(fresh)},
		{name: "net/http direct, keep-alive", call: direct(keepAlive)},
	}
	const mcpSide, inprocSide, pluginSide, freshSide, keepAliveSide = 0, 1, 2, 3, 4
	sampleInterleaved(b, sides, httpSamples, httpBlock, func() string { return "bastion log:\n" + bs.Logs() })

	p50 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.5) }
	p99 := func(i int) time.Duration { return testutil.Percentile(sides[i].took, 0.99) }
	b.ReportMetric(ms(p50(mcpSide)), "postern-p50-ms")
	b.ReportMetric(ms(p99(mcpSide)), "postern-p99-ms")
	b.ReportMetric(ms(p50(keepAliveSide)), "direct-p50-ms")
	b.ReportMetric(ms(p99(keepAliveSide)), "direct-p99-ms")
	b.ReportMetric(float64(p50(mcpSide))/float64(p50(keepAliveSide)), "p50-postern/direct")
	b.ReportMetric(ms(p50(pluginSide)-p50(freshSide)), "plugin-hop-p50-ms")
	b.ReportMetric(ms(p50(mcpSide)-p50(inprocSide)), "mcp-p50-ms")
	b.ReportMetric(ms(p50(inprocSide)-p50(pluginSide)), "journal-p50-ms")
	rows := [][]string{{"", "p50 ms", "p99 ms", "p50 / direct keep-alive", "p99 / direct keep-alive"}}
	for i, side := range sides {
		rows = append(rows, []string{side.name, f2(ms(p50(i))), f2(ms(p99(i))),
			f2(float64(p50(i)) / float64(p50(keepAliveSide))), f2(float64(p99(i)) / float64(p99(keepAliveSide)))})
	}
	diff := func(name string, a, c int) []string {
		return []string{name, f2(ms(p50(a) - p50(c))), f2(ms(p99(a) - p99(c)))}
	}
	rows = append(rows,
		diff("MCP + journal (postern − plugin direct)", mcpSide, pluginSide),
		diff("plugin hop: gRPC + broker (plugin direct − new connection)", pluginSide, freshSide),
	)
	// Ten lines at most: go test truncates a benchmark's log beyond that without -v.
	table(b, fmt.Sprintf("http_request POST to a local target, %d samples each, alternating blocks of %d", httpSamples, httpBlock), rows...)
	if target.TotalEffects() != len(sides)*(httpSamples+10) {
		b.Fatalf("target counted %d effects; want %d (every call a new intent)", target.TotalEffects(), len(sides)*(httpSamples+10))
	}
}
