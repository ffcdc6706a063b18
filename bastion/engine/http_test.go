package engine_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// httpSecret is the bearer credential of the test endpoints.
const httpSecret = "s3cr3t-engine-test"

// newHTTPFleet is a fleet with the real HTTP plugin (built, pinned by its SHA-256) and a
// counting target behind one endpoint per class: pay (idempotent_write), once
// (irreversible), cond (conditional_write, with a status check) and read (read_only), all
// under /v1 with the bearer credential api. adjust may change the config further.
func newHTTPFleet(t testing.TB, adjust ...func(*config.Config)) (*testFleet, *testutil.HTTPTarget) {
	t.Helper()
	target := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{})
	bin, sum := harness.HTTPPlugin(t)
	secretFile := filepath.Join(t.TempDir(), "api.secret")
	if err := os.WriteFile(secretFile, []byte(httpSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, func(c *config.Config) {
		c.HTTPPlugin = config.Plugin{Path: bin, SHA256: sum}
		c.Credentials = []config.Credential{{Name: "api", Kind: "bearer", File: secretFile}}
		for _, ep := range []struct{ name, class string }{
			{"pay", config.ClassIdempotentWrite},
			{"once", config.ClassIrreversible},
			{"cond", config.ClassConditionalWrite},
			{"read", config.ClassReadOnly},
		} {
			e := config.Endpoint{Name: ep.name, BaseURL: target.URL, Methods: []string{"GET", "POST"}, PathPrefixes: []string{"/v1"},
				Class: ep.class, Credential: "api", Timeout: 30 * time.Second}
			if ep.class == config.ClassConditionalWrite {
				e.StatusCheck = "/status/{execution_id}"
			}
			c.Endpoints = append(c.Endpoints, e)
		}
		for _, fn := range adjust {
			fn(c)
		}
	})
	return f, target
}

// post is an http_request POST of a JSON body to path on endpoint.
func post(endpoint, path string) api.HTTPArgs {
	return api.HTTPArgs{Endpoint: endpoint, Method: "POST", Path: path, JSON: map[string]any{"amount": 1}, CallOptions: api.CallOptions{WaitS: waitS(60)}}
}

// request makes an http_request and fails the test if the engine refuses it.
func (f *testFleet) request(t testing.TB, c transport.Caller, a api.HTTPArgs) *api.Execution {
	t.Helper()
	x, err := f.engine().HTTPRequest(context.Background(), c, a, nil)
	if err != nil {
		t.Fatalf("http_request %s %s: %v", a.Method, a.Path, err)
	}
	return x
}

// TestHTTPRequest: a request is sent once with the credential and the execution id as its
// Idempotency-Key, its response stored; a retry replays it; invalid requests are refused
// with nothing journaled.
func TestHTTPRequest(t *testing.T) {
	f, target := newHTTPFleet(t)
	if !f.engine().HTTPEnabled() {
		t.Fatal("HTTPEnabled = false with a plugin configured")
	}
	x := f.request(t, alice, post("pay", "/v1/pay"))
	if x.State != string(markers.Completed) || x.HTTPStatus != 200 || x.IsError || !strings.Contains(x.ResponseBody, `"effect":1`) {
		t.Fatalf("request = %s, HTTP %d, body %q (evidence %q); want completed 200", x.State, x.HTTPStatus, x.ResponseBody, x.Evidence)
	}
	got := target.RequestsTo("/v1/pay")
	if len(got) != 1 || got[0].Key != x.ExecutionID || got[0].Header.Get("Authorization") != "Bearer "+httpSecret || string(got[0].Body) != `{"amount":1}` {
		t.Fatalf("the target received %+v; want one request keyed %s with the credential", got, x.ExecutionID)
	}
	again := f.request(t, alice, post("pay", "/v1/pay"))
	if again.ExecutionID != x.ExecutionID || !again.Replayed || again.HTTPStatus != 200 {
		t.Errorf("retry = %s (replayed %v, HTTP %d); want %s replayed", again.ExecutionID, again.Replayed, again.HTTPStatus, x.ExecutionID)
	}
	if n := target.TotalEffects(); n != 1 {
		t.Errorf("the target performed %d effects; want 1", n)
	}
	if rec := f.record(t, x.ExecutionID); strings.Contains(string(rec.Request), httpSecret) {
		t.Errorf("the journaled request holds the secret")
	}
	c, err := f.engine().Cancel(context.Background(), alice, x.ExecutionID)
	if err != nil || !strings.Contains(c.Next, "nothing to cancel") {
		t.Errorf("cancel of a completed request = %+v, %v; want nothing to cancel", c, err)
	}

	text := "x"
	tests := []struct {
		name     string
		args     api.HTTPArgs
		wantCode string
	}{
		{name: "unknown endpoint", args: api.HTTPArgs{Endpoint: "nope", Method: "GET", Path: "/v1"}, wantCode: api.CodeUnknownEndpoint},
		{name: "method not allowed", args: api.HTTPArgs{Endpoint: "pay", Method: "DELETE", Path: "/v1/x"}, wantCode: api.CodeInvalidArgument},
		{name: "path outside the prefixes", args: api.HTTPArgs{Endpoint: "pay", Method: "GET", Path: "/admin"}, wantCode: api.CodeInvalidArgument},
		{name: "unclean path", args: api.HTTPArgs{Endpoint: "pay", Method: "GET", Path: "/v1/../admin"}, wantCode: api.CodeInvalidArgument},
		{name: "credential header", args: api.HTTPArgs{Endpoint: "pay", Method: "GET", Path: "/v1/x", Headers: map[string]string{"Authorization": "Bearer mine"}}, wantCode: api.CodeInvalidArgument},
		{name: "header with a newline", args: api.HTTPArgs{Endpoint: "pay", Method: "GET", Path: "/v1/x", Headers: map[string]string{"X-A": "a\nb"}}, wantCode: api.CodeInvalidArgument},
		{name: "two bodies", args: api.HTTPArgs{Endpoint: "pay", Method: "POST", Path: "/v1/x", JSON: 1, Text: &text}, wantCode: api.CodeInvalidArgument},
		{name: "bad run id", args: api.HTTPArgs{Endpoint: "pay", Method: "GET", Path: "/v1/x", CallOptions: api.CallOptions{RunID: "a\nb"}}, wantCode: api.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.engine().HTTPRequest(context.Background(), alice, tt.args, nil)
			wantCode(t, err, tt.wantCode)
		})
	}
	if n := f.journaled(t); n != 1 {
		t.Errorf("%d executions journaled; want 1", n)
	}
}

// TestHTTPUnknownOutcome: a request whose response was lost is handled by its endpoint's
// class: idempotent_write and read_only are sent again under the same key (the target
// replays), conditional_write asks the status check, irreversible is never sent again and
// needs a review.
func TestHTTPUnknownOutcome(t *testing.T) {
	f, target := newHTTPFleet(t)
	tests := []struct {
		name, endpoint, path string
		fault                testutil.HTTPFault
		wantState            markers.State
		wantReview           bool
		wantSent             int // requests the target received on path
		wantEffects          int
	}{
		{name: "idempotent_write", endpoint: "pay", path: "/v1/idem", fault: testutil.FaultDropAfterRead, wantState: markers.Completed, wantSent: 2, wantEffects: 1},
		{name: "read_only", endpoint: "read", path: "/v1/read", fault: testutil.FaultDropBeforeEffect, wantState: markers.Completed, wantSent: 2, wantEffects: 1},
		{name: "conditional_write", endpoint: "cond", path: "/v1/cond", fault: testutil.FaultDropAfterRead, wantState: markers.Completed, wantSent: 1, wantEffects: 1},
		{name: "irreversible", endpoint: "once", path: "/v1/once", fault: testutil.FaultDropAfterRead, wantState: markers.Unknown, wantReview: true, wantSent: 1, wantEffects: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target.Arm(tt.path, tt.fault)
			before := target.TotalEffects()
			x := f.request(t, alice, post(tt.endpoint, tt.path))
			rec := f.waitState(t, alice, x.ExecutionID, tt.wantState)
			if rec.ReviewRequired != tt.wantReview {
				t.Errorf("review required = %v; want %v", rec.ReviewRequired, tt.wantReview)
			}
			if n := len(target.RequestsTo(tt.path)); n != tt.wantSent {
				t.Errorf("the target received %d requests; want %d", n, tt.wantSent)
			}
			if n := target.TotalEffects() - before; n != tt.wantEffects {
				t.Errorf("the target performed %d effects; want %d", n, tt.wantEffects)
			}
		})
	}
}

// TestHTTPInFlight: a request the target holds is in progress; it cannot be recalled, and
// it completes once the target answers. Its investigation and approval name the endpoint.
func TestHTTPInFlight(t *testing.T) {
	f, target := newHTTPFleet(t)
	ctx := context.Background()
	target.Arm("/v1/slow", testutil.FaultHold)
	a := post("pay", "/v1/slow")
	a.WaitS = waitS(0)
	x := f.request(t, alice, a)
	target.WaitHeld(t, "/v1/slow")
	f.waitState(t, alice, x.ExecutionID, markers.Dispatched)
	c, err := f.engine().Cancel(ctx, alice, x.ExecutionID)
	if err != nil || !strings.Contains(c.Next, "cannot be recalled") {
		t.Errorf("cancel of a sent request = %+v, %v; want it not recalled", c, err)
	}
	target.Release("/v1/slow")
	end, err := f.engine().AwaitEnd(ctx, alice, x.ExecutionID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != string(markers.Completed) || end.HTTPStatus != 200 {
		t.Errorf("after the release = %s, HTTP %d; want completed 200", end.State, end.HTTPStatus)
	}
	inv, err := f.engine().Investigate(ctx, x.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(inv.Answers[answerOutcome], "Yes: the bastion observed HTTP 200") || !strings.Contains(inv.Outcome.MarkerNote, "no host marker") {
		t.Errorf("outcome answer %q (%q); want the HTTP status, no marker", inv.Answers[answerOutcome], inv.Outcome.MarkerNote)
	}
	dec, err := f.engine().PolicyCheck(policy.Request{Actor: "alice", Tool: policy.ToolHTTPRequest, Endpoint: "once", Method: "POST", Path: "/v1/x"})
	if err != nil {
		t.Fatal(err)
	}
	if dec.Class != config.ClassIrreversible {
		t.Errorf("policy check on once = class %s; want irreversible, the endpoint's", dec.Class)
	}
}

// TestHTTPNotSent: a request that cannot be sent — its credential unreadable, or its target
// refusing the connection — fails with nothing sent.
func TestHTTPNotSent(t *testing.T) {
	down, _ := testutil.ClosedAddr(t)
	f, target := newHTTPFleet(t, func(c *config.Config) {
		c.Credentials = append(c.Credentials, config.Credential{Name: "lost", Kind: "bearer", File: filepath.Join(t.TempDir(), "missing")})
		c.Endpoints = append(c.Endpoints,
			config.Endpoint{Name: "nocred", BaseURL: c.Endpoints[0].BaseURL, Methods: []string{"POST"}, PathPrefixes: []string{"/v1"}, Credential: "lost"},
			config.Endpoint{Name: "down", BaseURL: "http://" + down, Methods: []string{"POST"}, PathPrefixes: []string{"/v1"}})
	})
	tests := []struct{ name, endpoint, cause string }{
		{name: "credential unreadable", endpoint: "nocred", cause: "credential lost: read its file"},
		{name: "connection refused", endpoint: "down", cause: "no request byte was written"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := f.request(t, alice, post(tt.endpoint, "/v1/x"))
			if x.State != string(markers.Failed) || !strings.Contains(x.Cause, tt.cause) {
				t.Errorf("got = %s (cause %q); want failed: %s", x.State, x.Cause, tt.cause)
			}
		})
	}
	if n := len(target.Requests()); n != 0 {
		t.Errorf("the target received %d requests; want 0", n)
	}
}

// TestHTTPRecover: a request in flight when the engine closed is unknown after Recover, and
// its class decides: idempotent_write is sent again under the same key (the target replays
// its answer), irreversible is never sent again and waits for a review.
func TestHTTPRecover(t *testing.T) {
	f, target := newHTTPFleet(t)
	tests := []struct {
		endpoint, path string
		wantState      markers.State
		wantReview     bool
		wantSent       int
	}{
		{endpoint: "pay", path: "/v1/held-pay", wantState: markers.Completed, wantSent: 2},
		{endpoint: "once", path: "/v1/held-once", wantState: markers.Unknown, wantReview: true, wantSent: 1},
	}
	ids := map[string]string{}
	for _, tt := range tests {
		target.Arm(tt.path, testutil.FaultHold)
		a := post(tt.endpoint, tt.path)
		a.WaitS = waitS(0)
		ids[tt.path] = f.request(t, alice, a).ExecutionID
		target.WaitHeld(t, tt.path)
		f.waitState(t, alice, ids[tt.path], markers.Dispatched)
	}
	f.closeEngine(t, f.engine())
	for _, tt := range tests {
		target.Release(tt.path)
		waitAnswerStored(t, target, tt.path, ids[tt.path])
	}
	f.open(t)
	for _, tt := range tests {
		t.Run(tt.endpoint, func(t *testing.T) {
			st := f.waitState(t, alice, ids[tt.path], tt.wantState)
			if st.ReviewRequired != tt.wantReview {
				t.Errorf("review required = %v; want %v", st.ReviewRequired, tt.wantReview)
			}
			if n := sentByEngine(target, tt.path); n != tt.wantSent {
				t.Errorf("the engine sent %d requests; want %d", n, tt.wantSent)
			}
			if n := target.Effects(ids[tt.path]); n != 1 {
				t.Errorf("the target performed %d effects; want 1", n)
			}
		})
	}
}

// waitAnswerStored waits until the target, released, stored its answer to the request keyed
// id: until then a request with that key is refused as in progress (409). It asks with the
// same payload, without the credential (sentByEngine leaves these out); the target replays
// it without an effect.
func waitAnswerStored(t testing.TB, target *testutil.HTTPTarget, path, id string) {
	t.Helper()
	testutil.WaitFor(t, "the target to store its answer on "+path, func() bool {
		req, err := http.NewRequest("POST", target.URL+path, strings.NewReader(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", `"`+id+`"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && resp.Header.Get("Idempotent-Replayed") == "true"
	})
}

// sentByEngine counts the requests on path that carry the engine's credential.
func sentByEngine(target *testutil.HTTPTarget, path string) int {
	n := 0
	for _, r := range target.RequestsTo(path) {
		if r.Header.Get("Authorization") == "Bearer "+httpSecret {
			n++
		}
	}
	return n
}
