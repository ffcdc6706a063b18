package bastion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/user"
	"strconv"
	"time"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/peercred"
	"github.com/postern-dev/postern/markers"
)

// The operator API: JSON over the operator socket (mode 0600, so only the bastion's user and
// root reach it). It exists because the journal has one owner — the daemon — and operators
// must be able to read it while the daemon runs. Decisions (approve, deny, review) are
// journaled with the operator's identity, taken from the connection's peer credentials.
//
//	GET /v1/executions?state=&review_required=&actor=&host=&since=&limit=&cursor=   records, newest first
//	GET /v1/executions/{id}                                        record, events, stored output
//	GET /v1/executions/{id}/output?stdout_offset=&stderr_offset=&wait_s=   output from offsets, waiting (follow)
//	GET /v1/investigate/{id}                                       the five questions answered (investigate.go)
//	POST /v1/policy/check  policy.Request                          the daemon's decision for a call (nothing runs)
//	GET /v1/doctor                                                 the daemon's version; every host asked now
//	GET /v1/runs?actor=&scope=&limit=                               agent runs, newest first seen first
//	GET /v1/hosts                                                  enrolled hosts
//	GET /v1/markers/{host}?state=&limit=&cursor=                   the host's markers (asks it)
//	GET /v1/markers/{host}/{id}                                    one marker on the host
//	GET /v1/audit/export                                           the journal's event log, JSONL
//	GET /v1/audit/key                                              the audit verifier key
//	GET /v1/approvals                                              executions awaiting approval
//	POST /v1/approvals/{id}/approve  {"note"}                      authorize and dispatch
//	POST /v1/approvals/{id}/deny     {"reason"}                    reject
//	POST /v1/executions/{id}/review  {"outcome","note"}            an unknown (or stuck) outcome, verified

// ExecutionDetail is one execution for operators: the record, its event story and output.
type ExecutionDetail struct {
	Record *markers.Record `json:"record"`
	Events []markers.Event `json:"events"`
	// Output is the stored result as agents see it (an SSH output tail or an HTTP response),
	// when the execution has one.
	Output *Execution `json:"output,omitempty"`
	// Run is the agent run of its intent scope, as first seen (absent for executions
	// accepted before runs were journaled).
	Run *markers.Run `json:"run,omitempty"`
}

// ExecutionPage is one page of executions.
type ExecutionPage struct {
	Executions []*markers.Record `json:"executions"`
	Next       string            `json:"next,omitempty"`
}

// MarkerPage is a host's answer to a markers query.
type MarkerPage struct {
	Host    string              `json:"host"`
	Markers []*hostproto.Marker `json:"markers"`
	Next    string              `json:"next,omitempty"`
}

func (b *Bastion) operatorHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/executions", b.opListExecutions)
	mux.HandleFunc("GET /v1/executions/{id}", b.opShowExecution)
	mux.HandleFunc("GET /v1/investigate/{id}", func(w http.ResponseWriter, r *http.Request) {
		inv, err := b.Investigate(r.Context(), r.PathValue("id"))
		writeJSON(w, inv, unknownExecution(r.PathValue("id"), err))
	})
	mux.HandleFunc("GET /v1/runs", b.opListRuns)
	mux.HandleFunc("POST /v1/policy/check", func(w http.ResponseWriter, r *http.Request) {
		var req policy.Request
		if !readBody(w, r, &req) {
			return
		}
		dec, err := b.PolicyCheck(req)
		writeJSON(w, dec, err)
	})
	mux.HandleFunc("GET /v1/doctor", func(w http.ResponseWriter, r *http.Request) {
		rep, err := b.Doctor(r.Context())
		writeJSON(w, rep, err)
	})
	mux.HandleFunc("GET /v1/executions/{id}/output", b.opOutput)
	mux.HandleFunc("GET /v1/hosts", func(w http.ResponseWriter, _ *http.Request) {
		out, err := b.Hosts()
		writeJSON(w, out, err)
	})
	mux.HandleFunc("GET /v1/markers/{host}", b.opListMarkers)
	mux.HandleFunc("GET /v1/markers/{host}/{id}", b.opShowMarker)
	mux.HandleFunc("GET /v1/audit/export", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/jsonl")
		if err := b.journal.Export(w); err != nil {
			b.log.Error("audit export", "err", err)
		}
	})
	mux.HandleFunc("GET /v1/approvals", func(w http.ResponseWriter, _ *http.Request) {
		recs, err := b.PendingApprovals(1000)
		writeJSON(w, ExecutionPage{Executions: nonNil(recs)}, err)
	})
	mux.HandleFunc("POST /v1/approvals/{id}/approve", decision(func(r *http.Request, body operatorDecision) (*markers.Record, error) {
		return b.Approve(r.Context(), operatorOf(r), r.PathValue("id"), body.Note)
	}))
	mux.HandleFunc("POST /v1/approvals/{id}/deny", decision(func(r *http.Request, body operatorDecision) (*markers.Record, error) {
		return b.Deny(r.Context(), operatorOf(r), r.PathValue("id"), body.Reason)
	}))
	mux.HandleFunc("POST /v1/executions/{id}/review", decision(func(r *http.Request, body operatorDecision) (*markers.Record, error) {
		return b.Review(r.Context(), operatorOf(r), r.PathValue("id"), body.Outcome, body.Note)
	}))
	mux.HandleFunc("GET /v1/audit/key", func(w http.ResponseWriter, _ *http.Request) {
		_, key, err := markers.LoadOrCreateAuditKey(b.cfg.auditKeyPath(), "postern-bastion")
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		w.Write([]byte(key + "\n"))
	})
	return mux
}

func (b *Bastion) opListExecutions(w http.ResponseWriter, r *http.Request) {
	q := markers.Query{Newest: true, Limit: 100, Actor: r.FormValue("actor"), Cursor: r.FormValue("cursor")}
	if st := r.FormValue("state"); st != "" {
		if !markers.JournalGraph.Has(markers.State(st)) {
			writeJSON(w, nil, invalid("unknown state %q", st))
			return
		}
		q.State = markers.State(st)
	}
	if s := r.FormValue("since"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			writeJSON(w, nil, invalid("since: %v", err))
			return
		}
		q.Since = t
	}
	if !formLimit(w, r, 10000, &q.Limit) {
		return
	}
	host := r.FormValue("host")
	review := false
	if v := r.FormValue("review_required"); v != "" {
		var err error
		if review, err = strconv.ParseBool(v); err != nil {
			writeJSON(w, nil, invalid("review_required must be true or false"))
			return
		}
		if review && q.State != "" && q.State != markers.Unknown {
			writeJSON(w, nil, invalid("review_required selects unknown executions, not %s", q.State))
			return
		}
		if review {
			q.State = markers.Unknown
		}
	}
	page := ExecutionPage{Executions: []*markers.Record{}}
	recs, next, err := b.journal.List(q)
	if errors.Is(err, markers.ErrInvalidCursor) {
		err = invalid("cursor: not one this journal handed out; list again without it")
	}
	if err != nil {
		writeJSON(w, nil, err)
		return
	}
	for _, rec := range recs {
		if (host == "" || rec.Host == host) && (!review || rec.ReviewRequired) {
			page.Executions = append(page.Executions, rec)
		}
	}
	page.Next = next
	writeJSON(w, page, nil)
}

// unknownExecution turns the journal's not-found for execution id into an answer that says
// what to do; other errors pass unchanged.
func unknownExecution(id string, err error) error {
	if errors.Is(err, markers.ErrNotFound) {
		return &ToolError{Code: CodeNotFound, ExecutionID: id, Message: fmt.Sprintf(
			"the journal has no execution %s: check the id (`postern executions list` shows the recent ones); executions past their class's retention are removed", id)}
	}
	return err
}

// PolicyCheck is the decision the running policy makes for req (its actors, its rules),
// with the host's groups from the inventory and the endpoint's class from the config filled
// in. Nothing runs.
func (b *Bastion) PolicyCheck(req policy.Request) (policy.Decision, error) {
	if req.Host != "" {
		h, err := b.inv.Host(req.Host)
		switch {
		case err == nil:
			req.Groups = h.Groups
		case !errors.Is(err, ErrUnknownHost):
			return policy.Decision{}, err
		}
	}
	for _, e := range b.cfg.Endpoints {
		if e.Name == req.Endpoint {
			req.EndpointClass = e.Class
		}
	}
	return b.policy.Decide(req), nil
}

// opOutput serves an execution's output from the given offsets, waiting up to wait_s for
// more or the end, as execution_output does for agents (reading it is not a delivery).
func (b *Bastion) opOutput(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a := OutputArgs{ExecutionID: id}
	for name, dst := range map[string]*int64{"stdout_offset": &a.Offset, "stderr_offset": &a.StderrOffset} {
		if v := r.FormValue(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeJSON(w, nil, invalid("%s must be a byte offset", name))
				return
			}
			*dst = n
		}
	}
	if v := r.FormValue("wait_s"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeJSON(w, nil, invalid("wait_s must be a number of seconds"))
			return
		}
		a.WaitS = &n
	}
	rec, err := b.journal.Get(id)
	if err != nil {
		writeJSON(w, nil, unknownExecution(id, err))
		return
	}
	x, err := b.output(r.Context(), rec, a)
	writeJSON(w, x, err)
}

// RunPage is a list of agent runs.
type RunPage struct {
	Runs []*markers.Run `json:"runs"`
}

func (b *Bastion) opListRuns(w http.ResponseWriter, r *http.Request) {
	q := markers.RunQuery{Actor: r.FormValue("actor"), Limit: 100}
	if !formLimit(w, r, 1000, &q.Limit) {
		return
	}
	scope := r.FormValue("scope")
	if scope != "" {
		q.Limit = 1000 // a scope is one run per actor: look through the newest
	}
	runs, err := b.journal.Runs(q)
	if err != nil {
		writeJSON(w, nil, err)
		return
	}
	page := RunPage{Runs: []*markers.Run{}}
	for _, run := range runs {
		if scope == "" || run.Scope == scope {
			page.Runs = append(page.Runs, run)
		}
	}
	writeJSON(w, page, nil)
}

func (b *Bastion) opShowExecution(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rec, err := b.journal.Get(id)
	if err != nil {
		writeJSON(w, nil, unknownExecution(id, err))
		return
	}
	events, err := b.journal.Events(id)
	if err != nil {
		writeJSON(w, nil, err)
		return
	}
	detail := ExecutionDetail{Record: rec, Events: events}
	if run, err := b.journal.Run(rec.Actor, rec.IntentScope); err == nil {
		detail.Run = run
	}
	if rec.ResultRef != "" {
		detail.Output = b.stored(rec)
	}
	writeJSON(w, detail, nil)
}

// hostControl opens the hostagent's control protocol on host.
func (b *Bastion) hostControl(ctx context.Context, host Host) (*hostproto.ControlClient, error) {
	conn, err := b.pool.Conn(ctx, host)
	if err != nil {
		return nil, err
	}
	return hostproto.DialControl(conn)
}

// markerHost is the host a markers request names, once its level keeps markers.
func (b *Bastion) markerHost(name string) (Host, error) {
	host, err := b.inv.Host(name)
	if err == nil && host.Level() == GuaranteeNone {
		err = noMarkersError(host)
	}
	return host, err
}

// opListMarkers lists a host's markers: the hostagent's through its control protocol, the
// marker script's with its list command (stockmarkers.go).
func (b *Bastion) opListMarkers(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	host, err := b.markerHost(r.PathValue("host"))
	if err != nil {
		writeJSON(w, nil, err)
		return
	}
	q := hostproto.ControlListQuery{State: hostproto.MarkerState(r.FormValue("state")), Cursor: r.FormValue("cursor"), Newest: true}
	if !formLimit(w, r, 1000, &q.Limit) {
		return
	}
	var page []*hostproto.Marker
	var next string
	if host.Level() == GuaranteeMarkerScript {
		var list []agentless.Answer
		if list, err = listMarkerScript(ctx, b.pool, host); err == nil {
			page, next, err = scriptMarkerPage(host, list, scriptMarkerQuery{State: q.State, Cursor: q.Cursor, Limit: q.Limit})
		}
	} else {
		var cc *hostproto.ControlClient
		if cc, err = b.hostControl(ctx, host); err == nil {
			page, next, err = cc.List(ctx, q)
			cc.Close()
		}
	}
	writeJSON(w, MarkerPage{Host: host.Name, Markers: page, Next: next}, err)
}

func (b *Bastion) opShowMarker(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	host, err := b.markerHost(r.PathValue("host"))
	if err != nil {
		writeJSON(w, nil, err)
		return
	}
	id := r.PathValue("id")
	var found *hostproto.Marker
	if host.Level() == GuaranteeMarkerScript {
		found, err = b.showScriptMarker(ctx, host, id)
	} else {
		found, err = b.showHostagentMarker(ctx, host, id)
	}
	if err == nil && found == nil {
		err = fmt.Errorf("%w: host %s has no marker %s", markers.ErrNotFound, host.Name, id)
	}
	writeJSON(w, found, err)
}

// showHostagentMarker is the hostagent's marker of id (nil: none).
func (b *Bastion) showHostagentMarker(ctx context.Context, host Host, id string) (*hostproto.Marker, error) {
	cc, err := b.hostControl(ctx, host)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	found, _, err := cc.Status(ctx, []string{id})
	if err != nil || len(found) == 0 {
		return nil, err
	}
	return found[0], nil
}

// showScriptMarker is the marker script's marker of id (nil: none).
func (b *Bastion) showScriptMarker(ctx context.Context, host Host, id string) (*hostproto.Marker, error) {
	if !markers.ValidExecutionID(id) {
		return nil, invalid("%q is not an execution id", id)
	}
	a, err := askMarkerScript(ctx, b.pool, host, id)
	if err != nil || a.State == agentless.Absent {
		return nil, err
	}
	return scriptMarker(host, a), nil
}

// formLimit reads the request's limit (1..most) into limit, if given; false when it is
// invalid (the error is answered).
func formLimit(w http.ResponseWriter, r *http.Request, most int, limit *int) bool {
	l := r.FormValue("limit")
	if l == "" {
		return true
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > most {
		writeJSON(w, nil, invalid("limit must be in 1..%d", most))
		return false
	}
	*limit = n
	return true
}

func nonNil(recs []*markers.Record) []*markers.Record {
	if recs == nil {
		return []*markers.Record{}
	}
	return recs
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

// maxOperatorBody bounds a decision's JSON body.
const maxOperatorBody = 16 << 10

func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxOperatorBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, nil, invalid("request body: %v", err))
		return false
	}
	return true
}

type operatorKey struct{}

// operatorConnContext names the operator on a connection from its peer credentials.
func operatorConnContext(ctx context.Context, c net.Conn) context.Context {
	name := "operator:unknown"
	// The socket's accept check already admitted the peer; a peer whose credentials cannot be
	// read is named unknown in the journal's decisions.
	if cred, err := peercred.Read(c); err == nil {
		name = "operator:uid" + strconv.Itoa(int(cred.Uid))
		if u, err := user.LookupId(strconv.Itoa(int(cred.Uid))); err == nil {
			name = "operator:" + u.Username
		}
	}
	return context.WithValue(ctx, operatorKey{}, name)
}

func operatorOf(r *http.Request) string {
	if name, ok := r.Context().Value(operatorKey{}).(string); ok {
		return name
	}
	return "operator:unknown"
}

// OperatorError is the operator API's error body.
type OperatorError struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func writeJSON(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		status, code := http.StatusInternalServerError, "internal"
		var te *ToolError
		switch {
		case errors.As(err, &te):
			status, code = http.StatusBadRequest, te.Code
			if te.Code == CodeNotFound {
				status = http.StatusNotFound
			}
		case errors.Is(err, markers.ErrNotFound):
			status, code = http.StatusNotFound, CodeNotFound
		case errors.Is(err, ErrUnknownHost):
			status, code = http.StatusNotFound, CodeUnknownHost
		case errors.Is(err, ErrNotAwaitingApproval):
			status, code = http.StatusConflict, "not_awaiting_approval"
		case errors.Is(err, ErrNotReviewable):
			status, code = http.StatusConflict, "not_reviewable"
		case errors.Is(err, ErrNoMarkers):
			status, code = http.StatusConflict, "no_markers"
		case errors.Is(err, ErrNoHostagent):
			status, code = http.StatusConflict, "no_hostagent"
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(OperatorError{Error: err.Error(), Code: code})
		return
	}
	json.NewEncoder(w).Encode(v)
}
