package hostproto

// The postern-control protocol: JSON lines, which the hostagent serves over the SSH subsystem
// of that name and over its local unix socket. This file holds the wire types both sides
// share (requests, reply lines) and the calling side (ControlClient); the hostagent package
// holds the server.
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
//	{"keepalive":true}                                   any op, after 15 s (the server's default) without another line
//	{"stream":"stdout","offset":N,"data":"<base64>"}     attach: output bytes N.. of the stream
//	{"export":"<base64>"}                                export: the next bytes of the JSONL log
//
// Final lines, by op:
//
//	status      {"markers":[…],"missing":["ex_…",…],"marker_retention_s":N}
//
// marker_retention_s is how long the host keeps a finished marker (seconds). A missing id
// proves that the execution never started on this host only if it is younger than that.
//	list        {"markers":[…],"next":"<cursor>"}         next is absent on the last page
//	attach      {"final":<marker>}
//	cancel      {"marker":<marker>}
//	checkpoint  {"marker":<marker>}
//	validated   {"marker":<marker>}
//	export      {"export_end":{"bytes":N,"sha256":"<hex>"}} size and digest of the whole log
//	reload      {"reload":{"config":"<file>","digest":"<hex>","changed":["<key>",…]}}  local operators only
//	any op      {"error":{"code":"…","message":"…"}}
//
// The export is carried as base64 chunks rather than as embedded JSON lines because the hash
// chain covers the exact bytes of every event line; the export_end digest lets the client
// tell a complete log from a connection cut in the middle.

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
	"net"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	gossh "golang.org/x/crypto/ssh"
)

// ControlSubsystem is the SSH subsystem that serves the protocol.
const ControlSubsystem = "postern-control"

// Bounds of the protocol.
const (
	// MaxControlLine bounds one request line, newline excluded.
	MaxControlLine = 64 << 10
	// MaxStatusIDs bounds the ids of one status request.
	MaxStatusIDs = 1000
	// MaxCheckpointNote bounds a checkpoint note, in bytes.
	MaxCheckpointNote = 1 << 10
	// MaxOperationKeyLen bounds an operation key, in bytes: the list filter here, and
	// POSTERN_OPERATION_KEY on exec.
	MaxOperationKeyLen = 256

	maxListLimit = 1000
	maxCursorLen = 1024
	// maxReplyLine bounds one response line the client reads: a status or list page of up
	// to 1000 markers.
	maxReplyLine = 64 << 20
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
	// OpReload re-reads the hostagent's config file and applies what may change live; only
	// operators on the local socket may ask (never over SSH).
	OpReload = "reload"
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
	// CodeReloadRefused: the config file has problems, or changes settings that need a
	// restart; nothing was changed. The message says which.
	CodeReloadRefused = "reload_refused"
)

// Errors a ControlError unwraps to, so callers can use errors.Is on a client's error; the
// hostagent's server answers with the code of each.
var (
	// ErrNotFound: the host has no marker of the execution that the caller may see.
	ErrNotFound = errors.New("hostagent: no such marker")
	// ErrBadControlRequest: the request is malformed or out of bounds.
	ErrBadControlRequest = errors.New("hostagent: bad control request")
	// ErrForbidden: the caller may not perform this operation.
	ErrForbidden = errors.New("hostagent: forbidden")
	// ErrControlBusy: the server refused the connection for lack of capacity.
	ErrControlBusy = errors.New("hostagent: control socket busy")
	// ErrNotRunning: the execution is not running (it has ended, or never ran here).
	ErrNotRunning = errors.New("hostagent: execution is not running")
	// ErrReloadRefused: a reload changed nothing, for the reason in the message.
	ErrReloadRefused = errors.New("hostagent: reload refused")
)

// ErrControlProtocol: the server sent something the protocol does not allow; the client is
// closed.
var ErrControlProtocol = errors.New("hostagent: control protocol violation")

// ErrLineTooLong: a line exceeded the bound ReadControlLine was given.
var ErrLineTooLong = errors.New("postern-control: line too long")

// ControlError is an error reported by the control server.
type ControlError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *ControlError) Error() string { return "postern-control: " + e.Code + ": " + e.Message }

// Unwrap maps the code to the sentinel a caller branches on: not_found is ErrNotFound,
// not_running ErrNotRunning, forbidden ErrForbidden, bad_request
// ErrBadControlRequest, busy ErrControlBusy.
func (e *ControlError) Unwrap() error {
	switch e.Code {
	case CodeNotFound:
		return ErrNotFound
	case CodeNotRunning:
		return ErrNotRunning
	case CodeForbidden:
		return ErrForbidden
	case CodeBadRequest:
		return ErrBadControlRequest
	case CodeBusy:
		return ErrControlBusy
	case CodeReloadRefused:
		return ErrReloadRefused
	}
	return nil
}

// ControlRequest is one request line. An op takes only the fields listed next to them
// below; the server refuses a request with any other field.
type ControlRequest struct {
	Op string `json:"op"`
	// IDs: status.
	IDs []string `json:"ids,omitempty"`
	// ID: attach, cancel, checkpoint, validated.
	ID string `json:"id,omitempty"`
	// List filters: markers in State, created in [Since, Until), newest first if Newest, at
	// most Limit, after Cursor (the previous page's next).
	State        MarkerState `json:"state,omitempty"`
	Since        time.Time   `json:"since,omitzero"`
	Until        time.Time   `json:"until,omitzero"`
	OperationKey string      `json:"operation_key,omitempty"`
	Newest       bool        `json:"newest,omitempty"`
	Limit        int         `json:"limit,omitempty"`
	Cursor       string      `json:"cursor,omitempty"`
	// Attach: where to resume each stream.
	StdoutOffset int64 `json:"stdout_offset,omitempty"`
	StderrOffset int64 `json:"stderr_offset,omitempty"`
	// Note: checkpoint.
	Note string `json:"note,omitempty"`
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadControlRequest, fmt.Sprintf(format, args...))
}

// Validate checks the values of the fields req.Op takes; every error wraps
// ErrBadControlRequest. The client checks before sending, the server after decoding.
func (req ControlRequest) Validate() error {
	validID := func() error {
		if !ValidExecutionID(req.ID) {
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
			if !ValidExecutionID(id) {
				return badRequest("invalid execution id %q", boundForLog(id))
			}
		}
	case OpList:
		if req.State != "" && !req.State.Known() {
			return badRequest("unknown state %q", boundForLog(string(req.State)))
		}
		if req.Limit < 0 || req.Limit > maxListLimit {
			return badRequest("limit %d: want 0..%d", req.Limit, maxListLimit)
		}
		if _, err := hex.DecodeString(req.Cursor); err != nil || len(req.Cursor) > maxCursorLen {
			return badRequest("invalid cursor")
		}
		if len(req.OperationKey) > MaxOperationKeyLen || bytes.IndexByte([]byte(req.OperationKey), 0) >= 0 {
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
	case OpExport, OpReload:
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

// boundForLog truncates peer-chosen strings before they reach an error message or a log.
func boundForLog(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// ExportSummary closes an export: the size and SHA-256 of the whole JSONL log.
type ExportSummary struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Reply lines, one per line, as the server writes them (the framing above says which op gets
// which). The client reads any line into controlReply, which has every one's fields.
type (
	ErrorLine struct {
		Error ControlError `json:"error"`
	}
	StatusReply struct {
		Markers          []*Marker `json:"markers"`
		Missing          []string  `json:"missing"`
		MarkerRetentionS int64     `json:"marker_retention_s"`
		// Version is the hostagent's build (internal/version), for the bastion's doctor.
		Version string `json:"version,omitempty"`
	}
	ListReply struct {
		Markers []*Marker `json:"markers"`
		Next    string    `json:"next,omitempty"`
	}
	MarkerReply struct {
		Marker *Marker `json:"marker"`
	}
	FinalReply struct {
		Final *Marker `json:"final"`
	}
	ChunkLine struct {
		Stream string `json:"stream"`
		Offset int64  `json:"offset"`
		Data   []byte `json:"data"`
	}
	ExportLine struct {
		Export []byte `json:"export"`
	}
	ExportEndReply struct {
		ExportEnd ExportSummary `json:"export_end"`
	}
	ReloadReply struct {
		Reload ReloadResult `json:"reload"`
	}
)

// ReloadResult is what a reload did: the config file it re-read (and the hex SHA-256 of what
// it read) and the keys (TOML names) whose values changed, sorted; none when the file says
// what the agent already runs with.
type ReloadResult struct {
	Config  string   `json:"config"`
	Digest  string   `json:"digest,omitempty"`
	Changed []string `json:"changed"`
}

// KeepaliveLine is the progress line a server sends while a request runs quietly.
const KeepaliveLine = `{"keepalive":true}` + "\n"

// NewErrorLine is the error reply of code with message.
func NewErrorLine(code, message string) ErrorLine {
	return ErrorLine{Error: ControlError{Code: code, Message: message}}
}

// ReadControlLine returns the next line without its newline; a last line without a newline
// is returned as is. A line longer than max bytes (newline excluded) is ErrLineTooLong.
func ReadControlLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max+1 || len(line) == max+1 && line[max] != '\n' {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, max)
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

// ControlClient speaks postern-control over one connection (an SSH subsystem channel or the
// local socket). Requests are served one at a time; methods are safe for concurrent use and
// wait their turn. When a method's ctx ends mid-request, or a stream callback fails, the
// connection is closed (the server may still be sending) and every later call fails.
type ControlClient struct {
	mu     sync.Mutex // serializes requests; guards broken
	rwc    io.ReadWriteCloser
	br     *bufio.Reader
	broken error
}

// NewControlClient returns a client on rwc; Close closes rwc.
func NewControlClient(rwc io.ReadWriteCloser) *ControlClient {
	return &ControlClient{rwc: rwc, br: bufio.NewReaderSize(rwc, 64<<10)}
}

// DialLocalControl connects to the hostagent's local control socket at path.
func DialLocalControl(ctx context.Context, path string) (*ControlClient, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("hostagent: dial control socket: %w", err)
	}
	return NewControlClient(c), nil
}

// DialControl opens the ControlSubsystem on a session channel of conn (a *gossh.Client
// will do) and returns a client on it. Close closes the channel, which ends the subsystem
// on the hostagent; conn stays open.
func DialControl(conn gossh.Conn) (*ControlClient, error) {
	ch, reqs, err := conn.OpenChannel("session", nil)
	if err != nil {
		return nil, fmt.Errorf("hostagent: open control session: %w", err)
	}
	// The server's only requests on this channel are exit-status and the like: nothing the
	// client acts on. DiscardRequests ends when the channel closes.
	go gossh.DiscardRequests(reqs)
	sub := struct{ Name string }{ControlSubsystem}
	ok, err := ch.SendRequest("subsystem", true, gossh.Marshal(&sub))
	if err == nil && !ok {
		err = errors.New("refused")
	}
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("hostagent: request subsystem %s: %w", ControlSubsystem, err)
	}
	return NewControlClient(ch), nil
}

// Close closes the connection.
func (c *ControlClient) Close() error { return c.rwc.Close() }

// controlReply is any response line, as the client decodes it.
type controlReply struct {
	Keepalive bool           `json:"keepalive"`
	Error     *ControlError  `json:"error"`
	Markers   []*Marker      `json:"markers"`
	Missing   []string       `json:"missing"`
	Retention int64          `json:"marker_retention_s"`
	Version   string         `json:"version"`
	Next      string         `json:"next"`
	Marker    *Marker        `json:"marker"`
	Stream    string         `json:"stream"`
	Offset    int64          `json:"offset"`
	Data      []byte         `json:"data"`
	Final     *Marker        `json:"final"`
	Export    []byte         `json:"export"`
	ExportEnd *ExportSummary `json:"export_end"`
	Reload    *ReloadResult  `json:"reload"`
}

// roundTrip sends req and hands every non-keepalive line to onLine until onLine reports the
// final line or an error line arrives.
func (c *ControlClient) roundTrip(ctx context.Context, req ControlRequest, onLine func(*controlReply) (final bool, err error)) (err error) {
	if err := req.Validate(); err != nil {
		return err
	}
	line, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return c.broken
	}
	interrupted := context.AfterFunc(ctx, func() { c.rwc.Close() })
	defer func() {
		if !interrupted() {
			err = context.Cause(ctx)
			c.broken = fmt.Errorf("hostagent: control connection closed after an interrupted request: %w", err)
		}
	}()
	if _, err := c.rwc.Write(append(line, '\n')); err != nil {
		return c.breakWith(fmt.Errorf("send %s request: %w", req.Op, err))
	}
	for {
		b, err := ReadControlLine(c.br, maxReplyLine)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return c.breakWith(fmt.Errorf("read %s reply: %w", req.Op, err))
		}
		var reply controlReply
		if err := json.Unmarshal(b, &reply); err != nil {
			return c.breakWith(fmt.Errorf("%w: %s reply: %v", ErrControlProtocol, req.Op, err))
		}
		switch {
		case reply.Keepalive:
			continue
		case reply.Error != nil:
			return reply.Error
		}
		final, err := onLine(&reply)
		if err != nil {
			return c.breakWith(err)
		}
		if final {
			return nil
		}
	}
}

// breakWith closes the connection, whose stream is no longer in step with the requests.
func (c *ControlClient) breakWith(err error) error {
	c.broken = err
	c.rwc.Close()
	return err
}

func protocolError(op, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrControlProtocol, op, fmt.Sprintf(format, args...))
}

// Status returns the markers of ids the caller may see, and the ids it got no marker for.
func (c *ControlClient) Status(ctx context.Context, ids []string) (found []*Marker, missing []string, err error) {
	r, err := c.StatusReport(ctx, ids)
	return r.Markers, r.Missing, err
}

// StatusReport is a host's answer to a status request.
type StatusReport struct {
	// Markers are those of the requested ids the caller may see; Missing the ids without.
	Markers []*Marker
	Missing []string
	// MarkerRetention is how long the host keeps a finished marker: a missing id proves the
	// execution never started there only if it is younger than this. Zero if the host did not
	// say.
	MarkerRetention time.Duration
	// Version is the hostagent's build, as it reports it ("" from an older one).
	Version string
}

// StatusReport is Status with the host's marker retention.
func (c *ControlClient) StatusReport(ctx context.Context, ids []string) (StatusReport, error) {
	var out StatusReport
	err := c.roundTrip(ctx, ControlRequest{Op: OpStatus, IDs: ids}, func(r *controlReply) (bool, error) {
		if r.Retention < 0 {
			return false, protocolError(OpStatus, "negative marker retention %d", r.Retention)
		}
		out = StatusReport{Markers: r.Markers, Missing: r.Missing, MarkerRetention: time.Duration(min(r.Retention, maxRetentionS)) * time.Second,
			Version: boundedText(r.Version, maxVersionBytes)}
		return true, nil
	})
	return out, err
}

// maxVersionBytes bounds a reported version.
const maxVersionBytes = 200

// boundedText is s cut to at most n bytes of printable text (the peer is not trusted to send
// text fit for a terminal).
func boundedText(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// maxRetentionS bounds a reported retention (about 292 years fit a time.Duration).
const maxRetentionS = 100 * 365 * 24 * 3600

// ControlListQuery selects markers for List (see the list fields of ControlRequest).
type ControlListQuery struct {
	State        MarkerState
	Since, Until time.Time
	OperationKey string
	Newest       bool
	Limit        int
	Cursor       string
}

// List returns one page of markers and the cursor of the next ("" after the last page). A
// page may hold fewer than Limit markers even when more follow.
func (c *ControlClient) List(ctx context.Context, q ControlListQuery) (page []*Marker, next string, err error) {
	req := ControlRequest{Op: OpList, State: q.State, Since: q.Since, Until: q.Until, OperationKey: q.OperationKey,
		Newest: q.Newest, Limit: q.Limit, Cursor: q.Cursor}
	err = c.roundTrip(ctx, req, func(r *controlReply) (bool, error) {
		page, next = r.Markers, r.Next
		return true, nil
	})
	return page, next, err
}

// Attach streams the output of execution id from the given offsets to emit until the
// execution has ended and all its stored output was sent, and returns the final marker.
// emit gets each chunk with the offset of its first byte in its stream.
func (c *ControlClient) Attach(ctx context.Context, id string, stdoutOffset, stderrOffset int64, emit func(stream string, offset int64, data []byte) error) (*Marker, error) {
	next := map[string]int64{"stdout": stdoutOffset, "stderr": stderrOffset}
	var final *Marker
	err := c.roundTrip(ctx, ControlRequest{Op: OpAttach, ID: id, StdoutOffset: stdoutOffset, StderrOffset: stderrOffset},
		func(r *controlReply) (bool, error) {
			if r.Final != nil {
				final = r.Final
				return true, nil
			}
			want, ok := next[r.Stream]
			if !ok || r.Offset != want {
				return false, protocolError(OpAttach, "chunk of stream %q at offset %d, want offset %d", r.Stream, r.Offset, want)
			}
			next[r.Stream] += int64(len(r.Data))
			return false, emit(r.Stream, r.Offset, r.Data)
		})
	return final, err
}

// Cancel stops a running execution and returns its marker once it has ended.
func (c *ControlClient) Cancel(ctx context.Context, id string) (*Marker, error) {
	return c.markerOp(ctx, ControlRequest{Op: OpCancel, ID: id})
}

// Checkpoint records note on the running execution id; only the execution's own processes
// may, over the local socket.
func (c *ControlClient) Checkpoint(ctx context.Context, id, note string) (*Marker, error) {
	return c.markerOp(ctx, ControlRequest{Op: OpCheckpoint, ID: id, Note: note})
}

// Validated records that the running execution id validated its own work.
func (c *ControlClient) Validated(ctx context.Context, id string) (*Marker, error) {
	return c.markerOp(ctx, ControlRequest{Op: OpValidated, ID: id})
}

func (c *ControlClient) markerOp(ctx context.Context, req ControlRequest) (*Marker, error) {
	var rec *Marker
	err := c.roundTrip(ctx, req, func(r *controlReply) (bool, error) {
		if r.Marker == nil {
			return false, protocolError(req.Op, "reply without a marker")
		}
		rec = r.Marker
		return true, nil
	})
	return rec, err
}

// Export writes the hostagent's marker event log (JSONL, as markers.Store.Export writes it)
// to w and checks its size and digest against the server's summary. On error, what was
// written to w is incomplete.
func (c *ControlClient) Export(ctx context.Context, w io.Writer) (ExportSummary, error) {
	digest := sha256.New()
	var n int64
	var sum ExportSummary
	err := c.roundTrip(ctx, ControlRequest{Op: OpExport}, func(r *controlReply) (bool, error) {
		if r.ExportEnd != nil {
			sum = *r.ExportEnd
			if got := hex.EncodeToString(digest.Sum(nil)); sum.Bytes != n || sum.SHA256 != got {
				return false, protocolError(OpExport, "received %d bytes with SHA-256 %s, the server sent %d bytes with %s", n, got, sum.Bytes, sum.SHA256)
			}
			return true, nil
		}
		if r.Export == nil {
			return false, protocolError(OpExport, "unexpected line")
		}
		digest.Write(r.Export)
		n += int64(len(r.Export))
		if _, err := w.Write(r.Export); err != nil {
			return false, fmt.Errorf("export: write: %w", err)
		}
		return false, nil
	})
	return sum, err
}

// Reload asks the hostagent to re-read its config file and apply what may change without a
// restart. A config with problems, or one that changes a setting only a restart applies, is
// ErrReloadRefused (a *ControlError whose message says why) and changes nothing.
func (c *ControlClient) Reload(ctx context.Context) (ReloadResult, error) {
	var res ReloadResult
	err := c.roundTrip(ctx, ControlRequest{Op: OpReload}, func(r *controlReply) (bool, error) {
		if r.Reload == nil {
			return false, protocolError(OpReload, "reply without a reload result")
		}
		res = *r.Reload
		return true, nil
	})
	return res, err
}
