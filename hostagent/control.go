package hostagent

// The postern-control protocol: JSON lines, served over the SSH subsystem of that name and
// over the local unix socket (localsock.go).
//
// # Framing
//
// The client sends one request per line: a JSON object of at most MaxControlLine bytes (the
// newline excluded). A longer line is answered with a bad_request error and the connection is
// closed; any other bad line is answered with an error and the connection stays usable. Blank
// lines are ignored. Requests are served one at a time, in order; EOF from the client ends
// the connection once the request in progress is answered.
//
// Every request gets zero or more progress lines and then exactly one final line. Progress
// lines:
//
//	{"keepalive":true}                                   any op, after DefaultKeepaliveInterval (15 s) without another line
//	{"stream":"stdout","offset":N,"data":"<base64>"}     attach: output bytes N.. of the stream
//	{"export":"<base64>"}                                export: the next bytes of the JSONL log
//
// Final lines, by op:
//
//	status      {"markers":[…],"missing":["ex_…",…]}
//	list        {"markers":[…],"next":"<cursor>"}         next is absent on the last page
//	attach      {"final":<marker>}
//	cancel      {"marker":<marker>}
//	checkpoint  {"marker":<marker>}
//	validated   {"marker":<marker>}
//	export      {"export_end":{"bytes":N,"sha256":"<hex>"}} size and digest of the whole log
//	any op      {"error":{"code":"…","message":"…"}}
//
// The export is carried as base64 chunks rather than as embedded JSON lines because the hash
// chain covers the exact bytes of every event line; the export_end digest lets the client
// tell a complete log from a connection cut in the middle.
//
// # Authorization
//
// A caller (controlCaller) is an operator or not, and sees either every account's markers or
// only one account's. Markers of other accounts do not exist for a scoped caller: they are
// "missing" in status and not_found elsewhere, so their ids do not leak.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/user"
	"slices"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	gliderssh "github.com/gliderlabs/ssh"

	"github.com/postern-dev/postern/markers"
)

// Bounds of the protocol.
const (
	// MaxControlLine bounds one request line, newline excluded.
	MaxControlLine = 64 << 10
	// MaxStatusIDs bounds the ids of one status request.
	MaxStatusIDs = 1000
	// MaxCheckpointNote bounds a checkpoint note, in bytes.
	MaxCheckpointNote = 1 << 10
	// DefaultKeepaliveInterval is how long a request may go without a response line before
	// the server sends {"keepalive":true}.
	DefaultKeepaliveInterval = 15 * time.Second

	maxListLimit = 1000
	maxCursorLen = 1024
	// controlChunk bounds the bytes carried by one attach or export line (before base64).
	controlChunk = 32 << 10
	// maxListCalls bounds the backend pages one filtered list request reads; a filter that
	// matches rarely returns a short page with a cursor instead of scanning the whole store.
	maxListCalls = 50
	// controlWriteTimeout bounds one response line on transports with deadlines (the local
	// socket): a peer that stops reading does not pin a server goroutine.
	controlWriteTimeout = time.Minute
	// controlIdleTimeout closes a local connection that sends no request for this long.
	controlIdleTimeout = 10 * time.Minute
)

// Control operations.
const (
	OpStatus     = "status"
	OpList       = "list"
	OpAttach     = "attach"
	OpCancel     = "cancel"
	OpExport     = "export"
	OpCheckpoint = "checkpoint"
	OpValidated  = "validated"
)

// Error codes of {"error":{"code":…}}.
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeNotRunning = "not_running"
	CodeForbidden  = "forbidden"
	// CodeBusy: the local socket has too many connections; retry later.
	CodeBusy     = "busy"
	CodeInternal = "internal"
)

// Errors a ControlError unwraps to, so callers can use errors.Is on a client's error.
var (
	// ErrBadControlRequest: the request is malformed or out of bounds.
	ErrBadControlRequest = errors.New("hostagent: bad control request")
	// ErrForbidden: the caller may not perform this operation.
	ErrForbidden = errors.New("hostagent: forbidden")
	// ErrControlBusy: the server refused the connection for lack of capacity.
	ErrControlBusy = errors.New("hostagent: control socket busy")
)

// ControlError is an error reported by the control server.
type ControlError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *ControlError) Error() string { return "postern-control: " + e.Code + ": " + e.Message }

// Unwrap maps the code to the sentinel a caller branches on: not_found is
// markers.ErrNotFound, not_running ErrNotRunning, forbidden ErrForbidden, bad_request
// ErrBadControlRequest, busy ErrControlBusy.
func (e *ControlError) Unwrap() error {
	switch e.Code {
	case CodeNotFound:
		return markers.ErrNotFound
	case CodeNotRunning:
		return ErrNotRunning
	case CodeForbidden:
		return ErrForbidden
	case CodeBadRequest:
		return ErrBadControlRequest
	case CodeBusy:
		return ErrControlBusy
	}
	return nil
}

// ControlRequest is one request line. Which fields an op takes is listed in controlOpFields;
// any other field is a bad request.
type ControlRequest struct {
	Op string `json:"op"`
	// IDs: status.
	IDs []string `json:"ids,omitempty"`
	// ID: attach, cancel, checkpoint, validated.
	ID string `json:"id,omitempty"`
	// List filters (see markers.Query); OperationKey is filtered by the server.
	State        markers.State `json:"state,omitempty"`
	Since        time.Time     `json:"since,omitzero"`
	Until        time.Time     `json:"until,omitzero"`
	OperationKey string        `json:"operation_key,omitempty"`
	Newest       bool          `json:"newest,omitempty"`
	Limit        int           `json:"limit,omitempty"`
	Cursor       string        `json:"cursor,omitempty"`
	// Attach: where to resume each stream.
	StdoutOffset int64 `json:"stdout_offset,omitempty"`
	StderrOffset int64 `json:"stderr_offset,omitempty"`
	// Note: checkpoint.
	Note string `json:"note,omitempty"`
}

var controlOpFields = map[string][]string{
	OpStatus:     {"ids"},
	OpList:       {"state", "since", "until", "operation_key", "newest", "limit", "cursor"},
	OpAttach:     {"id", "stdout_offset", "stderr_offset"},
	OpCancel:     {"id"},
	OpExport:     {},
	OpCheckpoint: {"id", "note"},
	OpValidated:  {"id"},
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadControlRequest, fmt.Sprintf(format, args...))
}

// DecodeControlRequest parses and validates one request line. It is safe on untrusted input;
// every error wraps ErrBadControlRequest.
func DecodeControlRequest(line []byte) (ControlRequest, error) {
	if len(line) > MaxControlLine {
		return ControlRequest{}, badRequest("request of %d bytes, more than %d", len(line), MaxControlLine)
	}
	// Field names are checked exactly here: encoding/json alone would match them without
	// regard to case and ignore the ones an op does not take.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil || fields == nil {
		return ControlRequest{}, badRequest("a request is one JSON object per line")
	}
	var op string
	if raw, ok := fields["op"]; !ok || json.Unmarshal(raw, &op) != nil {
		return ControlRequest{}, badRequest(`missing "op"`)
	}
	allowed, ok := controlOpFields[op]
	if !ok {
		return ControlRequest{}, badRequest("unknown op %q", boundForLog(op))
	}
	for name := range fields {
		if name != "op" && !slices.Contains(allowed, name) {
			return ControlRequest{}, badRequest("unknown field %q for op %q", boundForLog(name), op)
		}
	}
	var req ControlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return ControlRequest{}, badRequest("%v", err)
	}
	if err := req.Validate(); err != nil {
		return ControlRequest{}, err
	}
	return req, nil
}

// Validate checks the values of the fields req.Op takes (DecodeControlRequest has already
// refused fields it does not take).
func (req ControlRequest) Validate() error {
	validID := func() error {
		if !markers.ValidExecutionID(req.ID) {
			return badRequest("invalid execution id %q", boundForLog(req.ID))
		}
		return nil
	}
	switch req.Op {
	case OpStatus:
		if len(req.IDs) == 0 || len(req.IDs) > MaxStatusIDs {
			return badRequest("status takes 1..%d ids, got %d", MaxStatusIDs, len(req.IDs))
		}
		for _, id := range req.IDs {
			if !markers.ValidExecutionID(id) {
				return badRequest("invalid execution id %q", boundForLog(id))
			}
		}
	case OpList:
		if req.State != "" && !markers.Host.Has(req.State) {
			return badRequest("unknown state %q", boundForLog(string(req.State)))
		}
		if req.Limit < 0 || req.Limit > maxListLimit {
			return badRequest("limit %d: want 0..%d", req.Limit, maxListLimit)
		}
		if _, err := hex.DecodeString(req.Cursor); err != nil || len(req.Cursor) > maxCursorLen {
			return badRequest("invalid cursor")
		}
		if len(req.OperationKey) > maxOperationKeyLen || bytes.IndexByte([]byte(req.OperationKey), 0) >= 0 {
			return badRequest("invalid operation key")
		}
		if !req.Since.IsZero() && !req.Until.IsZero() && !req.Until.After(req.Since) {
			return badRequest("until must be after since")
		}
	case OpAttach:
		if req.StdoutOffset < 0 || req.StderrOffset < 0 {
			return badRequest("offsets must not be negative")
		}
		return validID()
	case OpCancel, OpValidated:
		return validID()
	case OpCheckpoint:
		if err := checkNote(req.Note); err != nil {
			return err
		}
		return validID()
	case OpExport:
	default:
		return badRequest("unknown op %q", boundForLog(req.Op))
	}
	return nil
}

// checkNote accepts 1..MaxCheckpointNote bytes of printable UTF-8 (spaces included, no
// control characters), so a note cannot forge lines in a log or a terminal.
func checkNote(note string) error {
	if note == "" || len(note) > MaxCheckpointNote {
		return badRequest("a checkpoint note is 1..%d bytes, got %d", MaxCheckpointNote, len(note))
	}
	if !utf8.ValidString(note) {
		return badRequest("the checkpoint note is not UTF-8")
	}
	for _, r := range note {
		if !unicode.IsPrint(r) {
			return badRequest("the checkpoint note contains the non-printable character %U", r)
		}
	}
	return nil
}

// controlBackend is what the control protocol needs from the executor.
type controlBackend interface {
	// Get returns the marker of id (markers.ErrNotFound if none).
	Get(id string) (*markers.Record, error)
	// List pages through markers (markers.Query: State, Since, Until, Newest, Limit, Cursor).
	List(q markers.Query) ([]*markers.Record, string, error)
	// Attach streams the execution's output from the given offsets until it has ended and
	// everything was emitted, then returns the final marker; ctx ends it early.
	Attach(ctx context.Context, id string, stdoutOffset, stderrOffset int64, emit func(stream string, data []byte) error) (*markers.Record, error)
	// Cancel asks a running execution to stop (TERM, grace, KILL) and returns the marker
	// after it ended.
	Cancel(ctx context.Context, id string) (*markers.Record, error)
	// Checkpoint adds a checkpoint note (or marks validated) to a running execution, if
	// peerPID is in the execution's process tree.
	Checkpoint(ctx context.Context, id string, peerPID int, note string, validated bool) (*markers.Record, error)
	// Export writes the marker store's hash-chained event log as JSONL (markers.Store.Export).
	Export(w io.Writer) error
}

// controlCaller is who is on the other end of a control connection.
type controlCaller struct {
	// transport is "ssh" or "local", for logs.
	transport string
	// account, if set, scopes the caller to markers whose Record.Account is account;
	// "" sees every marker.
	account string
	// operator may use status, list, attach, cancel and export.
	operator bool
	// peerPID is the pid of a local peer (SO_PEERCRED), which checkpoint and validated
	// need; 0 over SSH, where they are forbidden.
	peerPID int
}

func (c controlCaller) sees(rec *markers.Record) bool {
	return c.account == "" || rec.Account == c.account
}

// permits reports whether the caller may use op at all.
func (c controlCaller) permits(op string) error {
	switch op {
	case OpCheckpoint, OpValidated:
		if c.peerPID <= 0 {
			return fmt.Errorf("%w: %s is only served on the local socket, to the execution's own processes", ErrForbidden, op)
		}
	case OpExport:
		if !c.operator || c.account != "" {
			return fmt.Errorf("%w: export covers every account's markers", ErrForbidden)
		}
	default:
		if !c.operator {
			return fmt.Errorf("%w: %s needs an operator (root or the hostagent's own user)", ErrForbidden, op)
		}
	}
	return nil
}

// controlServer serves the protocol to one caller per connection.
type controlServer struct {
	backend controlBackend
	logger  *slog.Logger
	// keepalive is the longest a request goes without a response line.
	keepalive time.Duration
	// idleTimeout closes a connection with a read deadline (the local socket) that sends
	// no request for this long; 0 means never.
	idleTimeout time.Duration
}

func newControlServer(b controlBackend, logger *slog.Logger) *controlServer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &controlServer{backend: b, logger: logger, keepalive: DefaultKeepaliveInterval, idleTimeout: controlIdleTimeout}
}

// ownAccountName is the user the hostagent runs as: an SSH session for that account sees
// every account's markers.
var ownAccountName = sync.OnceValue(func() string {
	u, err := user.Current()
	if err != nil {
		return "" // no account matches: every SSH caller stays scoped to its own markers
	}
	return u.Username
})

// ServeControlSession serves the postern-control subsystem on s for account and ends the
// session with exit status 0 when the client closed its side, 1 on a protocol or transport
// error. The account sees only its own markers, unless it is the account the hostagent
// runs as. Checkpoints are refused over SSH. Executor.Control calls it.
func ServeControlSession(ctx context.Context, s gliderssh.Session, account Account, b controlBackend, logger *slog.Logger) {
	serveControlSession(ctx, s, sshCaller(account.Name, ownAccountName()), newControlServer(b, logger))
}

func sshCaller(account, own string) controlCaller {
	c := controlCaller{transport: "ssh", account: account, operator: true}
	if own != "" && account == own {
		c.account = ""
	}
	return c
}

func serveControlSession(ctx context.Context, s gliderssh.Session, caller controlCaller, cs *controlServer) {
	code := 0
	if err := cs.serve(ctx, s, caller); err != nil {
		cs.logger.Info("control session ended", "account", caller.account, "err", err)
		code = 1
	}
	s.Exit(code)
}

// errLineTooLong: a request line exceeded MaxControlLine.
var errLineTooLong = fmt.Errorf("request line longer than %d bytes", MaxControlLine)

// serve answers requests from rw until EOF. It returns nil on EOF and an error when the
// connection cannot go on (oversized line, read or write failure).
func (cs *controlServer) serve(ctx context.Context, rw io.ReadWriter, caller controlCaller) error {
	br := bufio.NewReaderSize(rw, 4096)
	out := &controlWriter{w: rw}
	deadliner, _ := rw.(interface{ SetReadDeadline(time.Time) error })
	for {
		if deadliner != nil && cs.idleTimeout > 0 {
			deadliner.SetReadDeadline(time.Now().Add(cs.idleTimeout))
		}
		line, err := readControlLine(br, MaxControlLine)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, errLineTooLong):
			out.send(errorReply(CodeBadRequest, err.Error()))
			return err
		case err != nil:
			return fmt.Errorf("read request: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		req, err := DecodeControlRequest(line)
		if err != nil {
			if err := out.send(errorReply(CodeBadRequest, err.Error())); err != nil {
				return err
			}
			continue
		}
		if err := cs.handle(ctx, out, caller, req); err != nil {
			return err
		}
	}
}

// readControlLine returns the next line without its newline; a last line without a newline
// is returned as is. A line longer than max is errLineTooLong.
func readControlLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max+1 || len(line) == max+1 && line[max] != '\n' {
			return nil, errLineTooLong
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, nil
		default:
			return nil, err
		}
	}
}

// handle serves one request: progress lines while it runs, then its final line. It returns
// an error only when the connection cannot go on.
func (cs *controlServer) handle(ctx context.Context, out *controlWriter, caller controlCaller, req ControlRequest) error {
	if err := caller.permits(req.Op); err != nil {
		return out.send(errorReply(CodeForbidden, err.Error()))
	}
	reqCtx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { out.keepAlive(reqCtx, cancel, cs.keepalive) })
	final, err := cs.run(reqCtx, out, caller, req)
	cancel(nil)
	wg.Wait()
	if werr := out.failed(); werr != nil {
		return werr
	}
	if err != nil {
		return out.send(cs.errorFor(caller, req, err))
	}
	return out.send(final)
}

// errorFor maps a backend or authorization error to its protocol error.
func (cs *controlServer) errorFor(caller controlCaller, req ControlRequest, err error) controlErrorLine {
	switch {
	case errors.Is(err, ErrBadControlRequest):
		return errorReply(CodeBadRequest, err.Error())
	case errors.Is(err, markers.ErrNotFound):
		return errorReply(CodeNotFound, err.Error())
	case errors.Is(err, ErrNotRunning):
		return errorReply(CodeNotRunning, err.Error())
	case errors.Is(err, ErrNotYourProcess), errors.Is(err, ErrForbidden):
		return errorReply(CodeForbidden, err.Error())
	}
	cs.logger.Error("control request failed", "op", req.Op, "execution_id", req.ID,
		"transport", caller.transport, "account", caller.account, "err", err)
	return errorReply(CodeInternal, err.Error())
}

// Response lines the server writes.
type (
	controlErrorLine struct {
		Error ControlError `json:"error"`
	}
	statusReply struct {
		Markers []*markers.Record `json:"markers"`
		Missing []string          `json:"missing"`
	}
	listReply struct {
		Markers []*markers.Record `json:"markers"`
		Next    string            `json:"next,omitempty"`
	}
	markerReply struct {
		Marker *markers.Record `json:"marker"`
	}
	finalReply struct {
		Final *markers.Record `json:"final"`
	}
	chunkLine struct {
		Stream string `json:"stream"`
		Offset int64  `json:"offset"`
		Data   []byte `json:"data"`
	}
	exportLine struct {
		Export []byte `json:"export"`
	}
	exportEndReply struct {
		ExportEnd ExportSummary `json:"export_end"`
	}
)

// ExportSummary closes an export: the size and SHA-256 of the whole JSONL log.
type ExportSummary struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

var keepaliveLine = []byte(`{"keepalive":true}` + "\n")

func errorReply(code, message string) controlErrorLine {
	return controlErrorLine{Error: ControlError{Code: code, Message: message}}
}

// run performs req and returns its final line.
func (cs *controlServer) run(ctx context.Context, out *controlWriter, caller controlCaller, req ControlRequest) (any, error) {
	b := cs.backend
	switch req.Op {
	case OpStatus:
		return cs.status(caller, req.IDs)
	case OpList:
		return cs.list(caller, req)
	case OpAttach:
		if _, err := cs.visible(caller, req.ID); err != nil {
			return nil, err
		}
		// The backend emits each stream from its own goroutine.
		var mu sync.Mutex
		offsets := map[string]int64{"stdout": req.StdoutOffset, "stderr": req.StderrOffset}
		final, err := b.Attach(ctx, req.ID, req.StdoutOffset, req.StderrOffset, func(stream string, data []byte) error {
			mu.Lock()
			defer mu.Unlock()
			off, ok := offsets[stream]
			if !ok {
				return fmt.Errorf("attach %s: unknown stream %q", req.ID, stream)
			}
			for len(data) > 0 {
				n := min(len(data), controlChunk)
				if err := out.send(chunkLine{Stream: stream, Offset: off, Data: data[:n]}); err != nil {
					return err
				}
				off += int64(n)
				data = data[n:]
			}
			offsets[stream] = off
			return nil
		})
		if err != nil {
			return nil, err
		}
		return finalReply{Final: final}, nil
	case OpCancel:
		if _, err := cs.visible(caller, req.ID); err != nil {
			return nil, err
		}
		rec, err := b.Cancel(ctx, req.ID)
		if err != nil {
			return nil, err
		}
		return markerReply{Marker: rec}, nil
	case OpCheckpoint, OpValidated:
		rec, err := b.Checkpoint(ctx, req.ID, caller.peerPID, req.Note, req.Op == OpValidated)
		if err != nil {
			return nil, err
		}
		return markerReply{Marker: rec}, nil
	case OpExport:
		ew := &exportWriter{out: out, digest: sha256.New()}
		if err := b.Export(ew); err != nil {
			return nil, err
		}
		if err := ew.flush(); err != nil {
			return nil, err
		}
		return exportEndReply{ExportSummary{Bytes: ew.total, SHA256: hex.EncodeToString(ew.digest.Sum(nil))}}, nil
	}
	return nil, badRequest("unknown op %q", boundForLog(req.Op))
}

// visible returns the marker of id if the caller may see it, markers.ErrNotFound otherwise.
func (cs *controlServer) visible(caller controlCaller, id string) (*markers.Record, error) {
	rec, err := cs.backend.Get(id)
	if err != nil {
		return nil, err
	}
	if !caller.sees(rec) {
		return nil, fmt.Errorf("%w: %s", markers.ErrNotFound, id)
	}
	return rec, nil
}

func (cs *controlServer) status(caller controlCaller, ids []string) (statusReply, error) {
	reply := statusReply{Markers: []*markers.Record{}, Missing: []string{}}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		rec, err := cs.visible(caller, id)
		switch {
		case errors.Is(err, markers.ErrNotFound):
			reply.Missing = append(reply.Missing, id)
		case err != nil:
			return statusReply{}, err
		default:
			reply.Markers = append(reply.Markers, rec)
		}
	}
	return reply, nil
}

// list returns one page. Filters the store has no index for (operation key, the caller's
// account) are applied here, reading backend pages no larger than what is left to fill, so
// the backend's cursor always points right after the last marker returned or skipped.
func (cs *controlServer) list(caller controlCaller, req ControlRequest) (listReply, error) {
	q := markers.Query{State: req.State, Since: req.Since, Until: req.Until, Newest: req.Newest, Limit: req.Limit, Cursor: req.Cursor}
	if q.Limit == 0 {
		q.Limit = 100
	}
	limit := q.Limit
	keep := func(r *markers.Record) bool {
		return caller.sees(r) && (req.OperationKey == "" || r.OperationKey == req.OperationKey)
	}
	reply := listReply{Markers: []*markers.Record{}}
	for calls := 0; ; calls++ {
		q.Limit = limit - len(reply.Markers)
		page, next, err := cs.backend.List(q)
		if err != nil {
			return listReply{}, err
		}
		for _, r := range page {
			if keep(r) {
				reply.Markers = append(reply.Markers, r)
			}
		}
		reply.Next = next
		if next == "" || len(reply.Markers) >= limit || calls+1 >= maxListCalls {
			return reply, nil
		}
		q.Cursor = next
	}
}

// controlWriter writes response lines; lines from the request and its keepalive never
// interleave. The first write error sticks: the connection is done.
type controlWriter struct {
	w io.Writer

	mu        sync.Mutex // guards lastWrite, err and writes to w
	lastWrite time.Time
	err       error
}

func (cw *controlWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode reply: %w", err)
	}
	return cw.write(append(b, '\n'))
}

func (cw *controlWriter) write(line []byte) error {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.err != nil {
		return cw.err
	}
	if d, ok := cw.w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		d.SetWriteDeadline(time.Now().Add(controlWriteTimeout))
	}
	if _, err := cw.w.Write(line); err != nil {
		cw.err = fmt.Errorf("write reply: %w", err)
		return cw.err
	}
	cw.lastWrite = time.Now()
	return nil
}

func (cw *controlWriter) failed() error {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.err
}

func (cw *controlWriter) idle() time.Duration {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return time.Since(cw.lastWrite)
}

// keepAlive sends a keepalive line whenever nothing was written for every, until ctx ends.
// A failed write cancels the request: the peer is gone.
func (cw *controlWriter) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, every time.Duration) {
	cw.mu.Lock()
	cw.lastWrite = time.Now()
	cw.mu.Unlock()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		idle := cw.idle()
		if idle >= every {
			if err := cw.write(keepaliveLine); err != nil {
				cancel(err)
				return
			}
			idle = 0
		}
		t.Reset(every - idle)
	}
}

// exportWriter turns the backend's JSONL export into export lines of controlChunk bytes.
type exportWriter struct {
	out    *controlWriter
	buf    []byte
	total  int64
	digest interface {
		io.Writer
		Sum([]byte) []byte
	}
}

func (ew *exportWriter) Write(p []byte) (int, error) {
	n := len(p)
	ew.digest.Write(p)
	ew.total += int64(n)
	for len(p) > 0 {
		take := min(len(p), controlChunk-len(ew.buf))
		ew.buf = append(ew.buf, p[:take]...)
		p = p[take:]
		if len(ew.buf) == controlChunk {
			if err := ew.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (ew *exportWriter) flush() error {
	if len(ew.buf) == 0 {
		return nil
	}
	err := ew.out.send(exportLine{Export: ew.buf})
	ew.buf = ew.buf[:0]
	return err
}
