package operatorapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/markers"
)

// fakeEngine is an Engine that records what each method was asked and answers what the
// test set: err, when set, is every method's error.
type fakeEngine struct {
	mu sync.Mutex
	// What the methods were asked.
	query       api.ExecutionQuery
	id          string
	outputArgs  api.OutputArgs
	actor       string
	scope       string
	limit       int
	policyReq   policy.Request
	host        string
	markerQuery api.MarkerQuery
	deadline    time.Duration // left on the context of a markers request
	operator    string
	operatorUID int
	note        string
	reason      string
	outcome     string
	dryRun      bool

	fleetActor string
	fleetArgs  api.FleetArgs

	err       error
	pending   []*api.ApprovalRequest
	auditJSON string
	key       string
}

var _ Engine = (*fakeEngine)(nil)

func (f *fakeEngine) Executions(q api.ExecutionQuery) (*api.ExecutionPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.query = q
	return &api.ExecutionPage{Executions: []*markers.Record{{ID: "ex_1"}}, Next: "c2"}, f.err
}

func (f *fakeEngine) Execution(id string) (*api.ExecutionDetail, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.id = id
	if f.err != nil {
		return nil, f.err
	}
	return &api.ExecutionDetail{}, nil
}

func (f *fakeEngine) ReadOutput(_ context.Context, id string, a api.OutputArgs) (*api.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.id, f.outputArgs = id, a
	if f.err != nil {
		return nil, f.err
	}
	return &api.Execution{ExecutionID: id}, nil
}

func (f *fakeEngine) Investigate(_ context.Context, id string) (*api.Investigation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.id = id
	if f.err != nil {
		return nil, f.err
	}
	return &api.Investigation{}, nil
}

func (f *fakeEngine) Runs(actor, scope string, limit int) (*api.RunPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actor, f.scope, f.limit = actor, scope, limit
	return &api.RunPage{}, f.err
}

func (f *fakeEngine) PolicyCheck(req policy.Request) (policy.Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policyReq = req
	return policy.Decision{}, f.err
}

func (f *fakeEngine) Doctor(context.Context) (*api.DoctorReport, error) {
	return &api.DoctorReport{}, f.err
}

func (f *fakeEngine) Overview() (*api.Overview, error) {
	return &api.Overview{Daemon: api.DaemonRunning}, f.err
}

func (f *fakeEngine) Hosts(api.HostsArgs) (*api.HostsResult, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &api.HostsResult{}, nil
}

func (f *fakeEngine) HostMarkers(ctx context.Context, host string, q api.MarkerQuery) (*api.MarkerPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.host, f.markerQuery = host, q
	if d, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(d)
	}
	return &api.MarkerPage{Host: host}, f.err
}

func (f *fakeEngine) HostMarker(ctx context.Context, host, id string) (*hostproto.Marker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.host, f.id = host, id
	if d, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(d)
	}
	if f.err != nil {
		return nil, f.err
	}
	return &hostproto.Marker{ID: id}, nil
}

func (f *fakeEngine) ExportAudit(w io.Writer) error {
	io.WriteString(w, f.auditJSON)
	return f.err
}

func (f *fakeEngine) AuditKey() (string, error) { return f.key, f.err }

func (f *fakeEngine) Backup(_ context.Context, w io.Writer) error {
	if f.err != nil {
		return f.err
	}
	_, err := io.WriteString(w, "tar")
	return err
}

func (f *fakeEngine) PendingApprovals(limit int) (*api.ApprovalPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limit = limit
	return &api.ApprovalPage{Approvals: f.pending}, f.err
}

func (f *fakeEngine) decided(op api.Operator, id string) (*markers.Record, error) {
	f.operator, f.operatorUID, f.id = op.Name, op.UID, id
	if f.err != nil {
		return nil, f.err
	}
	return &markers.Record{ID: id, State: markers.Running}, nil
}

func (f *fakeEngine) Approve(_ context.Context, operator api.Operator, id, note string) (*markers.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note = note
	return f.decided(operator, id)
}

func (f *fakeEngine) Deny(_ context.Context, operator api.Operator, id, reason string) (*markers.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reason = reason
	return f.decided(operator, id)
}

func (f *fakeEngine) Reload(op api.Operator) (*api.ConfigChange, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.operator = op.Name
	if f.err != nil {
		return nil, f.err
	}
	return &api.ConfigChange{By: op.Name, Digest: "d1", Changes: []string{"actors added: ci"}}, nil
}

func (f *fakeEngine) Tokens() (*api.TokenList, error) {
	return &api.TokenList{Tokens: []api.TokenView{{ID: "tok_aaaaaaaaaaaaaaaa", Actor: "ci", Source: "issued", State: "active"}}}, nil
}

func (f *fakeEngine) IssueToken(op api.Operator, req api.TokenRequest) (*api.IssuedToken, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.operator = op.Name
	if f.err != nil {
		return nil, f.err
	}
	return &api.IssuedToken{Token: "pst_x", View: api.TokenView{ID: "tok_aaaaaaaaaaaaaaaa", Actor: req.Actor, CreatedBy: op.Name}}, nil
}

func (f *fakeEngine) RevokeToken(op api.Operator, id string) (*api.TokenRevocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.operator = op.Name
	if f.err != nil {
		return nil, f.err
	}
	return &api.TokenRevocation{View: api.TokenView{ID: id, State: "revoked", RevokedBy: op.Name}, Changed: true}, nil
}

func (f *fakeEngine) Review(_ context.Context, operator api.Operator, id, outcome, note string) (*markers.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outcome, f.note = outcome, note
	return f.decided(operator, id)
}

func (f *fakeEngine) OperatorFleetRun(_ context.Context, op api.Operator, actor string, a api.FleetArgs) (*api.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.operator, f.fleetActor, f.fleetArgs = op.Name, actor, a
	if f.err != nil {
		return nil, f.err
	}
	return &api.Execution{ExecutionID: "fr_1", State: "running"}, nil
}

func (f *fakeEngine) CancelFleetRun(_ context.Context, op api.Operator, id string) (*api.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.operator, f.id = op.Name, id
	if f.err != nil {
		return nil, f.err
	}
	return &api.Execution{ExecutionID: id, State: "cancelled"}, nil
}

func (f *fakeEngine) RetentionPass(_ context.Context, dryRun bool) (*api.RetentionPass, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dryRun = dryRun
	return &api.RetentionPass{GCResult: markers.GCResult{DryRun: dryRun, Records: 3}}, f.err
}

// serve starts the operator API of e on a TCP test server.
func serve(t testing.TB, e Engine) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(Handler(e, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	return srv
}

// call sends a request to the test server and returns the status and the body.
func call(t testing.TB, srv *httptest.Server, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	return roundTrip(t, srv.Client(), srv.URL, method, path, body)
}

func roundTrip(t testing.TB, c *http.Client, base, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, b
}

// operatorError decodes an error body.
func operatorError(t testing.TB, b []byte) api.OperatorError {
	t.Helper()
	var oe api.OperatorError
	if err := json.Unmarshal(b, &oe); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return oe
}

func TestExecutionsQuery(t *testing.T) {
	since := "2026-11-30T10:00:00Z"
	sinceT, _ := time.Parse(time.RFC3339, since)
	tests := []struct {
		name       string
		query      string
		want       api.ExecutionQuery
		wantStatus int
		wantErr    string // in the error message of a 400
	}{
		{name: "no filters: limit 100", query: "", want: api.ExecutionQuery{Limit: 100}, wantStatus: 200},
		{name: "every filter", query: "?state=running&actor=token:a&host=web1&since=" + since + "&limit=10000&cursor=c1",
			want: api.ExecutionQuery{State: markers.Running, Actor: "token:a", Host: "web1", Since: sinceT, Limit: 10000, Cursor: "c1"}, wantStatus: 200},
		{name: "unknown state", query: "?state=exploded", wantStatus: 400, wantErr: `unknown state "exploded"`},
		{name: "since not RFC 3339", query: "?since=yesterday", wantStatus: 400, wantErr: "since:"},
		{name: "limit 0", query: "?limit=0", wantStatus: 400, wantErr: "limit must be in 1..10000"},
		{name: "limit above the bound", query: "?limit=10001", wantStatus: 400, wantErr: "limit must be in 1..10000"},
		{name: "limit not a number", query: "?limit=ten", wantStatus: 400, wantErr: "limit must be in 1..10000"},
		{name: "review required", query: "?review_required=true", want: api.ExecutionQuery{ReviewRequired: true, Limit: 100}, wantStatus: 200},
		{name: "review required with state unknown", query: "?review_required=1&state=unknown",
			want: api.ExecutionQuery{ReviewRequired: true, State: markers.Unknown, Limit: 100}, wantStatus: 200},
		{name: "review not required", query: "?review_required=false&state=running",
			want: api.ExecutionQuery{State: markers.Running, Limit: 100}, wantStatus: 200},
		{name: "review_required invalid", query: "?review_required=maybe", wantStatus: 400, wantErr: "review_required must be true or false"},
		{name: "review_required with another state", query: "?review_required=true&state=completed", wantStatus: 400,
			wantErr: "review_required selects unknown executions, not completed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{}
			status, _, body := call(t, serve(t, e), "GET", "/v1/executions"+tt.query, "")
			if status != tt.wantStatus {
				t.Fatalf("status = %d (%s); want %d", status, body, tt.wantStatus)
			}
			if tt.wantStatus != 200 {
				oe := operatorError(t, body)
				if oe.Code != api.CodeInvalidArgument || !strings.Contains(oe.Error, tt.wantErr) {
					t.Fatalf("error = %+v; want %s containing %q", oe, api.CodeInvalidArgument, tt.wantErr)
				}
				if e.query != (api.ExecutionQuery{}) {
					t.Fatalf("the engine was asked %+v after a refused query", e.query)
				}
				return
			}
			if !e.query.Since.Equal(tt.want.Since) {
				t.Fatalf("since = %v; want %v", e.query.Since, tt.want.Since)
			}
			e.query.Since, tt.want.Since = time.Time{}, time.Time{}
			if e.query != tt.want {
				t.Fatalf("query = %+v; want %+v", e.query, tt.want)
			}
			var page api.ExecutionPage
			if err := json.Unmarshal(body, &page); err != nil || len(page.Executions) != 1 || page.Next != "c2" {
				t.Fatalf("page = %s (%v); want the engine's page", body, err)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		wantLimit  int
		wantStatus int
	}{
		{name: "runs default", path: "/v1/runs?actor=a&scope=run:1", wantLimit: 100, wantStatus: 200},
		{name: "runs at the bound", path: "/v1/runs?limit=1000", wantLimit: 1000, wantStatus: 200},
		{name: "runs above the bound", path: "/v1/runs?limit=1001", wantStatus: 400},
		{name: "runs negative", path: "/v1/runs?limit=-1", wantStatus: 400},
		{name: "markers default: the host's", path: "/v1/markers/web1", wantLimit: 0, wantStatus: 200},
		{name: "markers at the bound", path: "/v1/markers/web1?limit=1000", wantLimit: 1000, wantStatus: 200},
		{name: "markers above the bound", path: "/v1/markers/web1?limit=1001", wantStatus: 400},
		{name: "markers zero", path: "/v1/markers/web1?limit=0", wantStatus: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{limit: -99, markerQuery: api.MarkerQuery{Limit: -99}}
			status, _, body := call(t, serve(t, e), "GET", tt.path, "")
			if status != tt.wantStatus {
				t.Fatalf("status = %d (%s); want %d", status, body, tt.wantStatus)
			}
			if status != 200 {
				if oe := operatorError(t, body); oe.Code != api.CodeInvalidArgument || !strings.Contains(oe.Error, "limit must be in 1..") {
					t.Fatalf("error = %+v; want the limit's bounds", oe)
				}
				return
			}
			got := e.limit
			if strings.HasPrefix(tt.path, "/v1/markers/") {
				got = e.markerQuery.Limit
			}
			if got != tt.wantLimit {
				t.Fatalf("limit = %d; want %d", got, tt.wantLimit)
			}
		})
	}
}

func TestRunsPassesFilters(t *testing.T) {
	e := &fakeEngine{}
	if status, _, body := call(t, serve(t, e), "GET", "/v1/runs?actor=token:a&scope=run:r1&limit=5", ""); status != 200 {
		t.Fatalf("status = %d (%s); want 200", status, body)
	}
	if e.actor != "token:a" || e.scope != "run:r1" || e.limit != 5 {
		t.Fatalf("Runs(%q, %q, %d); want (token:a, run:r1, 5)", e.actor, e.scope, e.limit)
	}
}

func TestMarkers(t *testing.T) {
	e := &fakeEngine{}
	srv := serve(t, e)
	status, _, body := call(t, srv, "GET", "/v1/markers/web1?state=running&cursor=m9&limit=7", "")
	if status != 200 {
		t.Fatalf("status = %d (%s); want 200", status, body)
	}
	want := api.MarkerQuery{State: "running", Cursor: "m9", Limit: 7}
	if e.host != "web1" || e.markerQuery != want {
		t.Fatalf("HostMarkers(%q, %+v); want (web1, %+v)", e.host, e.markerQuery, want)
	}
	if e.deadline <= 0 || e.deadline > markersTimeout {
		t.Fatalf("markers request deadline in %v; want within %v", e.deadline, markersTimeout)
	}

	e.deadline = 0
	status, _, body = call(t, srv, "GET", "/v1/markers/web1/ex_5", "")
	var m hostproto.Marker
	if status != 200 || json.Unmarshal(body, &m) != nil || m.ID != "ex_5" {
		t.Fatalf("marker = %d %s; want 200 with ex_5", status, body)
	}
	if e.host != "web1" || e.id != "ex_5" {
		t.Fatalf("HostMarker(%q, %q); want (web1, ex_5)", e.host, e.id)
	}
	if e.deadline <= 0 || e.deadline > markersTimeout {
		t.Fatalf("marker request deadline in %v; want within %v", e.deadline, markersTimeout)
	}
}

func TestOutputArgs(t *testing.T) {
	five := 5
	tests := []struct {
		name       string
		query      string
		want       api.OutputArgs
		wantStatus int
		wantErr    string
	}{
		{name: "from the start", query: "", want: api.OutputArgs{ExecutionID: "ex_1"}, wantStatus: 200},
		{name: "offsets and wait", query: "?stdout_offset=10&stderr_offset=20&wait_s=5",
			want: api.OutputArgs{ExecutionID: "ex_1", StdoutOffset: 10, StderrOffset: 20, WaitS: &five}, wantStatus: 200},
		{name: "bad stdout offset", query: "?stdout_offset=x", wantStatus: 400, wantErr: "stdout_offset must be a byte offset"},
		{name: "bad stderr offset", query: "?stderr_offset=1.5", wantStatus: 400, wantErr: "stderr_offset must be a byte offset"},
		{name: "bad wait", query: "?wait_s=soon", wantStatus: 400, wantErr: "wait_s must be a number of seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{}
			status, _, body := call(t, serve(t, e), "GET", "/v1/executions/ex_1/output"+tt.query, "")
			if status != tt.wantStatus {
				t.Fatalf("status = %d (%s); want %d", status, body, tt.wantStatus)
			}
			if status != 200 {
				if oe := operatorError(t, body); oe.Code != api.CodeInvalidArgument || !strings.Contains(oe.Error, tt.wantErr) {
					t.Fatalf("error = %+v; want %q", oe, tt.wantErr)
				}
				return
			}
			got := e.outputArgs
			if e.id != "ex_1" || got.ExecutionID != tt.want.ExecutionID || got.StdoutOffset != tt.want.StdoutOffset || got.StderrOffset != tt.want.StderrOffset ||
				(got.WaitS == nil) != (tt.want.WaitS == nil) || (got.WaitS != nil && *got.WaitS != *tt.want.WaitS) {
				t.Fatalf("ReadOutput(%q, %+v); want %+v", e.id, got, tt.want)
			}
		})
	}
}

// TestUnknownExecution: the journal's not-found for an execution tells the operator how to
// find the right id, on every route that names one.
func TestUnknownExecution(t *testing.T) {
	for _, path := range []string{"/v1/executions/ex_gone", "/v1/executions/ex_gone/output", "/v1/investigate/ex_gone"} {
		t.Run(path, func(t *testing.T) {
			e := &fakeEngine{err: fmt.Errorf("read: %w", markers.ErrNotFound)}
			status, _, body := call(t, serve(t, e), "GET", path, "")
			if status != http.StatusNotFound {
				t.Fatalf("status = %d (%s); want 404", status, body)
			}
			oe := operatorError(t, body)
			if oe.Code != api.CodeNotFound || !strings.Contains(oe.Error, "no execution ex_gone") || !strings.Contains(oe.Error, "`postern executions list`") {
				t.Fatalf("error = %+v; want not_found naming ex_gone and `postern executions list`", oe)
			}
		})
	}
}

// TestOtherErrorsPassUnchanged: an error other than not-found on an execution route is not
// dressed as a missing execution.
func TestOtherErrorsPassUnchanged(t *testing.T) {
	e := &fakeEngine{err: errors.New("journal closed")}
	status, _, body := call(t, serve(t, e), "GET", "/v1/investigate/ex_1", "")
	if oe := operatorError(t, body); status != 500 || oe.Code != "internal" || oe.Error != "journal closed" {
		t.Fatalf("answer = %d %+v; want 500 internal journal closed", status, oe)
	}
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
	}{
		{"tool error not found", &api.ToolError{Code: api.CodeNotFound, Message: "gone"}, 404, api.CodeNotFound},
		{"tool error invalid", api.Invalid("bad"), 400, api.CodeInvalidArgument},
		{"tool error other code", &api.ToolError{Code: api.CodeJournalUnavailable, Message: "down"}, 400, api.CodeJournalUnavailable},
		{"wrapped tool error", fmt.Errorf("ctx: %w", &api.ToolError{Code: api.CodeNotFound}), 404, api.CodeNotFound},
		{"journal not found", fmt.Errorf("x: %w", markers.ErrNotFound), 404, api.CodeNotFound},
		{"unknown host", fmt.Errorf("%w %q", fleet.ErrUnknownHost, "web9"), 404, api.CodeUnknownHost},
		{"not awaiting approval", api.ErrNotAwaitingApproval, 409, "not_awaiting_approval"},
		{"not reviewable", fmt.Errorf("ex_1: %w", api.ErrNotReviewable), 409, "not_reviewable"},
		{"no markers", api.ErrNoMarkers, 409, "no_markers"},
		{"no hostagent", api.ErrNoHostagent, 409, "no_hostagent"},
		{"anything else", errors.New("disk on fire"), 500, "internal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, h, body := call(t, serve(t, &fakeEngine{err: tt.err}), "GET", "/v1/hosts", "")
			oe := operatorError(t, body)
			if status != tt.wantStatus || oe.Code != tt.wantCode {
				t.Fatalf("answer = %d %s; want %d %s", status, oe.Code, tt.wantStatus, tt.wantCode)
			}
			if oe.Error != tt.err.Error() {
				t.Fatalf("error = %q; want %q", oe.Error, tt.err.Error())
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type = %q; want application/json", ct)
			}
		})
	}
}

func TestReadRoutes(t *testing.T) {
	for _, path := range []string{"/v1/executions/ex_1", "/v1/investigate/ex_1", "/v1/doctor", "/v1/hosts", "/v1/status"} {
		t.Run(path, func(t *testing.T) {
			e := &fakeEngine{}
			status, h, body := call(t, serve(t, e), "GET", path, "")
			if status != 200 || !json.Valid(body) || h.Get("Content-Type") != "application/json" {
				t.Fatalf("answer = %d %q %s; want 200 JSON", status, h.Get("Content-Type"), body)
			}
		})
	}
}

// TestReload: POST /v1/reload answers the change, named after the operator who asked; a
// refusal is a 400 with its reason.
func TestReload(t *testing.T) {
	e := &fakeEngine{}
	status, _, body := call(t, serve(t, e), "POST", "/v1/reload", "")
	var change api.ConfigChange
	if status != 200 || json.Unmarshal(body, &change) != nil || change.Digest != "d1" || change.By != e.operator || e.operator == "" {
		t.Fatalf("reload = %d %s (operator %q); want 200 with the change, by the operator", status, body, e.operator)
	}
	e = &fakeEngine{err: api.Invalid("reload refused, nothing changed: config: rules[0]: bad")}
	if status, _, body := call(t, serve(t, e), "POST", "/v1/reload", ""); status != 400 || !strings.Contains(string(body), "rules[0]") {
		t.Fatalf("refused reload = %d %s; want 400 with the reason", status, body)
	}
}

// TestTokens: the token routes pass the operator who asked and the body's fields; an
// unknown field is refused before the engine sees it.
func TestTokens(t *testing.T) {
	e := &fakeEngine{}
	srv := serve(t, e)
	status, _, body := call(t, srv, "POST", "/v1/tokens", `{"actor":"ci","expires":"30d"}`)
	var issued api.IssuedToken
	if status != 200 || json.Unmarshal(body, &issued) != nil || issued.View.Actor != "ci" || issued.View.CreatedBy != e.operator || e.operator == "" {
		t.Fatalf("issue = %d %s; want 200 with the token, by the operator", status, body)
	}
	if status, _, body := call(t, srv, "POST", "/v1/tokens", `{"actor":"ci","token":"pst_mine"}`); status != 400 {
		t.Fatalf("issue with an unknown field = %d %s; want 400", status, body)
	}
	status, _, body = call(t, srv, "POST", "/v1/tokens/tok_bbbbbbbbbbbbbbbb/revoke", "")
	var rev api.TokenRevocation
	if status != 200 || json.Unmarshal(body, &rev) != nil || rev.View.ID != "tok_bbbbbbbbbbbbbbbb" || rev.View.RevokedBy != e.operator {
		t.Fatalf("revoke = %d %s; want 200, by the operator", status, body)
	}
	status, _, body = call(t, srv, "GET", "/v1/tokens", "")
	if status != 200 || !strings.Contains(string(body), `"tok_aaaaaaaaaaaaaaaa"`) {
		t.Fatalf("list = %d %s", status, body)
	}
}

func TestPolicyCheck(t *testing.T) {
	e := &fakeEngine{}
	srv := serve(t, e)
	status, _, body := call(t, srv, "POST", "/v1/policy/check", `{"Actor":"a","Tool":"ssh_exec","Host":"web1","Command":"uptime"}`)
	if status != 200 {
		t.Fatalf("status = %d (%s); want 200", status, body)
	}
	want := policy.Request{Actor: "a", Tool: "ssh_exec", Host: "web1", Command: "uptime"}
	if e.policyReq.Actor != want.Actor || e.policyReq.Tool != want.Tool || e.policyReq.Host != want.Host || e.policyReq.Command != want.Command {
		t.Fatalf("PolicyCheck(%+v); want %+v", e.policyReq, want)
	}
}

func TestRetentionPass(t *testing.T) {
	e := &fakeEngine{}
	srv := serve(t, e)
	status, _, body := call(t, srv, "POST", "/v1/journal/gc", `{"dry_run":true}`)
	if status != 200 || !e.dryRun || !strings.Contains(string(body), `"records":3`) {
		t.Fatalf("dry run: %d %s (dry run passed: %v)", status, body, e.dryRun)
	}
	if status, _, body := call(t, srv, "POST", "/v1/journal/gc", `{}`); status != 200 || e.dryRun {
		t.Fatalf("pass: %d %s (dry run passed: %v)", status, body, e.dryRun)
	}
	if status, _, _ := call(t, srv, "GET", "/v1/journal/gc", ""); status != http.StatusMethodNotAllowed {
		t.Fatalf("GET of the pass: %d; want 405", status)
	}
}

func TestBodies(t *testing.T) {
	tests := []struct {
		name    string
		path    string
		body    string
		wantErr string
	}{
		{"unknown field", "/v1/approvals/ex_1/approve", `{"note":"ok","operator":"mallory"}`, `unknown field "operator"`},
		{"not JSON", "/v1/approvals/ex_1/deny", `reason: no`, "request body"},
		{"empty", "/v1/executions/ex_1/review", ``, "request body: EOF"},
		{"too large", "/v1/approvals/ex_1/approve", `{"note":"` + strings.Repeat("x", maxBody) + `"}`, "request body too large"},
		{"policy unknown field", "/v1/policy/check", `{"Tool":"ssh_exec","Sudo":true}`, `unknown field "Sudo"`},
		{"gc unknown field", "/v1/journal/gc", `{"dryrun":true}`, `unknown field "dryrun"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{}
			status, _, body := call(t, serve(t, e), "POST", tt.path, tt.body)
			if oe := operatorError(t, body); status != 400 || oe.Code != api.CodeInvalidArgument || !strings.Contains(oe.Error, tt.wantErr) {
				t.Fatalf("answer = %d %+v; want 400 invalid_argument with %q", status, oe, tt.wantErr)
			}
			if e.id != "" || e.policyReq.Tool != "" {
				t.Fatal("the engine was called with a refused body")
			}
		})
	}
	t.Run("just under the bound", func(t *testing.T) {
		e := &fakeEngine{}
		note := strings.Repeat("x", maxBody-len(`{"note":""}`))
		status, _, body := call(t, serve(t, e), "POST", "/v1/approvals/ex_1/approve", `{"note":"`+note+`"}`)
		if status != 200 || e.note != note {
			t.Fatalf("answer = %d %.80s; want 200 with the note passed", status, body)
		}
	})
}

func TestDecisions(t *testing.T) {
	tests := []struct {
		name        string
		path        string
		body        string
		wantNote    string
		wantReason  string
		wantOutcome string
	}{
		{"approve", "/v1/approvals/ex_1/approve", `{"note":"looks fine"}`, "looks fine", "", ""},
		{"deny", "/v1/approvals/ex_1/deny", `{"reason":"not today"}`, "", "not today", ""},
		{"review", "/v1/executions/ex_1/review", `{"outcome":"completed","note":"checked the host"}`, "checked the host", "", "completed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{}
			status, _, body := call(t, serve(t, e), "POST", tt.path, tt.body)
			var rec markers.Record
			if status != 200 || json.Unmarshal(body, &rec) != nil || rec.ID != "ex_1" {
				t.Fatalf("answer = %d %s; want 200 with the record", status, body)
			}
			if e.id != "ex_1" || e.note != tt.wantNote || e.reason != tt.wantReason || e.outcome != tt.wantOutcome {
				t.Fatalf("decision (%q, note %q, reason %q, outcome %q); want (ex_1, %q, %q, %q)",
					e.id, e.note, e.reason, e.outcome, tt.wantNote, tt.wantReason, tt.wantOutcome)
			}
			// Over TCP there are no peer credentials: the decision is nobody's in particular.
			if e.operator != "operator:unknown" {
				t.Fatalf("operator = %q; want operator:unknown", e.operator)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		e := &fakeEngine{err: fmt.Errorf("ex_1: %w", api.ErrNotAwaitingApproval)}
		status, _, body := call(t, serve(t, e), "POST", "/v1/approvals/ex_1/approve", `{}`)
		if oe := operatorError(t, body); status != 409 || oe.Code != "not_awaiting_approval" {
			t.Fatalf("answer = %d %+v; want 409 not_awaiting_approval", status, oe)
		}
	})
}

func TestApprovals(t *testing.T) {
	tests := []struct {
		name    string
		pending []*api.ApprovalRequest
		want    string
	}{
		{"none: an empty list, never null", nil, `{"approvals":[]}`},
		{"some", []*api.ApprovalRequest{{ExecutionID: "ex_1", Reason: "ship it"}}, `"execution_id":"ex_1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &fakeEngine{pending: tt.pending}
			status, _, body := call(t, serve(t, e), "GET", "/v1/approvals", "")
			if status != 200 || !strings.Contains(string(body), tt.want) {
				t.Fatalf("answer = %d %s; want 200 with %s", status, body, tt.want)
			}
			if e.limit != 1000 {
				t.Fatalf("PendingApprovals(%d); want 1000", e.limit)
			}
		})
	}
}

func TestAudit(t *testing.T) {
	e := &fakeEngine{auditJSON: "{\"seq\":1}\n{\"seq\":2}\n", key: "ed25519:abc"}
	srv := serve(t, e)
	status, h, body := call(t, srv, "GET", "/v1/audit/export", "")
	if status != 200 || h.Get("Content-Type") != "application/jsonl" || string(body) != e.auditJSON {
		t.Fatalf("export = %d %q %q; want 200 application/jsonl %q", status, h.Get("Content-Type"), body, e.auditJSON)
	}
	status, _, body = call(t, srv, "GET", "/v1/audit/key", "")
	if status != 200 || string(body) != "ed25519:abc\n" {
		t.Fatalf("key = %d %q; want 200 %q", status, body, "ed25519:abc\n")
	}

	failing := &fakeEngine{err: errors.New("no key"), auditJSON: "{\"seq\":1}\n"}
	srv = serve(t, failing)
	if status, _, body := call(t, srv, "GET", "/v1/audit/key", ""); status != 500 || operatorError(t, body).Code != "internal" {
		t.Fatalf("key without one = %d %s; want 500 internal", status, body)
	}
	// An export that fails midway has already sent its status: what was written stands, the
	// failure is logged.
	if status, _, body := call(t, srv, "GET", "/v1/audit/export", ""); status != 200 || string(body) != failing.auditJSON {
		t.Fatalf("failed export = %d %q; want 200 with what was written", status, body)
	}
}

// A backup streams a tar; one that fails before streaming is answered as an error.
func TestBackup(t *testing.T) {
	status, h, body := call(t, serve(t, &fakeEngine{}), "GET", "/v1/journal/backup", "")
	if status != 200 || h.Get("Content-Type") != "application/x-tar" || string(body) != "tar" {
		t.Fatalf("backup = %d %q %q; want 200 application/x-tar", status, h.Get("Content-Type"), body)
	}
	failing := &fakeEngine{err: &api.ToolError{Code: api.CodeBastionDown, Message: "down"}}
	if status, _, body := call(t, serve(t, failing), "GET", "/v1/journal/backup", ""); status != 400 || operatorError(t, body).Code != api.CodeBastionDown {
		t.Fatalf("failed backup = %d %s; want 400 bastion_down", status, body)
	}
}

// TestOperatorFromPeerCredentials: over the operator socket, a decision is journaled as the
// uid at the other end of the connection, whatever the request says.
func TestOperatorFromPeerCredentials(t *testing.T) {
	e := &fakeEngine{}
	sock := filepath.Join(sockdir.New(t), "operator.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(e, slog.New(slog.DiscardHandler)), ConnContext: ConnContext}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	t.Cleanup(client.CloseIdleConnections)

	uid := strconv.Itoa(os.Getuid())
	want := "operator:uid" + uid
	if u, err := user.LookupId(uid); err == nil {
		want = "operator:" + u.Username
	}
	for _, path := range []string{"/v1/approvals/ex_1/approve", "/v1/approvals/ex_1/deny", "/v1/executions/ex_1/review"} {
		req, err := http.NewRequest("POST", "http://operator"+path, bytes.NewReader([]byte(`{}`)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Operator", "mallory")
		req.SetBasicAuth("mallory", "x")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d; want 200", path, resp.StatusCode)
		}
		if e.operator != want || e.operatorUID != os.Getuid() {
			t.Fatalf("%s: operator = %q, uid %d; want %q, uid %d", path, e.operator, e.operatorUID, want, os.Getuid())
		}
	}
}

// TestConnContextWithoutCredentials: a connection whose peer credentials cannot be read
// (not a unix socket) is named unknown, never trusted.
func TestConnContextWithoutCredentials(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ctx := ConnContext(context.Background(), a)
	req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	if got := operatorOf(req); got.Name != "operator:unknown" || got.UID != -1 {
		t.Fatalf("operator = %+v; want operator:unknown, uid -1", got)
	}
}

// TestFleetRuns: a fleet run's body reaches the engine whole (the actor, the targets, the
// brakes as a number or a percentage, the run id); a field it does not know is refused; a
// cancel names the run.
func TestFleetRuns(t *testing.T) {
	e := &fakeEngine{}
	srv := serve(t, e)
	status, _, body := call(t, srv, "POST", "/v1/fleet/runs",
		`{"actor":"deployer","targets":["group:db","role=db"],"command":"make migrate","max_concurrency":2,"max_errors":"10%","run_id":"cli-1","wait_s":5}`)
	var x api.Execution
	if status != 200 || json.Unmarshal(body, &x) != nil || x.ExecutionID != "fr_1" {
		t.Fatalf("answer = %d %s; want 200 with the run", status, body)
	}
	want := api.FleetArgs{Targets: []string{"group:db", "role=db"}, Command: "make migrate", MaxConcurrency: "2", MaxErrors: "10%",
		CallOptions: api.CallOptions{RunID: "cli-1", WaitS: new(int)}}
	got := e.fleetArgs
	if got.WaitS == nil || *got.WaitS != 5 {
		t.Fatalf("wait_s = %v; want 5", got.WaitS)
	}
	got.WaitS, want.WaitS = nil, nil
	if e.fleetActor != "deployer" || fmt.Sprint(got) != fmt.Sprint(want) || e.operator != "operator:unknown" {
		t.Fatalf("engine got actor %q, %+v from %q; want deployer, %+v", e.fleetActor, got, e.operator, want)
	}
	status, _, body = call(t, srv, "POST", "/v1/fleet/runs", `{"actor":"deployer","hosts":["db-1"]}`)
	if oe := operatorError(t, body); status != 400 || !strings.Contains(oe.Error, `unknown field "hosts"`) {
		t.Fatalf("unknown field: %d %+v; want 400 naming it", status, oe)
	}
	status, _, body = call(t, srv, "POST", "/v1/fleet/runs/fr_9/cancel", "")
	if status != 200 || json.Unmarshal(body, &x) != nil || x.State != "cancelled" || e.id != "fr_9" {
		t.Fatalf("cancel = %d %s (engine id %q); want fr_9 cancelled", status, body, e.id)
	}
}
