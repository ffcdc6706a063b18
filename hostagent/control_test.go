package hostagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/markers"
)

// fakeBackend is the executor as the control protocol sees it, on a real marker store.
// Output lives in memory; an execution ends when the test says so.
type fakeBackend struct {
	store *testutil.Store

	mu      sync.Mutex // guards outputs and owners
	outputs map[string]*fakeOutput
	// owners maps an execution to the one pid whose process tree it is.
	owners map[string]int
}

type fakeOutput struct {
	streams map[string][]byte
	ended   bool
	changed chan struct{} // closed and replaced on every change
}

var _ controlBackend = (*fakeBackend)(nil)

func newFakeBackend(t *testing.T) *fakeBackend {
	t.Helper()
	return &fakeBackend{
		store:   testutil.OpenStore(t, markers.HostGraph),
		outputs: map[string]*fakeOutput{},
		owners:  map[string]int{},
	}
}

// testIdentity is account logged in with a key of its own.
func testIdentity(account string) Identity {
	return Identity{Account: account, Fingerprint: "SHA256:key-of-" + account}
}

// start creates a running execution of account's testIdentity.
func (f *fakeBackend) start(t *testing.T, account, opKey string) string {
	t.Helper()
	return f.startAs(t, testIdentity(account), opKey)
}

// startAs creates a running execution of owner.
func (f *fakeBackend) startAs(t *testing.T, owner Identity, opKey string) string {
	t.Helper()
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rec := &markers.Record{ID: id, Account: owner.Account, Actor: owner.Actor(), OperationKey: opKey, Command: []string{"echo", "hi"}}
	if _, err := f.store.Create(ctx, rec); err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := f.store.Transition(ctx, id, markers.Started, markers.Running, "", func(r *markers.Record) error {
		r.PID = 4242
		return nil
	}); err != nil {
		t.Fatalf("running: %v", err)
	}
	f.mu.Lock()
	f.outputs[id] = &fakeOutput{streams: map[string][]byte{}, changed: make(chan struct{})}
	f.mu.Unlock()
	return id
}

func (f *fakeBackend) changeLocked(id string, change func(o *fakeOutput)) {
	o := f.outputs[id]
	change(o)
	close(o.changed)
	o.changed = make(chan struct{})
}

func (f *fakeBackend) write(id, stream, data string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changeLocked(id, func(o *fakeOutput) { o.streams[stream] = append(o.streams[stream], data...) })
}

// exit ends execution id with code.
func (f *fakeBackend) exit(t *testing.T, id string, code int) {
	t.Helper()
	if _, err := f.store.Transition(context.Background(), id, markers.Running, markers.Exited, "", func(r *markers.Record) error {
		r.ExitCode = &code
		return nil
	}); err != nil {
		t.Fatalf("exit: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changeLocked(id, func(o *fakeOutput) { o.ended = true })
}

func (f *fakeBackend) setOwner(id string, pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.owners[id] = pid
}

func (f *fakeBackend) Get(id string) (*markers.Record, error) { return f.store.Get(id) }

func (f *fakeBackend) List(q markers.Query) ([]*markers.Record, string, error) {
	return f.store.List(q)
}

func (f *fakeBackend) Export(w io.Writer) error { return f.store.Export(w) }

func (f *fakeBackend) MarkerRetention() time.Duration { return 720 * time.Hour }

func (f *fakeBackend) Attach(ctx context.Context, id string, stdoutOffset, stderrOffset int64, emit func(string, []byte) error) (*markers.Record, error) {
	if _, err := f.store.Get(id); err != nil {
		return nil, err
	}
	sent := map[string]int64{"stdout": stdoutOffset, "stderr": stderrOffset}
	for {
		f.mu.Lock()
		o := f.outputs[id]
		pending := map[string][]byte{}
		for stream, off := range sent {
			if data := o.streams[stream]; int64(len(data)) > off {
				pending[stream] = slices.Clone(data[off:])
			}
		}
		ended, changed := o.ended, o.changed
		f.mu.Unlock()
		for _, stream := range []string{"stdout", "stderr"} {
			if data, ok := pending[stream]; ok {
				if err := emit(stream, data); err != nil {
					return nil, err
				}
				sent[stream] += int64(len(data))
			}
		}
		switch {
		case len(pending) > 0:
			continue // look again before waiting: more may have come
		case ended:
			return f.store.Get(id)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (f *fakeBackend) Cancel(ctx context.Context, id string) (*markers.Record, error) {
	rec, err := f.store.Get(id)
	if err != nil {
		return nil, err
	}
	if rec.State != markers.Running {
		return nil, hostproto.ErrNotRunning
	}
	rec, err = f.store.Transition(ctx, id, markers.Running, markers.Cancelled, "cancelled", func(r *markers.Record) error {
		r.Signal = "TERM"
		return nil
	})
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.changeLocked(id, func(o *fakeOutput) { o.ended = true })
	return rec, nil
}

func (f *fakeBackend) Checkpoint(ctx context.Context, id string, peerPID int, note string, validated bool) (*markers.Record, error) {
	rec, err := f.store.Get(id)
	if err != nil {
		return nil, err
	}
	if rec.State != markers.Running {
		return nil, hostproto.ErrNotRunning
	}
	f.mu.Lock()
	owner := f.owners[id]
	f.mu.Unlock()
	if peerPID != owner {
		return nil, fmt.Errorf("%w: pid %d", ErrNotYourProcess, peerPID)
	}
	return f.store.Update(ctx, id, "checkpoint", func(r *markers.Record) error {
		if validated {
			r.Validated = true
		} else {
			r.Checkpoints = append(r.Checkpoints, markers.Checkpoint{At: time.Now().UTC(), Note: note})
		}
		return nil
	})
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// socketPath is a fresh unix socket path, short enough for sun_path.
func socketPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(sockdir.New(t), "control.sock")
}

// serveLocalForTest runs the local socket server until the test ends.
func serveLocalForTest(t *testing.T, b controlBackend, keepalive time.Duration) string {
	t.Helper()
	path := socketPath(t)
	ln, err := ListenLocal(path)
	if err != nil {
		t.Fatalf("ListenLocal: %v", err)
	}
	cs := newControlServer(b, testLogger(t))
	cs.keepalive = keepalive
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.serveLocal(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveLocal: %v", err)
		}
	})
	return path
}

// serveAsForTest serves every connection on a unix socket as caller (the transport-neutral
// core, for callers the local socket does not produce, such as scoped SSH accounts).
func serveAsForTest(t *testing.T, b controlBackend, caller controlCaller) string {
	t.Helper()
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	cs := newControlServer(b, testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				defer stop()
				cs.serve(ctx, c, caller)
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return path
}

func dialClient(t *testing.T, path string) *hostproto.ControlClient {
	t.Helper()
	c, err := hostproto.DialLocalControl(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawConn speaks the protocol line by line, to check the framing itself.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, line+"\n"); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

// next returns the next response line decoded into a generic map, and its text.
func (r *rawConn) next() (map[string]any, string) {
	r.t.Helper()
	line, err := r.br.ReadString('\n')
	if err != nil {
		r.t.Fatalf("read reply: %v (partial %q)", err, line)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		r.t.Fatalf("reply %q: %v", line, err)
	}
	return m, strings.TrimSpace(line)
}

func errorCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestDecodeControlRequest(t *testing.T) {
	const id = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW"
	tests := []struct {
		name    string
		line    string
		wantErr bool
		want    hostproto.ControlRequest
	}{
		{name: "status", line: `{"op":"status","ids":["` + id + `"]}`, want: hostproto.ControlRequest{Op: hostproto.OpStatus, IDs: []string{id}}},
		{name: "list", line: `{"op":"list","state":"running","since":"2026-01-02T03:04:05Z","operation_key":"m:1","newest":true,"limit":5,"cursor":"ab"}`,
			want: hostproto.ControlRequest{Op: hostproto.OpList, State: hostproto.MarkerRunning, Since: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), OperationKey: "m:1", Newest: true, Limit: 5, Cursor: "ab"}},
		{name: "attach", line: `{"op":"attach","id":"` + id + `","stdout_offset":7,"stderr_offset":0}`, want: hostproto.ControlRequest{Op: hostproto.OpAttach, ID: id, StdoutOffset: 7}},
		{name: "cancel", line: `{"op":"cancel","id":"` + id + `"}`, want: hostproto.ControlRequest{Op: hostproto.OpCancel, ID: id}},
		{name: "export", line: `{"op":"export"}`, want: hostproto.ControlRequest{Op: hostproto.OpExport}},
		{name: "checkpoint", line: `{"op":"checkpoint","id":"` + id + `","note":"schema applied"}`, want: hostproto.ControlRequest{Op: hostproto.OpCheckpoint, ID: id, Note: "schema applied"}},
		{name: "validated", line: `{"op":"validated","id":"` + id + `"}`, want: hostproto.ControlRequest{Op: hostproto.OpValidated, ID: id}},
		{name: "reload", line: `{"op":"reload"}`, want: hostproto.ControlRequest{Op: hostproto.OpReload}},
		{name: "reload with a field", line: `{"op":"reload","id":"` + id + `"}`, wantErr: true},
		{name: "unknown op", line: `{"op":"shell"}`, wantErr: true},
		{name: "missing op", line: `{"id":"` + id + `"}`, wantErr: true},
		{name: "op not a string", line: `{"op":1}`, wantErr: true},
		{name: "unknown field", line: `{"op":"export","force":true}`, wantErr: true},
		{name: "field of another op", line: `{"op":"cancel","id":"` + id + `","note":"x"}`, wantErr: true},
		{name: "field name in other case", line: `{"op":"cancel","ID":"` + id + `"}`, wantErr: true},
		{name: "op name in other case", line: `{"OP":"export"}`, wantErr: true},
		{name: "not an object", line: `["op","export"]`, wantErr: true},
		{name: "null", line: `null`, wantErr: true},
		{name: "trailing data", line: `{"op":"export"} {"op":"export"}`, wantErr: true},
		{name: "bad id", line: `{"op":"cancel","id":"ex_01j3z5v8q4k7m2n9p0r6s8t1vw"}`, wantErr: true},
		{name: "no ids", line: `{"op":"status","ids":[]}`, wantErr: true},
		{name: "too many ids", line: `{"op":"status","ids":[` + strings.Repeat(`"`+id+`",`, hostproto.MaxStatusIDs) + `"` + id + `"]}`, wantErr: true},
		{name: "note too long", line: `{"op":"checkpoint","id":"` + id + `","note":"` + strings.Repeat("x", hostproto.MaxCheckpointNote+1) + `"}`, wantErr: true},
		{name: "note at the limit", line: `{"op":"checkpoint","id":"` + id + `","note":"` + strings.Repeat("x", hostproto.MaxCheckpointNote) + `"}`,
			want: hostproto.ControlRequest{Op: hostproto.OpCheckpoint, ID: id, Note: strings.Repeat("x", hostproto.MaxCheckpointNote)}},
		{name: "note with newline", line: `{"op":"checkpoint","id":"` + id + `","note":"a\nb"}`, wantErr: true},
		{name: "note with escape", line: `{"op":"checkpoint","id":"` + id + `","note":"\u001b[31m"}`, wantErr: true},
		{name: "empty note", line: `{"op":"checkpoint","id":"` + id + `","note":""}`, wantErr: true},
		{name: "negative limit", line: `{"op":"list","limit":-1}`, wantErr: true},
		{name: "limit too large", line: `{"op":"list","limit":1001}`, wantErr: true},
		{name: "unknown state", line: `{"op":"list","state":"accepted"}`, wantErr: true},
		{name: "cursor not hex", line: `{"op":"list","cursor":"zz"}`, wantErr: true},
		{name: "since not RFC 3339", line: `{"op":"list","since":"yesterday"}`, wantErr: true},
		{name: "until before since", line: `{"op":"list","since":"2026-01-02T00:00:00Z","until":"2026-01-01T00:00:00Z"}`, wantErr: true},
		{name: "negative offset", line: `{"op":"attach","id":"` + id + `","stdout_offset":-1}`, wantErr: true},
		{name: "oversized", line: `{"op":"export"}` + strings.Repeat(" ", hostproto.MaxControlLine), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeControlRequest([]byte(tt.line))
			if tt.wantErr {
				if !errors.Is(err, hostproto.ErrBadControlRequest) {
					t.Errorf("err = %v; want hostproto.ErrBadControlRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v; want nil", err)
			}
			gotJSON, _ := json.Marshal(got)
			wantJSON, _ := json.Marshal(tt.want)
			if !bytes.Equal(gotJSON, wantJSON) {
				t.Errorf("got = %s; want %s", gotJSON, wantJSON)
			}
		})
	}
}

func TestControlOperatorOverLocalSocket(t *testing.T) {
	fb := newFakeBackend(t)
	path := serveLocalForTest(t, fb, DefaultKeepaliveInterval)
	c := dialClient(t, path)
	ctx := context.Background()

	a := fb.start(t, "alice", "migration:1")
	b := fb.start(t, "bob", "")
	absent, _ := markers.NewExecutionID(time.Now())

	t.Run("status", func(t *testing.T) {
		found, missing, err := c.Status(ctx, []string{a, absent, b, a})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range found {
			ids = append(ids, r.ID)
		}
		if !slices.Equal(ids, []string{a, b}) || !slices.Equal(missing, []string{absent}) {
			t.Errorf("found %v missing %v; want [%s %s] and [%s]", ids, missing, a, b, absent)
		}
		report, err := c.StatusReport(ctx, []string{absent})
		if err != nil || report.MarkerRetention != fb.MarkerRetention() {
			t.Errorf("status report = %+v, %v; want the host's marker retention %v", report, err, fb.MarkerRetention())
		}
	})

	t.Run("list", func(t *testing.T) {
		tests := []struct {
			name string
			q    hostproto.ControlListQuery
			want []string
		}{
			{name: "all oldest first", q: hostproto.ControlListQuery{}, want: []string{a, b}},
			{name: "newest first", q: hostproto.ControlListQuery{Newest: true}, want: []string{b, a}},
			{name: "running", q: hostproto.ControlListQuery{State: hostproto.MarkerRunning}, want: []string{a, b}},
			{name: "exited", q: hostproto.ControlListQuery{State: hostproto.MarkerExited}, want: nil},
			{name: "operation key", q: hostproto.ControlListQuery{OperationKey: "migration:1"}, want: []string{a}},
			{name: "operation key newest", q: hostproto.ControlListQuery{OperationKey: "migration:1", Newest: true, Limit: 1}, want: []string{a}},
			{name: "since the future", q: hostproto.ControlListQuery{Since: time.Now().Add(time.Hour)}, want: nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var got []string
				q := tt.q
				for {
					page, next, err := c.List(ctx, q)
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range page {
						got = append(got, r.ID)
					}
					if next == "" {
						break
					}
					q.Cursor = next
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("got = %v; want %v", got, tt.want)
				}
			})
		}
	})

	t.Run("paging", func(t *testing.T) {
		page, next, err := c.List(ctx, hostproto.ControlListQuery{Limit: 1})
		if err != nil || len(page) != 1 || page[0].ID != a || next == "" {
			t.Fatalf("first page = %v, next %q, err %v; want [%s] and a cursor", page, next, err, a)
		}
		page, _, err = c.List(ctx, hostproto.ControlListQuery{Limit: 1, Cursor: next})
		if err != nil || len(page) != 1 || page[0].ID != b {
			t.Fatalf("second page = %v, err %v; want [%s]", page, err, b)
		}
	})

	t.Run("checkpoint", func(t *testing.T) {
		fb.setOwner(a, os.Getpid())
		rec, err := c.Checkpoint(ctx, a, "schema applied")
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Checkpoints) != 1 || rec.Checkpoints[0].Note != "schema applied" {
			t.Errorf("checkpoints = %+v; want one \"schema applied\"", rec.Checkpoints)
		}
		rec, err = c.Validated(ctx, a)
		if err != nil || !rec.Validated {
			t.Errorf("validated: %v, %+v", err, rec)
		}
		_, err = c.Checkpoint(ctx, b, "not mine")
		if !errors.Is(err, hostproto.ErrForbidden) {
			t.Errorf("checkpoint of another process tree: %v; want hostproto.ErrForbidden", err)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		rec, err := c.Cancel(ctx, b)
		if err != nil || rec.State != hostproto.MarkerCancelled {
			t.Fatalf("cancel = %+v, %v; want cancelled", rec, err)
		}
		_, err = c.Cancel(ctx, b)
		if !errors.Is(err, hostproto.ErrNotRunning) {
			t.Errorf("second cancel: %v; want hostproto.ErrNotRunning", err)
		}
		_, err = c.Cancel(ctx, absent)
		if !errors.Is(err, hostproto.ErrNotFound) {
			t.Errorf("cancel of an unknown id: %v; want hostproto.ErrNotFound", err)
		}
		_, err = c.Checkpoint(ctx, b, "too late")
		if !errors.Is(err, hostproto.ErrNotRunning) {
			t.Errorf("checkpoint after the end: %v; want hostproto.ErrNotRunning", err)
		}
	})

	t.Run("export verifies", func(t *testing.T) {
		var buf bytes.Buffer
		sum, err := c.Export(ctx, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Bytes != int64(buf.Len()) || sum.Bytes == 0 {
			t.Errorf("summary %+v for %d bytes", sum, buf.Len())
		}
		rep, err := markers.VerifyJSONL(&buf, fb.store.VerifierKey, markers.VerifyOptions{RequireSealed: true})
		if err != nil || !rep.OK {
			t.Errorf("verify export: %v\n%s", err, rep)
		}
	})
}

func TestControlLargeExportIsChunked(t *testing.T) {
	fb := newFakeBackend(t)
	for range 300 {
		fb.start(t, "alice", strings.Repeat("k", 200))
	}
	path := serveLocalForTest(t, fb, DefaultKeepaliveInterval)
	r := dialRaw(t, path)
	r.send(`{"op":"export"}`)
	chunks := 0
	for {
		m, line := r.next()
		if _, ok := m["export"]; ok {
			chunks++
			continue
		}
		if _, ok := m["export_end"]; !ok {
			t.Fatalf("unexpected line %s", line)
		}
		break
	}
	if chunks < 2 {
		t.Errorf("export came in %d chunk(s); want several of at most %d bytes", chunks, controlChunk)
	}
	var buf bytes.Buffer
	if _, err := dialClient(t, path).Export(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	if rep, err := markers.VerifyJSONL(&buf, fb.store.VerifierKey, markers.VerifyOptions{}); err != nil || !rep.OK {
		t.Errorf("verify: %v %s", err, rep)
	}
}

func TestControlAttachOffsetsAndKeepalive(t *testing.T) {
	fb := newFakeBackend(t)
	id := fb.start(t, "alice", "")
	fb.write(id, "stdout", "hello world\n")
	fb.write(id, "stderr", "warn\n")
	path := serveLocalForTest(t, fb, 20*time.Millisecond)

	r := dialRaw(t, path)
	r.send(`{"op":"attach","id":"` + id + `","stdout_offset":6,"stderr_offset":5}`)
	// Nothing new on stderr (offset 5 is its end); stdout from byte 6.
	if _, line := r.next(); line != `{"stream":"stdout","offset":6,"data":"d29ybGQK"}` {
		t.Fatalf("first line = %s; want stdout from offset 6 (\"world\\n\")", line)
	}
	// While nothing happens, keepalives flow.
	if m, line := r.next(); m["keepalive"] != true {
		t.Fatalf("line = %s; want a keepalive", line)
	}
	fb.write(id, "stderr", "more")
	var line string
	for {
		m, l := r.next()
		if m["keepalive"] != true {
			line = l
			break
		}
	}
	if line != `{"stream":"stderr","offset":5,"data":"bW9yZQ=="}` {
		t.Fatalf("line = %s; want stderr \"more\" at offset 5", line)
	}
	fb.exit(t, id, 3)
	for {
		m, l := r.next()
		if m["keepalive"] == true {
			continue
		}
		final, ok := m["final"].(map[string]any)
		if !ok || final["state"] != "exited" || final["exit_code"] != 3.0 {
			t.Fatalf("line = %s; want the final exited marker", l)
		}
		break
	}

	// The client resumes from offsets and gets the rest in order.
	c := dialClient(t, path)
	var got []string
	rec, err := c.Attach(context.Background(), id, 0, 9, func(stream string, offset int64, data []byte) error {
		got = append(got, fmt.Sprintf("%s@%d:%s", stream, offset, data))
		return nil
	})
	if err != nil || rec.State != hostproto.MarkerExited {
		t.Fatalf("attach = %+v, %v", rec, err)
	}
	if want := []string{"stdout@0:hello world\n"}; !slices.Equal(got, want) {
		t.Errorf("chunks = %q; want %q", got, want)
	}
}

func TestControlAttachEndsWithTheContext(t *testing.T) {
	fb := newFakeBackend(t)
	id := fb.start(t, "alice", "")
	path := serveLocalForTest(t, fb, DefaultKeepaliveInterval)
	c := dialClient(t, path)
	ctx, cancel := context.WithCancel(context.Background())
	fb.write(id, "stdout", "x")
	_, err := c.Attach(ctx, id, 0, 0, func(string, int64, []byte) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("attach = %v; want context.Canceled", err)
	}
	if _, _, err := c.Status(context.Background(), []string{id}); err == nil {
		t.Error("the client is usable after an interrupted attach; want it closed")
	}
	// The server is not stuck on the abandoned attach: a new connection works.
	if _, _, err := dialClient(t, path).Status(context.Background(), []string{id}); err != nil {
		t.Errorf("status on a new connection: %v", err)
	}
}

func TestControlFraming(t *testing.T) {
	fb := newFakeBackend(t)
	id := fb.start(t, "alice", "")
	path := serveLocalForTest(t, fb, DefaultKeepaliveInterval)

	t.Run("bad requests keep the connection", func(t *testing.T) {
		r := dialRaw(t, path)
		for _, line := range []string{`{"op":"shell"}`, `not json`, `{"op":"status","ids":["ex_bad"]}`} {
			r.send(line)
			if m, got := r.next(); errorCode(m) != hostproto.CodeBadRequest {
				t.Errorf("%s → %s; want a bad_request error", line, got)
			}
		}
		r.send("")
		r.send(`{"op":"status","ids":["` + id + `"]}`)
		if m, got := r.next(); m["markers"] == nil || m["missing"] == nil {
			t.Errorf("status after errors → %s; want markers and missing", got)
		}
	})

	t.Run("line at the limit", func(t *testing.T) {
		r := dialRaw(t, path)
		req := `{"op":"status","ids":["` + id + `"]}`
		r.send(req + strings.Repeat(" ", hostproto.MaxControlLine-len(req)))
		if m, got := r.next(); m["markers"] == nil {
			t.Errorf("reply = %.200s; want a status reply", got)
		}
	})

	t.Run("oversized line closes", func(t *testing.T) {
		r := dialRaw(t, path)
		req := `{"op":"status","ids":["` + id + `"]}`
		r.send(req + strings.Repeat(" ", hostproto.MaxControlLine-len(req)+1))
		if m, got := r.next(); errorCode(m) != hostproto.CodeBadRequest {
			t.Errorf("reply = %.200s; want bad_request", got)
		}
		if line, err := r.br.ReadString('\n'); !errors.Is(err, io.EOF) {
			t.Errorf("after an oversized line: %q, %v; want EOF", line, err)
		}
	})

	t.Run("half-closed client still gets its answer", func(t *testing.T) {
		r := dialRaw(t, path)
		r.send(`{"op":"status","ids":["` + id + `"]}`)
		r.c.(*net.UnixConn).CloseWrite()
		if m, got := r.next(); m["markers"] == nil {
			t.Errorf("reply = %s; want a status reply", got)
		}
		if _, err := r.br.ReadString('\n'); !errors.Is(err, io.EOF) {
			t.Errorf("after the answer: %v; want EOF", err)
		}
	})
}

func TestControlScopedAccount(t *testing.T) {
	fb := newFakeBackend(t)
	alice := fb.start(t, "alice", "")
	bob := fb.start(t, "bob", "")
	// Same account, another key; and a certificate identity of the account.
	aliceOtherKey := fb.startAs(t, Identity{Account: "alice", Fingerprint: "SHA256:another-key"}, "")
	aliceCert := fb.startAs(t, Identity{Account: "alice", Fingerprint: "SHA256:key-of-alice", KeyID: "deploy-bot"}, "")
	fb.setOwner(alice, 1)
	ctx := context.Background()

	scoped := dialClient(t, serveAsForTest(t, fb, sshCaller(testIdentity("alice"), "root")))
	everyone := dialClient(t, serveAsForTest(t, fb, sshCaller(testIdentity("root"), "root")))
	// The same certificate key id on a renewed key is the same identity.
	renewedCert := dialClient(t, serveAsForTest(t, fb, sshCaller(Identity{Account: "alice", Fingerprint: "SHA256:renewed", KeyID: "deploy-bot"}, "root")))

	foreign := []string{bob, aliceOtherKey, aliceCert}
	found, missing, err := scoped.Status(ctx, append([]string{alice}, foreign...))
	if err != nil || len(found) != 1 || found[0].ID != alice || !slices.Equal(missing, foreign) {
		t.Errorf("scoped status = %v, %v, %v; want only alice's own, the others missing", found, missing, err)
	}
	page, _, err := scoped.List(ctx, hostproto.ControlListQuery{})
	if err != nil || len(page) != 1 || page[0].ID != alice {
		t.Errorf("scoped list = %v, %v; want only alice's own", page, err)
	}
	for _, id := range foreign {
		if _, err := scoped.Attach(ctx, id, 0, 0, func(string, int64, []byte) error { return nil }); !errors.Is(err, hostproto.ErrNotFound) {
			t.Errorf("scoped attach of another identity's %s = %v; want not found", id, err)
		}
		if _, err := scoped.Cancel(ctx, id); !errors.Is(err, hostproto.ErrNotFound) {
			t.Errorf("scoped cancel of another identity's %s = %v; want not found", id, err)
		}
	}
	if found, _, err := renewedCert.Status(ctx, []string{aliceCert, alice}); err != nil || len(found) != 1 || found[0].ID != aliceCert {
		t.Errorf("renewed certificate's status = %v, %v; want its key id's execution only", found, err)
	}
	if _, err := scoped.Export(ctx, io.Discard); !errors.Is(err, hostproto.ErrForbidden) {
		t.Errorf("scoped export = %v; want forbidden", err)
	}
	if _, err := scoped.Checkpoint(ctx, alice, "over ssh"); !errors.Is(err, hostproto.ErrForbidden) {
		t.Errorf("checkpoint over ssh = %v; want forbidden", err)
	}

	found, _, err = everyone.Status(ctx, []string{alice, bob})
	if err != nil || len(found) != 2 {
		t.Errorf("own-account status = %v, %v; want both", found, err)
	}
	if _, err := everyone.Export(ctx, io.Discard); err != nil {
		t.Errorf("own-account export: %v", err)
	}
	if _, err := everyone.Checkpoint(ctx, alice, "over ssh"); !errors.Is(err, hostproto.ErrForbidden) {
		t.Errorf("checkpoint over ssh as the own account = %v; want forbidden", err)
	}
	if rec, err := everyone.Cancel(ctx, bob); err != nil || rec.State != hostproto.MarkerCancelled {
		t.Errorf("own-account cancel of bob's = %+v, %v", rec, err)
	}
}

func TestSSHCaller(t *testing.T) {
	tests := []struct {
		name, account, own string
		wantScoped         bool
	}{
		{name: "own account sees all", account: "root", own: "root", wantScoped: false},
		{name: "other account is scoped", account: "deploy", own: "root", wantScoped: true},
		{name: "unknown own account scopes everyone", account: "deploy", own: "", wantScoped: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := testIdentity(tt.account)
			c := sshCaller(id, tt.own)
			if (c.scope != nil) != tt.wantScoped || c.scope != nil && *c.scope != id || !c.operator || c.peerPID != 0 {
				t.Errorf("sshCaller = %+v; want scoped %v to %+v, operator, no pid", c, tt.wantScoped, id)
			}
		})
	}
}

func TestListenLocal(t *testing.T) {
	t.Run("removes a stale socket", func(t *testing.T) {
		path := socketPath(t)
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		ln, err = ListenLocal(path)
		if err != nil {
			t.Fatalf("ListenLocal over a stale socket: %v", err)
		}
		defer ln.Close()
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o666 {
			t.Errorf("socket mode = %v, %v; want 0666", fi.Mode(), err)
		}
		if _, err := ListenLocal(path); !errors.Is(err, ErrSocketInUse) {
			t.Errorf("ListenLocal over a live socket = %v; want ErrSocketInUse", err)
		}
	})
	t.Run("leaves other files alone", func(t *testing.T) {
		path := socketPath(t)
		if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ListenLocal(path); err == nil {
			t.Fatal("ListenLocal over a regular file succeeded")
		}
		if b, _ := os.ReadFile(path); string(b) != "data" {
			t.Error("the regular file was changed")
		}
	})
}

func TestServeLocalStopsWithContext(t *testing.T) {
	fb := newFakeBackend(t)
	id := fb.start(t, "alice", "")
	path := socketPath(t)
	ln, err := ListenLocal(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeLocal(ctx, ln, fb, defaultLocalLimits, testLogger(t)) }()

	c := dialClient(t, path)
	fb.write(id, "stdout", "x")
	streaming := make(chan struct{})
	attached := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := c.Attach(context.Background(), id, 0, 0, func(string, int64, []byte) error {
			once.Do(func() { close(streaming) })
			return nil
		})
		attached <- err
	}()
	<-streaming
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServeLocal = %v; want nil", err)
	}
	if err := <-attached; err == nil {
		t.Error("attach ended without error when the server stopped")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after stop: %v; want it removed", err)
	}
}

// peerHelperEnv makes TestControlPeerHelper act as a local peer instead of a test.
const (
	peerHelperSocket = "POSTERN_TEST_CONTROL_SOCKET"
	peerHelperID     = "POSTERN_TEST_CONTROL_ID"
)

// TestControlPeerHelper is run by TestControlPeerCredentials as another user: it waits for
// a line on stdin, tries an operator request and a checkpoint, and prints one result line
// each.
func TestControlPeerHelper(t *testing.T) {
	path := os.Getenv(peerHelperSocket)
	if path == "" {
		t.Skip("helper process only")
	}
	bufio.NewReader(os.Stdin).ReadString('\n')
	c, err := hostproto.DialLocalControl(context.Background(), path)
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()
	id := os.Getenv(peerHelperID)
	_, _, err = c.Status(context.Background(), []string{id})
	fmt.Println("status:", errCode(err))
	_, err = c.Export(context.Background(), io.Discard)
	fmt.Println("export:", errCode(err))
	_, err = c.Checkpoint(context.Background(), id, "from the child")
	fmt.Println("checkpoint:", errCode(err))
}

func errCode(err error) string {
	var ce *hostproto.ControlError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ce):
		return ce.Code
	}
	return err.Error()
}

func TestControlPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a peer as another user")
	}
	fb := newFakeBackend(t)
	id := fb.start(t, "nobody", "")
	path := serveLocalForTest(t, fb, DefaultKeepaliveInterval)
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	// The test binary must be reachable by the other user.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(filepath.Dir(path), "helper.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestControlPeerHelper$")
	cmd.Env = []string{peerHelperSocket + "=" + path, peerHelperID + "=" + id}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fb.setOwner(id, cmd.Process.Pid) // the child is the execution's process tree
	io.WriteString(stdin, "go\n")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out.String())
	}
	for _, want := range []string{"status: forbidden", "export: forbidden", "checkpoint: ok"} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("helper output lacks %q:\n%s", want, out.String())
		}
	}
	rec, err := fb.store.Get(id)
	if err != nil || len(rec.Checkpoints) != 1 || rec.Checkpoints[0].Note != "from the child" {
		t.Errorf("marker = %+v, %v; want the child's checkpoint", rec, err)
	}
}

// controlHandler serves the control subsystem like the executor's Control does.
type controlHandler struct{ backend controlBackend }

func (h controlHandler) Exec(_ context.Context, s gliderssh.Session, _ ExecRequest) { s.Exit(255) }

func (h controlHandler) Control(ctx context.Context, s gliderssh.Session, caller Identity) {
	ServeControlSession(ctx, s, caller, h.backend, nil)
}

// sessionConn is an SSH session's stdin and stdout as one connection.
type sessionConn struct {
	io.Reader
	io.WriteCloser
	session *gossh.Session
}

func (c sessionConn) Close() error {
	c.WriteCloser.Close()
	return c.session.Close()
}

func TestControlOverSSH(t *testing.T) {
	fb := newFakeBackend(t)
	own := ownAccountName()
	id := fb.start(t, "someone-else", "")
	dir := t.TempDir()
	key := testutil.NewSSHKey(t)
	testutil.WriteAuthorizedKeys(t, filepath.Join(dir, "authorized_keys"), key.AuthorizedLine())
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.AuthorizedKeysFile = filepath.Join(dir, "authorized_keys")
	cfg.AllowedAccounts = []string{own}
	srv, err := NewServer(cfg, controlHandler{fb}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	conn := testutil.MustDialSSH(t, ln.Addr().String(), own, srv.HostPublicKey(), gossh.PublicKeys(key.Signer))
	sess, err := conn.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	if err := sess.RequestSubsystem(ControlSubsystem); err != nil {
		t.Fatal(err)
	}
	c := hostproto.NewControlClient(sessionConn{Reader: stdout, WriteCloser: stdin, session: sess})
	ctx := context.Background()

	// The hostagent's own account sees every account's markers.
	found, _, err := c.Status(ctx, []string{id})
	if err != nil || len(found) != 1 {
		t.Errorf("status over ssh = %v, %v; want the marker", found, err)
	}
	if _, err := c.Checkpoint(ctx, id, "over ssh"); !errors.Is(err, hostproto.ErrForbidden) {
		t.Errorf("checkpoint over ssh = %v; want hostproto.ErrForbidden", err)
	}
	fb.write(id, "stdout", "out")
	fb.exit(t, id, 0)
	var got bytes.Buffer
	rec, err := c.Attach(ctx, id, 0, 0, func(_ string, _ int64, data []byte) error {
		got.Write(data)
		return nil
	})
	if err != nil || rec.State != hostproto.MarkerExited || got.String() != "out" {
		t.Errorf("attach over ssh = %+v, %q, %v", rec, got.String(), err)
	}
	// Closing stdin ends the session (x/crypto's Session.Wait does not work after
	// RequestSubsystem, so the exit status is not checked here).
	stdin.Close()
	if rest, err := io.ReadAll(stdout); err != nil || len(rest) != 0 {
		t.Errorf("after closing stdin: %q, %v; want the session to end", rest, err)
	}

	// hostproto.DialControl opens the subsystem on a channel of its own, on the same connection.
	dialed, err := hostproto.DialControl(conn)
	if err != nil {
		t.Fatalf("DialControl: %v", err)
	}
	defer dialed.Close()
	if found, _, err := dialed.Status(ctx, []string{id}); err != nil || len(found) != 1 || found[0].State != hostproto.MarkerExited {
		t.Errorf("status over DialControl = %v, %v; want the exited marker", found, err)
	}
}
