// Package operatorapi is the operator API: JSON over the operator socket, which the postern
// CLI reads and decides through. The socket is 0600, so only the bastion's user and root
// reach it; decisions (approve, deny, review) are journaled with the operator's identity,
// taken from the connection's peer credentials, never from the request. It turns requests
// into calls of the Engine it is given; it decides nothing about executions itself.
//
//	GET /v1/executions?state=&review_required=&actor=&host=&since=&limit=&cursor=   records, newest first
//	GET /v1/executions/{id}                                        record, events, stored output
//	GET /v1/executions/{id}/output?stdout_offset=&stderr_offset=&wait_s=   output from offsets, waiting (follow)
//	GET /v1/investigate/{id}                                       the five questions answered
//	POST /v1/policy/check  policy.Request                          the daemon's decision for a call (nothing runs)
//	GET /v1/doctor                                                 the daemon's version; every host asked now
//	GET /v1/runs?actor=&scope=&limit=                               agent runs, newest first seen first
//	GET /v1/hosts?labels=&cursor=&limit=                         enrolled hosts, a page (default 100) sorted by name
//	GET /v1/markers/{host}?state=&limit=&cursor=                   the host's markers (asks it)
//	GET /v1/markers/{host}/{id}                                    one marker on the host
//	GET /v1/audit/export                                           the journal's event log, JSONL
//	GET /v1/audit/key                                              the audit verifier key
//	GET /v1/journal/backup                                         a consistent copy of the journal (tar stream)
//	GET /v1/approvals                                              executions awaiting approval
//	POST /v1/approvals/{id}/approve  {"note"}                      authorize and dispatch
//	POST /v1/approvals/{id}/deny     {"reason"}                    reject
//	POST /v1/executions/{id}/review  {"outcome","note"}            an unknown (or stuck) outcome, verified
//	POST /v1/fleet/runs  api.FleetRunRequest                       start (or join) a fleet run for an actor
//	POST /v1/fleet/runs/{id}/cancel                                 no host starts any more; running ones cancelled
//	POST /v1/journal/gc  {"dry_run"}                               a retention pass of the journal, now
//	POST /v1/reload                                                read the config file again and apply it
//	GET /v1/tokens                                                 the remote actors' credentials (never a token)
//	POST /v1/tokens  {"actor","expires"}                           issue a token (in the answer, once)
//	POST /v1/tokens/{id}/revoke                                    revoke an issued token, at once
package operatorapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/user"
	"strconv"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/peercred"
	"github.com/postern-dev/postern/markers"
)

// Engine is what the operator API needs of the bastion's engine. Operators see every
// actor's executions.
type Engine interface {
	// Executions lists executions, newest first.
	Executions(q api.ExecutionQuery) (*api.ExecutionPage, error)
	// Execution is one execution's record, events, run and stored output.
	Execution(id string) (*api.ExecutionDetail, error)
	// ReadOutput is an execution's output from offsets, waiting up to wait_s for more or
	// the end, as execution_output answers its agent (reading it is not a delivery).
	ReadOutput(ctx context.Context, id string, a api.OutputArgs) (*api.Execution, error)
	Investigate(ctx context.Context, id string) (*api.Investigation, error)
	Runs(actor, scope string, limit int) (*api.RunPage, error)
	// PolicyCheck is the running policy's decision for req; nothing runs.
	PolicyCheck(req policy.Request) (policy.Decision, error)
	Doctor(ctx context.Context) (*api.DoctorReport, error)
	// Overview is what is in flight and what waits for an operator (postern status).
	Overview() (*api.Overview, error)
	Hosts(a api.HostsArgs) (*api.HostsResult, error)
	// HostMarkers and HostMarker ask a host for its markers.
	HostMarkers(ctx context.Context, host string, q api.MarkerQuery) (*api.MarkerPage, error)
	HostMarker(ctx context.Context, host, id string) (*hostproto.Marker, error)
	ExportAudit(w io.Writer) error
	// Backup streams a consistent copy of the journal (bastion/journal's backup stream),
	// writing nothing before it is taken.
	Backup(ctx context.Context, w io.Writer) error
	AuditKey() (string, error)
	PendingApprovals(limit int) (*api.ApprovalPage, error)
	Approve(ctx context.Context, op api.Operator, id, note string) (*markers.Record, error)
	Deny(ctx context.Context, op api.Operator, id, reason string) (*markers.Record, error)
	Review(ctx context.Context, op api.Operator, id, outcome, note string) (*markers.Record, error)
	// OperatorFleetRun starts a fleet run for actor, or joins the one a.RunID or
	// a.IdempotencyKey names, and waits up to a.WaitS for it.
	OperatorFleetRun(ctx context.Context, op api.Operator, actor string, a api.FleetArgs) (*api.Execution, error)
	// CancelFleetRun stops a fleet run: no host starts any more, running ones are cancelled.
	CancelFleetRun(ctx context.Context, op api.Operator, id string) (*api.Execution, error)
	// RetentionPass runs the journal's retention pass now (dryRun: counts, changes nothing).
	RetentionPass(ctx context.Context, dryRun bool) (*api.RetentionPass, error)
	// Reload reads the daemon's config again and applies what a reload may change.
	Reload(op api.Operator) (*api.ConfigChange, error)
	// Tokens lists the remote actors' credentials; IssueToken issues one for an actor (the
	// token is in the answer, once); RevokeToken revokes one at once.
	Tokens() (*api.TokenList, error)
	IssueToken(op api.Operator, req api.TokenRequest) (*api.IssuedToken, error)
	RevokeToken(op api.Operator, id string) (*api.TokenRevocation, error)
}

// markersTimeout bounds a host's answer to a markers request.
const markersTimeout = 30 * time.Second

// Handler serves the operator API of e.
func Handler(e Engine, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/executions", func(w http.ResponseWriter, r *http.Request) {
		q, err := executionQuery(r)
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		page, err := e.Executions(q)
		writeJSON(w, page, err)
	})
	mux.HandleFunc("GET /v1/executions/{id}", func(w http.ResponseWriter, r *http.Request) {
		detail, err := e.Execution(r.PathValue("id"))
		writeJSON(w, detail, unknownExecution(r.PathValue("id"), err))
	})
	mux.HandleFunc("GET /v1/executions/{id}/output", func(w http.ResponseWriter, r *http.Request) {
		a, err := outputArgs(r)
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		x, err := e.ReadOutput(r.Context(), a.ExecutionID, a)
		writeJSON(w, x, unknownExecution(a.ExecutionID, err))
	})
	mux.HandleFunc("GET /v1/investigate/{id}", func(w http.ResponseWriter, r *http.Request) {
		inv, err := e.Investigate(r.Context(), r.PathValue("id"))
		writeJSON(w, inv, unknownExecution(r.PathValue("id"), err))
	})
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		limit, err := formLimit(r, 1000, 100)
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		page, err := e.Runs(r.FormValue("actor"), r.FormValue("scope"), limit)
		writeJSON(w, page, err)
	})
	mux.HandleFunc("POST /v1/policy/check", func(w http.ResponseWriter, r *http.Request) {
		var req policy.Request
		if !readBody(w, r, &req) {
			return
		}
		dec, err := e.PolicyCheck(req)
		writeJSON(w, dec, err)
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		o, err := e.Overview()
		writeJSON(w, o, err)
	})
	mux.HandleFunc("GET /v1/doctor", func(w http.ResponseWriter, r *http.Request) {
		rep, err := e.Doctor(r.Context())
		writeJSON(w, rep, err)
	})
	mux.HandleFunc("GET /v1/hosts", func(w http.ResponseWriter, r *http.Request) {
		limit, err := formLimit(r, 1000, 0)
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		out, err := e.Hosts(api.HostsArgs{Labels: r.FormValue("labels"), Cursor: r.FormValue("cursor"), Limit: limit})
		writeJSON(w, out, err)
	})
	mux.HandleFunc("GET /v1/markers/{host}", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), markersTimeout)
		defer cancel()
		limit, err := formLimit(r, 1000, 0)
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		q := api.MarkerQuery{State: r.FormValue("state"), Cursor: r.FormValue("cursor"), Limit: limit}
		page, err := e.HostMarkers(ctx, r.PathValue("host"), q)
		writeJSON(w, page, err)
	})
	mux.HandleFunc("GET /v1/markers/{host}/{id}", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), markersTimeout)
		defer cancel()
		m, err := e.HostMarker(ctx, r.PathValue("host"), r.PathValue("id"))
		writeJSON(w, m, err)
	})
	mux.HandleFunc("GET /v1/audit/export", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/jsonl")
		if err := e.ExportAudit(w); err != nil {
			log.Error("audit export", "err", err)
		}
	})
	mux.HandleFunc("POST /v1/journal/gc", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			DryRun bool `json:"dry_run"`
		}
		if !readBody(w, r, &req) {
			return
		}
		p, err := e.RetentionPass(r.Context(), req.DryRun)
		writeJSON(w, p, err)
	})
	mux.HandleFunc("GET /v1/journal/backup", func(w http.ResponseWriter, r *http.Request) {
		sw := &streamWriter{w: w, contentType: "application/x-tar"}
		if err := e.Backup(r.Context(), sw); err != nil {
			if !sw.started {
				writeJSON(w, nil, err)
				return
			}
			// The stream lacks its end: the CLI reports it cut short.
			log.Error("journal backup", "err", err)
		}
	})
	mux.HandleFunc("GET /v1/audit/key", func(w http.ResponseWriter, _ *http.Request) {
		key, err := e.AuditKey()
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte(key + "\n"))
	})
	mux.HandleFunc("GET /v1/approvals", func(w http.ResponseWriter, _ *http.Request) {
		page, err := e.PendingApprovals(1000)
		if page != nil && page.Approvals == nil {
			page.Approvals = []*api.ApprovalRequest{} // a list, never null
		}
		writeJSON(w, page, err)
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		change, err := e.Reload(operatorOf(r))
		writeJSON(w, change, err)
	})
	mux.HandleFunc("GET /v1/tokens", func(w http.ResponseWriter, _ *http.Request) {
		list, err := e.Tokens()
		writeJSON(w, list, err)
	})
	mux.HandleFunc("POST /v1/tokens", func(w http.ResponseWriter, r *http.Request) {
		var req api.TokenRequest
		if !readBody(w, r, &req) {
			return
		}
		issued, err := e.IssueToken(operatorOf(r), req)
		writeJSON(w, issued, err)
	})
	mux.HandleFunc("POST /v1/tokens/{id}/revoke", func(w http.ResponseWriter, r *http.Request) {
		rev, err := e.RevokeToken(operatorOf(r), r.PathValue("id"))
		writeJSON(w, rev, err)
	})
	mux.HandleFunc("POST /v1/approvals/{id}/approve", decision(func(r *http.Request, body operatorDecision) (*markers.Record, error) {
		return e.Approve(r.Context(), operatorOf(r), r.PathValue("id"), body.Note)
	}))
	mux.HandleFunc("POST /v1/approvals/{id}/deny", decision(func(r *http.Request, body operatorDecision) (*markers.Record, error) {
		return e.Deny(r.Context(), operatorOf(r), r.PathValue("id"), body.Reason)
	}))
	mux.HandleFunc("POST /v1/executions/{id}/review", decision(func(r *http.Request, body operatorDecision) (*markers.Record, error) {
		return e.Review(r.Context(), operatorOf(r), r.PathValue("id"), body.Outcome, body.Note)
	}))
	mux.HandleFunc("POST /v1/fleet/runs", func(w http.ResponseWriter, r *http.Request) {
		var req api.FleetRunRequest
		if !readBody(w, r, &req) {
			return
		}
		x, err := e.OperatorFleetRun(r.Context(), operatorOf(r), req.Actor, req.FleetArgs)
		writeJSON(w, x, err)
	})
	mux.HandleFunc("POST /v1/fleet/runs/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		x, err := e.CancelFleetRun(r.Context(), operatorOf(r), r.PathValue("id"))
		writeJSON(w, x, err)
	})
	return mux
}

// streamWriter sets the content type on the first write of a streamed answer, so that an
// error before it can still be answered as JSON.
type streamWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (s *streamWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", s.contentType)
	}
	return s.w.Write(p)
}

// executionQuery reads the filters of GET /v1/executions.
func executionQuery(r *http.Request) (api.ExecutionQuery, error) {
	q := api.ExecutionQuery{Actor: r.FormValue("actor"), Host: r.FormValue("host"), Cursor: r.FormValue("cursor")}
	if st := r.FormValue("state"); st != "" {
		if !markers.JournalGraph.Has(markers.State(st)) {
			return q, api.Invalid("unknown state %q", st)
		}
		q.State = markers.State(st)
	}
	if s := r.FormValue("since"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return q, api.Invalid("since: %v", err)
		}
		q.Since = t
	}
	var err error
	if q.Limit, err = formLimit(r, 10000, 100); err != nil {
		return q, err
	}
	if v := r.FormValue("review_required"); v != "" {
		if q.ReviewRequired, err = strconv.ParseBool(v); err != nil {
			return q, api.Invalid("review_required must be true or false")
		}
		if q.ReviewRequired && q.State != "" && q.State != markers.Unknown {
			return q, api.Invalid("review_required selects unknown executions, not %s", q.State)
		}
	}
	return q, nil
}

// outputArgs reads the offsets and wait of GET /v1/executions/{id}/output.
func outputArgs(r *http.Request) (api.OutputArgs, error) {
	a := api.OutputArgs{ExecutionID: r.PathValue("id")}
	for name, dst := range map[string]*int64{"stdout_offset": &a.StdoutOffset, "stderr_offset": &a.StderrOffset} {
		if v := r.FormValue(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return a, api.Invalid("%s must be a byte offset", name)
			}
			*dst = n
		}
	}
	if v := r.FormValue("wait_s"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return a, api.Invalid("wait_s must be a number of seconds")
		}
		a.WaitS = &n
	}
	return a, nil
}

// unknownExecution turns the journal's not-found for execution id into an answer that says
// what to do; other errors pass unchanged.
func unknownExecution(id string, err error) error {
	if errors.Is(err, markers.ErrNotFound) {
		return &api.ToolError{Code: api.CodeNotFound, ExecutionID: id, Message: fmt.Sprintf(
			"the journal has no execution %s: check the id (`postern executions list` shows the recent ones); executions past their class's retention are removed", id)}
	}
	return err
}

// formLimit reads the request's limit (1..most); def when it gives none.
func formLimit(r *http.Request, most, def int) (int, error) {
	l := r.FormValue("limit")
	if l == "" {
		return def, nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > most {
		return 0, api.Invalid("limit must be in 1..%d", most)
	}
	return n, nil
}

// operatorDecision is the body of approve ({"note"}), deny ({"reason"}) and review
// ({"outcome","note"}).
type operatorDecision struct {
	Note    string `json:"note"`
	Reason  string `json:"reason"`
	Outcome string `json:"outcome"`
}

// decision serves an operator's decision: the body is read, the decision journaled, the
// record returned.
func decision(decide func(*http.Request, operatorDecision) (*markers.Record, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body operatorDecision
		if !readBody(w, r, &body) {
			return
		}
		rec, err := decide(r, body)
		writeJSON(w, rec, err)
	}
}

// maxBody bounds a request's JSON body.
const maxBody = 16 << 10

func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, nil, api.Invalid("request body: %v", err))
		return false
	}
	return true
}

type operatorKey struct{}

// ConnContext names the operator on a connection from its peer credentials (an
// http.Server's ConnContext for the operator socket).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	op := api.Operator{Name: "operator:unknown", UID: -1}
	// The socket's accept check already admitted the peer; a peer whose credentials cannot be
	// read is named unknown in the journal's decisions, and decides nothing that runs.
	if cred, err := peercred.Read(c); err == nil {
		op.UID = int(cred.Uid)
		op.Name = "operator:uid" + strconv.Itoa(op.UID)
		if u, err := user.LookupId(strconv.Itoa(op.UID)); err == nil {
			op.Name = "operator:" + u.Username
		}
	}
	return context.WithValue(ctx, operatorKey{}, op)
}

func operatorOf(r *http.Request) api.Operator {
	if op, ok := r.Context().Value(operatorKey{}).(api.Operator); ok {
		return op
	}
	return api.Operator{Name: "operator:unknown", UID: -1}
}

// writeJSON answers v, or err as an api.OperatorError with the status its kind calls for.
func writeJSON(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		status, code := http.StatusInternalServerError, "internal"
		var te *api.ToolError
		switch {
		case errors.As(err, &te):
			status, code = http.StatusBadRequest, te.Code
			switch te.Code {
			case api.CodeNotFound:
				status = http.StatusNotFound
			case api.CodeNotAnOperator:
				status = http.StatusForbidden
			}
		case errors.Is(err, markers.ErrNotFound):
			status, code = http.StatusNotFound, api.CodeNotFound
		case errors.Is(err, fleet.ErrUnknownHost):
			status, code = http.StatusNotFound, api.CodeUnknownHost
		case errors.Is(err, api.ErrNotAwaitingApproval):
			status, code = http.StatusConflict, "not_awaiting_approval"
		case errors.Is(err, api.ErrNotReviewable):
			status, code = http.StatusConflict, "not_reviewable"
		case errors.Is(err, api.ErrNoMarkers):
			status, code = http.StatusConflict, "no_markers"
		case errors.Is(err, api.ErrNoHostagent):
			status, code = http.StatusConflict, "no_hostagent"
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(api.OperatorError{Error: err.Error(), Code: code})
		return
	}
	json.NewEncoder(w).Encode(v)
}
