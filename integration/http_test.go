package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/procfs"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/plugins"
)

// The endpoints every httpFleet configures, one per action class, all on its target.
const (
	epIdempotent   = "idem"
	epIrreversible = "irrev"
	epConditional  = "cond"
	epReadOnly     = "read"
	// maxTestBody is the fleet's max_request_body_bytes.
	maxTestBody = 4096
)

// httpFleet is a real `postern serve` with the real HTTP plugin, a counting target, and a
// bearer credential whose secret the tests hunt for afterwards.
type httpFleet struct {
	bastion *harness.Bastion
	target  *testutil.HTTPTarget
	secret  string

	mu      sync.Mutex // guards results
	results [][]byte   // every tool result the tests received, as JSON
}

type httpFleetOptions struct {
	// endpoints are extra [[endpoints]] tables (credential "api" is available).
	endpoints []string
	// pluginPath and pluginSHA256 override the plugin and its pin (default: the built plugin
	// and its real checksum).
	pluginPath, pluginSHA256 string
	// noStart prepares the bastion without starting it.
	noStart bool
}

// endpointTable is one [[endpoints]] entry on baseURL with the bearer credential "api".
func endpointTable(name, baseURL, class string) string {
	extra := ""
	if class == config.ClassConditionalWrite {
		extra = "status_check = \"/status/{execution_id}\"\n"
	}
	return fmt.Sprintf("[[endpoints]]\nname = %q\nbase_url = %q\nmethods = [\"GET\", \"POST\", \"PUT\"]\npath_prefixes = [\"/v1\"]\nclass = %q\ncredential = \"api\"\ntimeout = \"30s\"\n%s",
		name, baseURL, class, extra)
}

func newHTTPFleet(t *testing.T, opts httpFleetOptions) *httpFleet {
	t.Helper()
	f := &httpFleet{target: testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{}), secret: "s3cr3t-" + newID(t)[3:]}
	secretFile := filepath.Join(t.TempDir(), "api.secret")
	if err := os.WriteFile(secretFile, []byte(f.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if opts.pluginPath == "" {
		opts.pluginPath = harness.Binary(t, "postern-plugin-http")
	}
	if opts.pluginSHA256 == "" {
		sum, err := plugins.FileSHA256(opts.pluginPath)
		if err != nil {
			t.Fatal(err)
		}
		opts.pluginSHA256 = sum
	}
	lines := []string{
		fmt.Sprintf("max_request_body_bytes = %d", maxTestBody),
		fmt.Sprintf("[http_plugin]\npath = %q\nsha256 = %q", opts.pluginPath, opts.pluginSHA256),
		fmt.Sprintf("[[credentials]]\nname = \"api\"\nkind = \"bearer\"\nfile = %q", secretFile),
	}
	for _, ep := range []struct{ name, class string }{
		{epIdempotent, config.ClassIdempotentWrite},
		{epIrreversible, config.ClassIrreversible},
		{epConditional, config.ClassConditionalWrite},
		{epReadOnly, config.ClassReadOnly},
	} {
		lines = append(lines, endpointTable(ep.name, f.target.URL, ep.class))
	}
	lines = append(lines, opts.endpoints...)
	f.bastion = harness.NewBastion(t, testutil.NewSSHKey(t), lines...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s", f.bastion.Logs())
		}
	})
	if !opts.noStart {
		f.bastion.Start(t)
	}
	return f
}

// call makes an http_request (or another execution tool) and keeps its result for the
// secret hunt. A refused call is an error wrapping errToolError.
func (f *httpFleet) call(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (api.Execution, error) {
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, tool, args, &x)
	if err != nil {
		return x, err
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return x, err
	}
	f.mu.Lock()
	f.results = append(f.results, raw)
	f.mu.Unlock()
	if res.StructuredContent == nil {
		return x, fmt.Errorf("%w: %s", errToolError, harness.ResultText(res))
	}
	return x, nil
}

func (f *httpFleet) mustCall(t *testing.T, ctx context.Context, cs *mcp.ClientSession, args map[string]any) api.Execution {
	t.Helper()
	x, err := f.call(ctx, cs, "http_request", args)
	if err != nil {
		t.Fatalf("http_request %v: %v", args, err)
	}
	if x.ExecutionID == "" {
		t.Fatalf("http_request %v: no execution id in %+v", args, x)
	}
	return x
}

func (f *httpFleet) mustRefuse(t *testing.T, ctx context.Context, cs *mcp.ClientSession, args map[string]any) string {
	t.Helper()
	x, err := f.call(ctx, cs, "http_request", args)
	if !isToolError(err) {
		t.Fatalf("http_request %v = %+v, %v; want a tool error", args, x, err)
	}
	return err.Error()
}

func isToolError(err error) bool { return errors.Is(err, errToolError) }

// payment is an http_request POST of a JSON body to path on endpoint.
func payment(endpoint, path string, amount int) map[string]any {
	return map[string]any{"endpoint": endpoint, "method": "POST", "path": path, "json": map[string]any{"amount": amount, "currency": "EUR"}, "wait_s": 60}
}

// secretForms are the byte strings that would betray the secret: itself, and its base64
// encodings at each alignment (JSON stores []byte fields as base64).
func secretForms(secret string) [][]byte {
	forms := [][]byte{[]byte(secret)}
	for k, start := range []int{0, 2, 3} { // the first characters that depend only on the secret
		n := k + len(secret)
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), secret...))
		forms = append(forms, []byte(enc[start:4*(n/3)]))
	}
	return forms
}

func containsSecret(data []byte, forms [][]byte) bool {
	for _, f := range forms {
		if bytes.Contains(data, f) {
			return true
		}
	}
	return false
}

// assertSecretNowhere greps for the secret in every file of the state dir (the Pebble
// journal included), the audit export, the bastion's logs (the plugin's lines included) and
// every tool result the test received.
func (f *httpFleet) assertSecretNowhere(t *testing.T) {
	t.Helper()
	forms := secretForms(f.secret)
	// The grep must be able to see it: the credential file holds it, once raw.
	if !containsSecret([]byte("x"+f.secret+"\n"), forms) || !containsSecret([]byte(base64.StdEncoding.EncodeToString([]byte("ab"+f.secret))), forms) {
		t.Fatal("secretForms does not recognize the secret")
	}
	files := 0
	err := filepath.WalkDir(f.bastion.StateDir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		if containsSecret(data, forms) {
			t.Errorf("the secret is in %s", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("the state dir has no files to search")
	}
	export := auditExport(t, f.bastion)
	if metric(t, f.bastion, "postern_executions_accepted_total") > 0 && !bytes.Contains(export, []byte("http_request")) {
		t.Fatalf("the audit export has no http_request event (%d bytes)", len(export))
	}
	if containsSecret(export, forms) {
		t.Error("the secret is in the audit export")
	}
	if containsSecret([]byte(f.bastion.Logs()), forms) {
		t.Error("the secret is in the bastion's log")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.results {
		if containsSecret(r, forms) {
			t.Errorf("the secret is in tool result %d: %s", i, r)
		}
	}
}

// operatorClient reaches the bastion's operator API over its unix socket.
func operatorClient(b *harness.Bastion) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", b.OperatorSocket)
	}}}
}

// auditExport is the journal's event log as the operator exports it (JSONL).
func auditExport(t *testing.T, b *harness.Bastion) []byte {
	t.Helper()
	hc := operatorClient(b)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://operator/v1/audit/export")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("audit export: %s, %v", resp.Status, err)
	}
	return data
}

// assertSentOnce checks what the target received for execution x on path: exactly one
// request, the execution id as an sf-string Idempotency-Key, and the bearer secret.
func (f *httpFleet) assertIdempotencyKeys(t *testing.T, reqs []testutil.ReceivedRequest, id string) {
	t.Helper()
	for i, r := range reqs {
		raw := r.Header.Values("Idempotency-Key")
		if len(raw) != 1 || raw[0] != `"`+id+`"` {
			t.Errorf("request %d carried Idempotency-Key %q; want the sf-string %q", i, raw, `"`+id+`"`)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer "+f.secret {
			t.Errorf("request %d carried Authorization %q; want the configured bearer secret", i, redact(got, f.secret))
		}
	}
}

// redact keeps a secret out of failure messages.
func redact(s, secret string) string { return strings.ReplaceAll(s, secret, "<secret>") }

func TestHTTPRequestCompletes(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-happy"))

	x := f.mustCall(t, ctx, cs, payment(epIdempotent, "/v1/payments", 42))
	if x.State != "completed" || x.HTTPStatus != http.StatusOK || x.IsError || x.Replayed {
		t.Fatalf("http_request = %+v; want completed with HTTP 200, not replayed", x)
	}
	if !strings.HasPrefix(x.ExecutionID, "ex_") {
		t.Fatalf("execution id %q", x.ExecutionID)
	}
	if ct := x.ResponseHeader["Content-Type"]; len(ct) != 1 || ct[0] != "application/json" {
		t.Errorf("response headers %v; want the kept Content-Type", x.ResponseHeader)
	}
	var answer struct {
		Effect    int    `json:"effect"`
		Key       string `json:"key"`
		BodyBytes int    `json:"body_bytes"`
	}
	if err := json.Unmarshal([]byte(x.ResponseBody), &answer); err != nil || answer.Key != x.ExecutionID || answer.Effect != 1 {
		t.Errorf("response body %q (%v); want the target's answer for key %s", x.ResponseBody, err, x.ExecutionID)
	}
	if x.ResponseBytes != int64(len(x.ResponseBody)) || x.ResponseTruncated {
		t.Errorf("response_bytes %d, truncated %v for a %d-byte body", x.ResponseBytes, x.ResponseTruncated, len(x.ResponseBody))
	}

	reqs := f.target.RequestsTo("/v1/payments")
	if len(reqs) != 1 || f.target.Effects(x.ExecutionID) != 1 || f.target.TotalEffects() != 1 {
		t.Fatalf("target saw %d requests, %d effects for %s, %d in all; want 1", len(reqs), f.target.Effects(x.ExecutionID), x.ExecutionID, f.target.TotalEffects())
	}
	f.assertIdempotencyKeys(t, reqs, x.ExecutionID)
	if got := string(reqs[0].Body); got != `{"amount":42,"currency":"EUR"}` {
		t.Errorf("target got body %s; want the canonical JSON", got)
	}
	if got := reqs[0].Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("target got Content-Type %q", got)
	}
	f.assertSecretNowhere(t)
}

// TestHTTPLostMCPResponseIsReplayed: the agent gives up on its call while the target holds
// the response; it re-issues the call in a new session of the same run and gets the same
// execution, replayed; the target saw one request.
func TestHTTPLostMCPResponseIsReplayed(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	const path = "/v1/payments/lost"
	f.target.Arm(path, testutil.FaultHold)
	args := payment(epIdempotent, path, 7)

	first := f.bastion.Connect(t, "agent", runHeader("run-lost"))
	callCtx, abandon := context.WithCancel(ctx)
	defer abandon()
	lost := make(chan error, 1)
	go func() {
		_, err := f.call(callCtx, first, "http_request", args)
		lost <- err
	}()
	f.target.WaitHeld(t, path)
	abandon()
	if err := <-lost; err == nil {
		t.Fatal("the abandoned call returned a result; want an error")
	}

	retried := make(chan callOutcome, 1)
	retry := f.bastion.Connect(t, "agent", runHeader("run-lost"))
	// One request first, so the retry's JSON-RPC id is not the abandoned call's: the first
	// session's notifications/cancelled may still be on its way, and a cancel is matched by
	// actor, run and id (two sessions of one run reusing an id is the documented limit).
	if _, err := retry.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	go func() {
		x, err := f.call(ctx, retry, "http_request", args)
		retried <- callOutcome{x, err}
	}()
	testutil.WaitFor(t, "the retry to join the execution", func() bool {
		return metric(t, f.bastion, `postern_dedup_hits_total{by="fingerprint"}`) >= 1
	})
	f.target.Release(path)
	got := <-retried
	if got.err != nil {
		t.Fatal(got.err)
	}
	x := got.x
	if x.State != "completed" || !x.Replayed || x.HTTPStatus != http.StatusOK {
		t.Fatalf("retry = %+v; want the execution completed, replayed", x)
	}
	reqs := f.target.RequestsTo(path)
	if len(reqs) != 1 || f.target.Effects(x.ExecutionID) != 1 {
		t.Fatalf("target saw %d requests, %d effects for %s; want 1", len(reqs), f.target.Effects(x.ExecutionID), x.ExecutionID)
	}
	f.assertIdempotencyKeys(t, reqs, x.ExecutionID)
	if n := metric(t, f.bastion, "postern_executions_accepted_total"); n != 1 {
		t.Fatalf("bastion accepted %v executions; want 1", n)
	}
	f.assertSecretNowhere(t)
}

// TestHTTPConnectionRefusedFails: nothing listens at the endpoint, so no request byte is
// written: the execution is failed (provably no effect). Once the API is up, the same call is
// a new execution and takes effect once.
func TestHTTPConnectionRefusedFails(t *testing.T) {
	downAddr, release := testutil.ClosedAddr(t)
	f := newHTTPFleet(t, httpFleetOptions{endpoints: []string{endpointTable("down", "http://"+downAddr, config.ClassIrreversible)}})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-down"))
	args := payment("down", "/v1/payments", 5)

	failed := f.mustCall(t, ctx, cs, args)
	if failed.State != "failed" || failed.HTTPStatus != 0 {
		t.Fatalf("http_request to a closed port = %+v; want failed", failed)
	}
	if rec := journaled(t, f.bastion, failed.ExecutionID); rec.State != markers.Failed || !hasEvidence(rec, "no request byte") {
		t.Fatalf("journal = %+v; want failed, no request byte written", rec)
	}

	release()
	up := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{Addr: downAddr})
	again := f.mustCall(t, ctx, cs, args)
	if again.ExecutionID == failed.ExecutionID || again.Replayed || again.State != "completed" || again.HTTPStatus != http.StatusOK {
		t.Fatalf("retry after the API came up = %+v; want a new execution, completed (the failed one was %s)", again, failed.ExecutionID)
	}
	if up.Effects(failed.ExecutionID) != 0 || up.Effects(again.ExecutionID) != 1 || up.TotalEffects() != 1 {
		t.Fatalf("effects: failed %d, retry %d, total %d; want 0, 1, 1", up.Effects(failed.ExecutionID), up.Effects(again.ExecutionID), up.TotalEffects())
	}
	f.assertSecretNowhere(t)
}

// TestHTTPResponseLostAfterWrite: the target performs the request and drops the connection
// before answering. What happens next is the endpoint class's decision.
func TestHTTPResponseLostAfterWrite(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-drop"))

	for _, tc := range []struct {
		name, endpoint string
		fault          testutil.HTTPFault
		// wantState is the call's outcome; wantSent how many times the request reached the
		// target; wantEffects how many effects it had; wantChecks status checks made.
		wantState                        string
		wantSent, wantEffects, wantCheck int
		wantReplayedByTarget             bool
		wantEvidence                     string
	}{
		{name: "idempotent_write re-sends the same key, the target replays", endpoint: epIdempotent, fault: testutil.FaultDropAfterRead,
			wantState: "completed", wantSent: 2, wantEffects: 1, wantReplayedByTarget: true, wantEvidence: "same Idempotency-Key"},
		{name: "read_only retries", endpoint: epReadOnly, fault: testutil.FaultDropAfterRead,
			wantState: "completed", wantSent: 2, wantEffects: 1, wantReplayedByTarget: true},
		{name: "irreversible is not re-sent, review required", endpoint: epIrreversible, fault: testutil.FaultDropAfterRead,
			wantState: "unknown", wantSent: 1, wantEffects: 1, wantEvidence: "review required"},
		{name: "conditional_write: the status check says it took effect", endpoint: epConditional, fault: testutil.FaultDropAfterRead,
			wantState: "completed", wantSent: 1, wantEffects: 1, wantCheck: 1, wantEvidence: "took effect"},
		{name: "conditional_write: the status check says it did not, re-sent once", endpoint: epConditional, fault: testutil.FaultDropBeforeEffect,
			wantState: "completed", wantSent: 2, wantEffects: 1, wantCheck: 1, wantEvidence: "404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/drop/" + strings.NewReplacer(" ", "-", ":", "", ",", "").Replace(tc.name)
			f.target.Arm(path, tc.fault)
			x := f.mustCall(t, ctx, cs, payment(tc.endpoint, path, 100))
			if x.State != tc.wantState || x.IdempotentReplayed != tc.wantReplayedByTarget {
				t.Fatalf("http_request = %+v; want %s, idempotent_replayed %v", x, tc.wantState, tc.wantReplayedByTarget)
			}
			if tc.wantState == "completed" && x.HTTPStatus != http.StatusOK {
				t.Fatalf("http_request = %+v; want HTTP 200", x)
			}
			reqs := f.target.RequestsTo(path)
			checks := f.target.RequestsTo("/status/" + x.ExecutionID)
			if len(reqs) != tc.wantSent || f.target.Effects(x.ExecutionID) != tc.wantEffects || len(checks) != tc.wantCheck {
				t.Fatalf("target: %d requests, %d effects, %d status checks for %s; want %d, %d, %d",
					len(reqs), f.target.Effects(x.ExecutionID), len(checks), x.ExecutionID, tc.wantSent, tc.wantEffects, tc.wantCheck)
			}
			f.assertIdempotencyKeys(t, reqs, x.ExecutionID)
			rec := journaled(t, f.bastion, x.ExecutionID)
			if tc.wantEvidence != "" && !hasEvidence(rec, tc.wantEvidence) {
				t.Errorf("evidence %q does not say %q", rec.Evidence, tc.wantEvidence)
			}
			if tc.wantState != "unknown" {
				return
			}
			// The agent retries the unknown execution: it gets it back, still unknown, and
			// nothing is sent.
			again := f.mustCall(t, ctx, cs, payment(tc.endpoint, path, 100))
			if again.ExecutionID != x.ExecutionID || !again.Replayed || again.State != "unknown" {
				t.Fatalf("retry of the unknown execution = %+v; want %s, replayed, unknown", again, x.ExecutionID)
			}
			if n := len(f.target.RequestsTo(path)); n != 1 {
				t.Fatalf("the retry of an irreversible unknown execution reached the target: %d requests", n)
			}
			if !strings.Contains(strings.ToLower(again.Next), "review") || !again.ReviewRequired {
				t.Errorf("retry = %+v; want review_required and a next step that says so", again)
			}
			if !journaled(t, f.bastion, x.ExecutionID).ReviewRequired {
				t.Errorf("journal record of %s does not require review", x.ExecutionID)
			}
		})
	}
	f.assertSecretNowhere(t)
}

// pluginPID finds the bastion's postern-plugin-http child process (0 if none runs).
func pluginPID(t *testing.T, bastionPID int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procfs.ReadStat(pid)
		if err != nil || st.PPID != bastionPID || st.State == 'Z' {
			continue // gone meanwhile, or not the bastion's
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err == nil && strings.HasPrefix(filepath.Base(exe), "postern-plugin-http") {
			return pid
		}
	}
	return 0
}

// TestHTTPPluginKilledMidRequest: the plugin is SIGKILLed while the target holds the
// request. The bytes were written, so the irreversible execution is unknown, not re-sent;
// the next http_request runs on a new plugin process.
func TestHTTPPluginKilledMidRequest(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-kill"))
	const path = "/v1/payments/held"
	f.target.Arm(path, testutil.FaultHold)

	done := make(chan callOutcome, 1)
	go func() {
		x, err := f.call(ctx, cs, "http_request", payment(epIrreversible, path, 9))
		done <- callOutcome{x, err}
	}()
	f.target.WaitHeld(t, path)
	pid := pluginPID(t, f.bastion.PID())
	if pid == 0 {
		t.Fatal("no postern-plugin-http child of the bastion")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	x := got.x
	if x.State != "unknown" {
		t.Fatalf("http_request with its plugin killed = %+v; want unknown", x)
	}
	rec := journaled(t, f.bastion, x.ExecutionID)
	if !hasEvidence(rec, "plugin") || !rec.ReviewRequired {
		t.Errorf("evidence %q, review required %v; want it to name the plugin failure and require review", rec.Evidence, rec.ReviewRequired)
	}
	f.target.Release(path)
	if n := len(f.target.RequestsTo(path)); n != 1 {
		t.Fatalf("target saw %d requests; want 1 (irreversible: not re-sent)", n)
	}

	next := f.mustCall(t, ctx, cs, payment(epIrreversible, "/v1/payments/after", 10))
	if next.State != "completed" || next.HTTPStatus != http.StatusOK {
		t.Fatalf("http_request after the crash = %+v; want completed", next)
	}
	if again := pluginPID(t, f.bastion.PID()); again == 0 || again == pid {
		t.Fatalf("plugin pid after the crash = %d (killed: %d); want a new process", again, pid)
	}
	f.assertSecretNowhere(t)
}

// TestHTTPPluginChecksumMismatch: a plugin binary that does not have the pinned SHA-256 is
// never run — refused at start, or, if it changes after start, refused at the call.
func TestHTTPPluginChecksumMismatch(t *testing.T) {
	t.Run("pinned checksum wrong at start", func(t *testing.T) {
		other, err := plugins.FileSHA256(harness.Binary(t, "postern"))
		if err != nil {
			t.Fatal(err)
		}
		f := newHTTPFleet(t, httpFleetOptions{pluginSHA256: other, noStart: true})
		ctx, cancel := context.WithTimeout(testContext(t), 30*time.Second)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, harness.Binary(t, "postern"), "serve", "--config", f.bastion.ConfigPath)
		cmd.Stderr = &stderr
		err = cmd.Run()
		if err == nil || ctx.Err() != nil {
			t.Fatalf("postern serve with a wrong plugin checksum: %v (ctx %v); want it to refuse to start\n%s", err, ctx.Err(), stderr.String())
		}
		if msg := stderr.String(); !strings.Contains(msg, "checksum") || !strings.Contains(msg, other) {
			t.Fatalf("postern serve refused with %q; want the checksum mismatch named", msg)
		}
	})
	t.Run("binary replaced after start", func(t *testing.T) {
		copyPath := filepath.Join(t.TempDir(), "postern-plugin-http")
		data, err := os.ReadFile(harness.Binary(t, "postern-plugin-http"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copyPath, data, 0o755); err != nil {
			t.Fatal(err)
		}
		f := newHTTPFleet(t, httpFleetOptions{pluginPath: copyPath})
		ctx := testContext(t)
		// The plugin starts on the first call; before it, the binary changes.
		if err := os.WriteFile(copyPath, append(data, "tampered"...), 0o755); err != nil {
			t.Fatal(err)
		}
		cs := f.bastion.Connect(t, "agent", runHeader("run-tampered"))
		x, err := f.call(ctx, cs, "http_request", payment(epIdempotent, "/v1/payments", 1))
		var msg string
		switch {
		case isToolError(err):
			msg = err.Error()
		case err != nil:
			t.Fatal(err)
		case x.State != "failed":
			t.Fatalf("http_request with a tampered plugin = %+v; want failed or refused", x)
		default:
			msg = strings.Join(journaled(t, f.bastion, x.ExecutionID).Evidence, "\n") + "\n" + x.Next
		}
		if !strings.Contains(msg, "checksum") {
			t.Fatalf("the refusal %q does not name the checksum mismatch", msg)
		}
		if n := len(f.target.Requests()); n != 0 {
			t.Fatalf("target saw %d requests from a tampered plugin", n)
		}
		if pid := pluginPID(t, f.bastion.PID()); pid != 0 {
			t.Fatalf("a tampered plugin runs as pid %d", pid)
		}
	})
}

// TestHTTPRequestValidation: requests outside what the endpoint allows, or that try to set
// what the bastion sets, are refused with a clear error and nothing is dispatched.
func TestHTTPRequestValidation(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-invalid"))
	post := func(mutate func(map[string]any)) map[string]any {
		args := payment(epIdempotent, "/v1/payments", 1)
		mutate(args)
		return args
	}
	text := "hello"
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"unknown endpoint", post(func(a map[string]any) { a["endpoint"] = "nope" }), `no endpoint "nope"`},
		{"method not allowed", post(func(a map[string]any) { a["method"] = "DELETE" }), `method "DELETE" is not allowed`},
		{"lower-case method", post(func(a map[string]any) { a["method"] = "post" }), "not allowed"},
		{"path outside the prefixes", post(func(a map[string]any) { a["path"] = "/admin/users" }), "not under the endpoint's allowed prefixes"},
		{"prefix without a segment boundary", post(func(a map[string]any) { a["path"] = "/v1x/payments" }), "not under"},
		{"dot-dot path", post(func(a map[string]any) { a["path"] = "/v1/../admin" }), "clean absolute path"},
		{"query in the path", post(func(a map[string]any) { a["path"] = "/v1/payments?admin=1" }), "clean absolute path"},
		{"oversize body", post(func(a map[string]any) { a["json"] = map[string]any{"pad": strings.Repeat("x", maxTestBody)} }), fmt.Sprintf("limit is %d", maxTestBody)},
		{"CR/LF in a header value", post(func(a map[string]any) { a["headers"] = map[string]any{"X-Note": "a\r\nX-Injected: 1"} }), "one line"},
		{"agent-supplied Authorization", post(func(a map[string]any) { a["headers"] = map[string]any{"Authorization": "Bearer mine"} }), "set by the bastion"},
		{"agent-supplied authorization, lower case", post(func(a map[string]any) { a["headers"] = map[string]any{"authorization": "Bearer mine"} }), "set by the bastion"},
		{"agent-supplied Idempotency-Key", post(func(a map[string]any) { a["headers"] = map[string]any{"Idempotency-Key": `"mine"`} }), "set by the bastion"},
		{"json and text both", post(func(a map[string]any) { a["text"] = text }), "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := f.mustRefuse(t, ctx, cs, tc.args)
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("refusal %q does not say %q", msg, tc.want)
			}
		})
	}
	if n := len(f.target.Requests()); n != 0 {
		t.Fatalf("target saw %d requests; want none", n)
	}
	if xs := listOf(t, ctx, cs); len(xs) != 0 {
		t.Fatalf("executions_list = %d executions; want none", len(xs))
	}
	if n := metric(t, f.bastion, "postern_executions_accepted_total"); n != 0 {
		t.Fatalf("bastion accepted %v executions; want none", n)
	}
	f.assertSecretNowhere(t)
}

// TestHTTPDuplicateWhileInFlight: the same http_request twice in one run while the first is
// held by the target is one execution and one request.
func TestHTTPDuplicateWhileInFlight(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	const path = "/v1/payments/dup"
	f.target.Arm(path, testutil.FaultHold)
	args := payment(epIrreversible, path, 3)

	outcomes := make(chan callOutcome, 2)
	cs := f.bastion.Connect(t, "agent", runHeader("run-dup"))
	go func() {
		x, err := f.call(ctx, cs, "http_request", args)
		outcomes <- callOutcome{x, err}
	}()
	f.target.WaitHeld(t, path)
	go func() {
		x, err := f.call(ctx, f.bastion.Connect(t, "agent", runHeader("run-dup")), "http_request", args)
		outcomes <- callOutcome{x, err}
	}()
	testutil.WaitFor(t, "the duplicate to join", func() bool {
		return metric(t, f.bastion, `postern_dedup_hits_total{by="fingerprint"}`) >= 1
	})
	f.target.Release(path)
	ids := map[string]bool{}
	replayed := 0
	for range 2 {
		got := <-outcomes
		if got.err != nil {
			t.Fatal(got.err)
		}
		if got.x.State != "completed" || got.x.HTTPStatus != http.StatusOK {
			t.Fatalf("call = %+v; want completed", got.x)
		}
		ids[got.x.ExecutionID] = true
		if got.x.Replayed {
			replayed++
		}
	}
	if len(ids) != 1 || replayed != 1 {
		t.Fatalf("executions %v, %d replayed; want one execution, the duplicate replayed", ids, replayed)
	}
	if n := len(f.target.RequestsTo(path)); n != 1 || f.target.TotalEffects() != 1 {
		t.Fatalf("target saw %d requests, %d effects; want 1", n, f.target.TotalEffects())
	}
	f.assertSecretNowhere(t)
}

// processGone reports whether pid has exited (gone, or a zombie nobody reaped yet).
func processGone(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err != nil || st.State == 'Z' || st.State == 'X'
}

// TestHTTPBastionKilledMidRequest: the bastion is SIGKILLed while the target holds a
// request (which took effect). The plugin dies with it; on restart the journal shows the
// request dispatched, and the class decides: idempotent_write is sent again with the same
// Idempotency-Key (the target replays it), irreversible stays unknown for review. The agent's
// retry gets the same execution either way.
func TestHTTPBastionKilledMidRequest(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, wantState string
		wantSent                  int
	}{
		{name: "idempotent_write", endpoint: epIdempotent, wantState: "completed", wantSent: 2},
		{name: "irreversible", endpoint: epIrreversible, wantState: "unknown", wantSent: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newHTTPFleet(t, httpFleetOptions{})
			ctx := testContext(t)
			const path = "/v1/payments/crash"
			f.target.Arm(path, testutil.FaultHold)
			args := payment(tc.endpoint, path, 11)

			lost := make(chan error, 1)
			go func() {
				_, err := f.call(ctx, f.bastion.Connect(t, "agent", runHeader("run-crash")), "http_request", args)
				lost <- err
			}()
			f.target.WaitHeld(t, path)
			plugin := pluginPID(t, f.bastion.PID())
			if plugin == 0 {
				t.Fatal("no postern-plugin-http child of the bastion")
			}
			f.bastion.Kill(t)
			if err := <-lost; err == nil {
				t.Fatal("the call returned a result from a killed bastion")
			}
			testutil.WaitFor(t, "the plugin to die with the bastion", func() bool { return processGone(plugin) })
			f.target.Release(path) // the effect is stored under its key

			f.bastion.Start(t)
			x := f.mustCall(t, ctx, f.bastion.Connect(t, "agent", runHeader("run-crash")), args)
			if x.State != tc.wantState || !x.Replayed {
				t.Fatalf("retry after restart = %+v; want the execution, replayed, %s", x, tc.wantState)
			}
			reqs := f.target.RequestsTo(path)
			if len(reqs) != tc.wantSent || f.target.Effects(x.ExecutionID) != 1 {
				t.Fatalf("target saw %d requests, %d effects for %s; want %d, 1", len(reqs), f.target.Effects(x.ExecutionID), x.ExecutionID, tc.wantSent)
			}
			f.assertIdempotencyKeys(t, reqs, x.ExecutionID)
			if tc.wantState == "completed" && !x.IdempotentReplayed {
				t.Errorf("re-sent request = %+v; want the target's replay noted (idempotent_replayed)", x)
			}
			if rec := journaled(t, f.bastion, x.ExecutionID); tc.wantState == "unknown" && !rec.ReviewRequired {
				t.Errorf("record %+v; want review required", rec)
			}
			f.assertSecretNowhere(t)
		})
	}
}

// TestHTTPIdempotencyKeyArgument: a client-made idempotency_key returns the same execution
// for the same request, even in another run; reused for another request it is refused and
// nothing is sent.
func TestHTTPIdempotencyKeyArgument(t *testing.T) {
	f := newHTTPFleet(t, httpFleetOptions{})
	ctx := testContext(t)
	args := payment(epIrreversible, "/v1/payments/keyed", 50)
	args["idempotency_key"] = "order-1234"

	first := f.mustCall(t, ctx, f.bastion.Connect(t, "agent", runHeader("run-a")), args)
	again := f.mustCall(t, ctx, f.bastion.Connect(t, "agent", runHeader("run-b")), args)
	if first.State != "completed" || again.ExecutionID != first.ExecutionID || !again.Replayed {
		t.Fatalf("first %+v, again %+v; want one execution, the second replayed", first, again)
	}
	other := payment(epIrreversible, "/v1/payments/keyed", 51)
	other["idempotency_key"] = "order-1234"
	msg := f.mustRefuse(t, ctx, f.bastion.Connect(t, "agent", runHeader("run-c")), other)
	if !strings.Contains(msg, "idempotency_key") || !strings.Contains(msg, first.ExecutionID) {
		t.Fatalf("reused key refused with %q; want it to name the key and %s", msg, first.ExecutionID)
	}
	if n := len(f.target.RequestsTo("/v1/payments/keyed")); n != 1 {
		t.Fatalf("target saw %d requests; want 1", n)
	}
	// The client's key never replaces the execution id on the wire.
	f.assertIdempotencyKeys(t, f.target.RequestsTo("/v1/payments/keyed"), first.ExecutionID)
	f.assertSecretNowhere(t)
}

// TestHTTPCredentialKinds: each kind of credential reaches the target in its own header, and
// an agent cannot set a named credential header itself.
func TestHTTPCredentialKinds(t *testing.T) {
	target := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{})
	dir := t.TempDir()
	secret := "kind-s3cr3t-" + newID(t)[3:]
	if err := os.WriteFile(filepath.Join(dir, "s"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := func(name, cred string) string {
		return fmt.Sprintf("[[endpoints]]\nname = %q\nbase_url = %q\nmethods = [\"POST\"]\npath_prefixes = [\"/v1\"]\nclass = \"idempotent_write\"\ncredential = %q\n", name, target.URL, cred)
	}
	f := newHTTPFleet(t, httpFleetOptions{endpoints: []string{
		fmt.Sprintf("[[credentials]]\nname = \"basic\"\nkind = \"basic\"\nusername = \"bot\"\nfile = %q", filepath.Join(dir, "s")),
		fmt.Sprintf("[[credentials]]\nname = \"key\"\nkind = \"header\"\nheader = \"X-Api-Key\"\nfile = %q", filepath.Join(dir, "s")),
		endpoint("with-basic", "basic"), endpoint("with-key", "key"),
	}})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-kinds"))
	for _, tc := range []struct {
		endpoint, header, want string
	}{
		{"with-basic", "Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte("bot:"+secret))},
		{"with-key", "X-Api-Key", secret},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			path := "/v1/" + tc.endpoint
			x := f.mustCall(t, ctx, cs, payment(tc.endpoint, path, 1))
			reqs := target.RequestsTo(path)
			if x.State != "completed" || len(reqs) != 1 {
				t.Fatalf("http_request = %+v, target saw %d requests; want completed, 1", x, len(reqs))
			}
			if got := reqs[0].Header.Get(tc.header); got != tc.want {
				t.Fatalf("%s = %q; want the configured credential", tc.header, redact(got, secret))
			}
		})
	}
	args := payment("with-key", "/v1/with-key", 2)
	args["headers"] = map[string]any{"x-api-key": "mine"}
	if msg := f.mustRefuse(t, ctx, cs, args); !strings.Contains(msg, "set by the bastion") {
		t.Fatalf("agent-set credential header refused with %q", msg)
	}
	f.secret = secret
	f.assertSecretNowhere(t)
}

// blackHole accepts connections, reads a request and closes without answering: every request
// is written and none answered. It returns its address and a count of connections.
func blackHole(t *testing.T) (string, func() int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns++
			mu.Unlock()
			_, _ = c.Read(make([]byte, 64<<10))
			c.Close()
		}
	})
	return ln.Addr().String(), func() int64 { mu.Lock(); defer mu.Unlock(); return conns }
}

// TestHTTPUnknownIsLeftAloneInBackground: once a call has settled an execution as unknown
// (its class decided), nobody asking means nothing happens to it: no request is sent again
// and no evidence is added, however many reconcile intervals pass (the fleet's is 1s).
func TestHTTPUnknownIsLeftAloneInBackground(t *testing.T) {
	hole, sent := blackHole(t)
	f := newHTTPFleet(t, httpFleetOptions{endpoints: []string{endpointTable("hole", "http://"+hole, config.ClassIdempotentWrite)}})
	ctx := testContext(t)
	cs := f.bastion.Connect(t, "agent", runHeader("run-background"))

	f.target.Arm("/v1/irrev", testutil.FaultDropAfterRead)
	irreversible := f.mustCall(t, ctx, cs, payment(epIrreversible, "/v1/irrev", 1))
	resent := f.mustCall(t, ctx, cs, payment("hole", "/v1/hole", 1))
	if irreversible.State != "unknown" || resent.State != "unknown" {
		t.Fatalf("calls = %+v, %+v; want both unknown", irreversible, resent)
	}
	before := operatorDetail(t, f.bastion, irreversible.ExecutionID)
	sentBefore := sent()
	// Absence can only be observed over time: several reconcile intervals.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		after := operatorDetail(t, f.bastion, irreversible.ExecutionID)
		if len(after.Events) != len(before.Events) || len(after.Record.Evidence) != len(before.Record.Evidence) {
			t.Fatalf("irreversible unknown execution changed in the background: %d → %d events, evidence %q", len(before.Events), len(after.Events), after.Record.Evidence)
		}
		if n := sent(); n != sentBefore {
			t.Fatalf("idempotent_write unknown execution re-sent in the background: %d → %d requests", sentBefore, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
