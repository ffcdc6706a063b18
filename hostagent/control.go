package hostagent

// The server side of the postern-control protocol, served over the SSH subsystem of that
// name and over the local unix socket (localsock.go). The wire format (framing, request and
// response lines) and the client are in hostproto, whose control.go documents them.
//
// # Authorization
//
// A caller (controlCaller) is an operator or not, and sees either every marker or only those of
// one identity (account + key, or certificate key id: see Identity). Other identities'
// markers do not exist for a scoped caller: they are "missing" in status, left out of list
// and not_found elsewhere, exactly like ids never used, so their ids do not leak.
//
// A local peer that is not an operator may only report checkpoints of its own execution;
// every other answer it gets is the same whatever the id: forbidden for the other ops, and one
// forbidden message for a checkpoint on an unknown, finished or someone else's execution.

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

	gliderssh "github.com/gliderlabs/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/version"
	"github.com/postern-dev/postern/markers"
)

// Bounds of the server; those of the requests are in hostproto.
const (
	// DefaultKeepaliveInterval is how long a request may go without a response line before
	// the server sends {"keepalive":true}.
	DefaultKeepaliveInterval = 15 * time.Second

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

// controlOpFields lists the fields each op takes; DecodeControlRequest refuses any other.
var controlOpFields = map[string][]string{
	hostproto.OpStatus:     {"ids"},
	hostproto.OpList:       {"state", "since", "until", "operation_key", "newest", "limit", "cursor"},
	hostproto.OpAttach:     {"id", "stdout_offset", "stderr_offset"},
	hostproto.OpCancel:     {"id"},
	hostproto.OpExport:     {},
	hostproto.OpCheckpoint: {"id", "note"},
	hostproto.OpValidated:  {"id"},
	hostproto.OpReload:     {},
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", hostproto.ErrBadControlRequest, fmt.Sprintf(format, args...))
}

// DecodeControlRequest parses and validates one request line. It is safe on untrusted input;
// every error wraps hostproto.ErrBadControlRequest.
func DecodeControlRequest(line []byte) (hostproto.ControlRequest, error) {
	if len(line) > hostproto.MaxControlLine {
		return hostproto.ControlRequest{}, badRequest("request of %d bytes, more than %d", len(line), hostproto.MaxControlLine)
	}
	// Field names are checked exactly here: encoding/json alone would match them without
	// regard to case and ignore the ones an op does not take.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil || fields == nil {
		return hostproto.ControlRequest{}, badRequest("a request is one JSON object per line")
	}
	var op string
	if raw, ok := fields["op"]; !ok || json.Unmarshal(raw, &op) != nil {
		return hostproto.ControlRequest{}, badRequest(`missing "op"`)
	}
	allowed, ok := controlOpFields[op]
	if !ok {
		return hostproto.ControlRequest{}, badRequest("unknown op %q", boundForLog(op))
	}
	for name := range fields {
		if name != "op" && !slices.Contains(allowed, name) {
			return hostproto.ControlRequest{}, badRequest("unknown field %q for op %q", boundForLog(name), op)
		}
	}
	var req hostproto.ControlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		return hostproto.ControlRequest{}, badRequest("%v", err)
	}
	if err := req.Validate(); err != nil {
		return hostproto.ControlRequest{}, err
	}
	return req, nil
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
	// MarkerRetention is how long a finished marker is kept: a status answer of "no marker"
	// proves "never started" only for executions younger than this.
	MarkerRetention() time.Duration
}

// reloader is the backend of an agent that can reload its config (Agent.Reload): only the
// local socket's backend is one.
type reloader interface {
	Reload(ctx context.Context, by string) (hostproto.ReloadResult, error)
}

// controlCaller is who is on the other end of a control connection.
type controlCaller struct {
	// transport is "ssh" or "local", for logs.
	transport string
	// scope, if set, limits the caller to the markers of that identity; nil sees every
	// marker.
	scope *Identity
	// operator may use status, list, attach, cancel and export.
	operator bool
	// peerPID is the pid of a local peer (SO_PEERCRED), which checkpoint and validated
	// need; 0 over SSH, where they are forbidden.
	peerPID int
	// peerUID is the uid of a local peer (SO_PEERCRED).
	peerUID uint32
}

func (c controlCaller) sees(rec *markers.Record) bool {
	return c.scope == nil || c.scope.ownsRecord(rec)
}

// account names the caller's scope for logs.
func (c controlCaller) account() string {
	if c.scope == nil {
		return ""
	}
	return c.scope.Account
}

// permits reports whether the caller may use op at all.
func (c controlCaller) permits(op string) error {
	switch op {
	case hostproto.OpCheckpoint, hostproto.OpValidated:
		if c.peerPID <= 0 {
			return fmt.Errorf("%w: %s is only served on the local socket, to the execution's own processes", hostproto.ErrForbidden, op)
		}
	case hostproto.OpExport:
		if !c.operator || c.scope != nil {
			return fmt.Errorf("%w: export covers every account's markers", hostproto.ErrForbidden)
		}
	case hostproto.OpReload:
		// The config is the host's, not a client's: only those who could edit it and
		// restart the agent (root, the agent's own account, on the host itself) may.
		if !c.operator || c.transport != "local" {
			return fmt.Errorf("%w: reload is served on the local socket, to root and the hostagent's own user", hostproto.ErrForbidden)
		}
	default:
		if !c.operator {
			return fmt.Errorf("%w: %s needs an operator (root or the hostagent's own user)", hostproto.ErrForbidden, op)
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
	// localLimits bound the local socket's connections (serveLocal).
	localLimits LocalLimits
}

func newControlServer(b controlBackend, logger *slog.Logger) *controlServer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &controlServer{backend: b, logger: logger, keepalive: DefaultKeepaliveInterval, idleTimeout: controlIdleTimeout,
		localLimits: defaultLocalLimits}
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

// ServeControlSession serves the postern-control subsystem on s for caller and ends the
// session with exit status 0 when the client closed its side, 1 on a protocol or transport
// error. The caller sees only its own identity's markers, unless it logged in as the account
// the hostagent runs as (which could read the marker store anyway). Checkpoints are refused
// over SSH. Executor.Control calls it.
func ServeControlSession(ctx context.Context, s gliderssh.Session, caller Identity, b controlBackend, logger *slog.Logger) {
	serveControlSession(ctx, s, sshCaller(caller, ownAccountName()), newControlServer(b, logger))
}

func sshCaller(caller Identity, own string) controlCaller {
	c := controlCaller{transport: "ssh", scope: &caller, operator: true}
	if own != "" && caller.Account == own {
		c.scope = nil
	}
	return c
}

func serveControlSession(ctx context.Context, s gliderssh.Session, caller controlCaller, cs *controlServer) {
	code := 0
	if err := cs.serve(ctx, s, caller); err != nil {
		cs.logger.Info("control session ended", "account", caller.account(), "err", err)
		code = 1
	}
	s.Exit(code)
}

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
		line, err := hostproto.ReadControlLine(br, hostproto.MaxControlLine)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, hostproto.ErrLineTooLong):
			err = fmt.Errorf("request line longer than %d bytes", hostproto.MaxControlLine)
			out.send(hostproto.NewErrorLine(hostproto.CodeBadRequest, err.Error()))
			return err
		case err != nil:
			return fmt.Errorf("read request: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		req, err := DecodeControlRequest(line)
		if err != nil {
			if err := out.send(hostproto.NewErrorLine(hostproto.CodeBadRequest, err.Error())); err != nil {
				return err
			}
			continue
		}
		if err := cs.handle(ctx, out, caller, req); err != nil {
			return err
		}
	}
}

// handle serves one request: progress lines while it runs, then its final line. It returns
// an error only when the connection cannot go on.
func (cs *controlServer) handle(ctx context.Context, out *controlWriter, caller controlCaller, req hostproto.ControlRequest) error {
	if err := caller.permits(req.Op); err != nil {
		return out.send(hostproto.NewErrorLine(hostproto.CodeForbidden, err.Error()))
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
func (cs *controlServer) errorFor(caller controlCaller, req hostproto.ControlRequest, err error) hostproto.ErrorLine {
	if !caller.operator && (errors.Is(err, markers.ErrNotFound) || errors.Is(err, hostproto.ErrNotRunning) || errors.Is(err, ErrNotYourProcess)) {
		// A peer that is not an operator learns nothing about ids that are not its own.
		return hostproto.NewErrorLine(hostproto.CodeForbidden, fmt.Sprintf("%s refused: this process is not part of a running execution %s", req.Op, req.ID))
	}
	switch {
	case errors.Is(err, hostproto.ErrBadControlRequest):
		return hostproto.NewErrorLine(hostproto.CodeBadRequest, err.Error())
	case errors.Is(err, markers.ErrNotFound):
		return hostproto.NewErrorLine(hostproto.CodeNotFound, err.Error())
	case errors.Is(err, hostproto.ErrNotRunning):
		return hostproto.NewErrorLine(hostproto.CodeNotRunning, err.Error())
	case errors.Is(err, ErrNotYourProcess), errors.Is(err, hostproto.ErrForbidden):
		return hostproto.NewErrorLine(hostproto.CodeForbidden, err.Error())
	case errors.Is(err, hostproto.ErrReloadRefused):
		return hostproto.NewErrorLine(hostproto.CodeReloadRefused, err.Error())
	}
	cs.logger.Error("control request failed", "op", req.Op, "execution_id", req.ID,
		"transport", caller.transport, "account", caller.account(), "err", err)
	return hostproto.NewErrorLine(hostproto.CodeInternal, err.Error())
}

// run performs req and returns its final line.
func (cs *controlServer) run(ctx context.Context, out *controlWriter, caller controlCaller, req hostproto.ControlRequest) (any, error) {
	b := cs.backend
	switch req.Op {
	case hostproto.OpStatus:
		return cs.status(caller, req.IDs)
	case hostproto.OpList:
		return cs.list(caller, req)
	case hostproto.OpAttach:
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
				if err := out.send(hostproto.ChunkLine{Stream: stream, Offset: off, Data: data[:n]}); err != nil {
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
		return hostproto.FinalReply{Final: WireMarker(final)}, nil
	case hostproto.OpCancel:
		if _, err := cs.visible(caller, req.ID); err != nil {
			return nil, err
		}
		rec, err := b.Cancel(ctx, req.ID)
		if err != nil {
			return nil, err
		}
		return hostproto.MarkerReply{Marker: WireMarker(rec)}, nil
	case hostproto.OpCheckpoint, hostproto.OpValidated:
		rec, err := b.Checkpoint(ctx, req.ID, caller.peerPID, req.Note, req.Op == hostproto.OpValidated)
		if err != nil {
			return nil, err
		}
		return hostproto.MarkerReply{Marker: WireMarker(rec)}, nil
	case hostproto.OpExport:
		ew := &exportWriter{out: out, digest: sha256.New()}
		if err := b.Export(ew); err != nil {
			return nil, err
		}
		if err := ew.flush(); err != nil {
			return nil, err
		}
		return hostproto.ExportEndReply{ExportEnd: hostproto.ExportSummary{Bytes: ew.total, SHA256: hex.EncodeToString(ew.digest.Sum(nil))}}, nil
	case hostproto.OpReload:
		r, ok := b.(reloader)
		if !ok {
			return nil, fmt.Errorf("%w: this agent cannot reload its config", hostproto.ErrForbidden)
		}
		res, err := r.Reload(ctx, fmt.Sprintf("control socket: uid %d, pid %d", caller.peerUID, caller.peerPID))
		if err != nil {
			return nil, err
		}
		return hostproto.ReloadReply{Reload: res}, nil
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

func (cs *controlServer) status(caller controlCaller, ids []string) (hostproto.StatusReply, error) {
	reply := hostproto.StatusReply{Markers: []*hostproto.Marker{}, Missing: []string{}, MarkerRetentionS: int64(cs.backend.MarkerRetention() / time.Second), Version: version.String()}
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
			return hostproto.StatusReply{}, err
		default:
			reply.Markers = append(reply.Markers, WireMarker(rec))
		}
	}
	return reply, nil
}

// list returns one page. Filters the store has no index for (operation key, the caller's
// account) are applied here, reading backend pages no larger than what is left to fill, so
// the backend's cursor always points right after the last marker returned or skipped.
func (cs *controlServer) list(caller controlCaller, req hostproto.ControlRequest) (hostproto.ListReply, error) {
	q := markers.Query{State: markers.State(req.State), Since: req.Since, Until: req.Until, Newest: req.Newest, Limit: req.Limit, Cursor: req.Cursor}
	if q.Limit == 0 {
		q.Limit = 100
	}
	limit := q.Limit
	keep := func(r *markers.Record) bool {
		return caller.sees(r) && (req.OperationKey == "" || r.OperationKey == req.OperationKey)
	}
	reply := hostproto.ListReply{Markers: []*hostproto.Marker{}}
	for calls := 0; ; calls++ {
		q.Limit = limit - len(reply.Markers)
		page, next, err := cs.backend.List(q)
		if err != nil {
			return hostproto.ListReply{}, err
		}
		for _, r := range page {
			if keep(r) {
				reply.Markers = append(reply.Markers, WireMarker(r))
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
			if err := cw.write([]byte(hostproto.KeepaliveLine)); err != nil {
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
	err := ew.out.send(hostproto.ExportLine{Export: ew.buf})
	ew.buf = ew.buf[:0]
	return err
}
