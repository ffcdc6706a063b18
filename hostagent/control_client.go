package hostagent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/postern-dev/postern/markers"
)

// maxReplyLine bounds one response line the client reads: a status or list page of up to
// 1000 markers.
const maxReplyLine = 64 << 20

// ErrControlProtocol: the server sent something the protocol does not allow; the client is
// closed.
var ErrControlProtocol = errors.New("hostagent: control protocol violation")

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

// DialLocalControl connects to the local control socket at path.
func DialLocalControl(ctx context.Context, path string) (*ControlClient, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("hostagent: dial control socket: %w", err)
	}
	return NewControlClient(c), nil
}

// Close closes the connection.
func (c *ControlClient) Close() error { return c.rwc.Close() }

// controlReply is any response line, as the client decodes it.
type controlReply struct {
	Keepalive bool              `json:"keepalive"`
	Error     *ControlError     `json:"error"`
	Markers   []*markers.Record `json:"markers"`
	Missing   []string          `json:"missing"`
	Next      string            `json:"next"`
	Marker    *markers.Record   `json:"marker"`
	Stream    string            `json:"stream"`
	Offset    int64             `json:"offset"`
	Data      []byte            `json:"data"`
	Final     *markers.Record   `json:"final"`
	Export    []byte            `json:"export"`
	ExportEnd *ExportSummary    `json:"export_end"`
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
		b, err := readControlLine(c.br, maxReplyLine)
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
func (c *ControlClient) Status(ctx context.Context, ids []string) (found []*markers.Record, missing []string, err error) {
	err = c.roundTrip(ctx, ControlRequest{Op: OpStatus, IDs: ids}, func(r *controlReply) (bool, error) {
		found, missing = r.Markers, r.Missing
		return true, nil
	})
	return found, missing, err
}

// ControlListQuery selects markers for List; see markers.Query. OperationKey filters on the
// server.
type ControlListQuery struct {
	State        markers.State
	Since, Until time.Time
	OperationKey string
	Newest       bool
	Limit        int
	Cursor       string
}

// List returns one page of markers and the cursor of the next ("" after the last page). A
// page may hold fewer than Limit markers even when more follow.
func (c *ControlClient) List(ctx context.Context, q ControlListQuery) (page []*markers.Record, next string, err error) {
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
func (c *ControlClient) Attach(ctx context.Context, id string, stdoutOffset, stderrOffset int64, emit func(stream string, offset int64, data []byte) error) (*markers.Record, error) {
	next := map[string]int64{"stdout": stdoutOffset, "stderr": stderrOffset}
	var final *markers.Record
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
func (c *ControlClient) Cancel(ctx context.Context, id string) (*markers.Record, error) {
	return c.markerOp(ctx, ControlRequest{Op: OpCancel, ID: id})
}

// Checkpoint records note on the running execution id; only the execution's own processes
// may, over the local socket.
func (c *ControlClient) Checkpoint(ctx context.Context, id, note string) (*markers.Record, error) {
	return c.markerOp(ctx, ControlRequest{Op: OpCheckpoint, ID: id, Note: note})
}

// Validated records that the running execution id validated its own work.
func (c *ControlClient) Validated(ctx context.Context, id string) (*markers.Record, error) {
	return c.markerOp(ctx, ControlRequest{Op: OpValidated, ID: id})
}

func (c *ControlClient) markerOp(ctx context.Context, req ControlRequest) (*markers.Record, error) {
	var rec *markers.Record
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
