package delivery

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
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// fakeJournal records what the tracker journals.
type fakeJournal struct {
	mu        sync.Mutex
	delivered []delivered
	revoked   []string
	// notDelivered are the NotDelivered calls: "id: why".
	notDelivered []string
	// deliverErr and revokeErr fail Delivered and RevokeDelivery.
	deliverErr, revokeErr error
}

// delivered is one Delivered call: the execution, and the call its context names.
type delivered struct {
	id, requestID, actor string
}

func (j *fakeJournal) Delivered(ctx context.Context, id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.deliverErr != nil {
		return j.deliverErr
	}
	caller, _ := transport.CallerFromContext(ctx)
	j.delivered = append(j.delivered, delivered{id: id, requestID: RequestID(ctx), actor: caller.Actor})
	return nil
}

func (j *fakeJournal) RevokeDelivery(_ context.Context, id string) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.revokeErr != nil {
		return false, j.revokeErr
	}
	j.revoked = append(j.revoked, id)
	return true, nil
}

func (j *fakeJournal) NotDelivered(_ context.Context, id, why string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.notDelivered = append(j.notDelivered, id+": "+why)
	return nil
}

func (j *fakeJournal) notDeliveries() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.notDelivered)
}

func (j *fakeJournal) Delivering(string) func() { return func() {} }

func (j *fakeJournal) deliveries() []delivered {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.delivered)
}

func (j *fakeJournal) revocations() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.revoked)
}

// fakeReplicas is the cancel channel between replicas: what one publishes, every watcher
// applies.
type fakeReplicas struct {
	mu         sync.Mutex
	published  [][]byte
	publishErr error
	watchers   []chan []byte
}

func (r *fakeReplicas) PublishCancel(_ context.Context, key []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.publishErr != nil {
		return r.publishErr
	}
	r.published = append(r.published, key)
	for _, w := range r.watchers {
		w <- key
	}
	return nil
}

func (r *fakeReplicas) WatchCancels(ctx context.Context, apply func(key []byte)) {
	w := make(chan []byte, 16)
	r.mu.Lock()
	r.watchers = append(r.watchers, w)
	r.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return
		case k := <-w:
			apply(k)
		}
	}
}

func (r *fakeReplicas) publications() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, k := range r.published {
		out = append(out, string(k))
	}
	return out
}

// syncClock is a settable clock read by the servers' goroutines.
type syncClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *syncClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *syncClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeMCP stands for go-sdk's handler: every tools/call of a POST is answered with a result
// that carries execution ex_<id>; a POST of notifications only is answered 202.
type fakeMCP struct {
	tracker *Tracker
	// staleContext: the handler finds its POST through the header (Tracker.Context), as
	// go-sdk's stateful sessions make it do.
	staleContext bool
	// beforeWrite and afterWrite, if set, run around the writing of a call's response.
	beforeWrite, afterWrite func(r *http.Request)
	// seen receives what the handler saw of each call's POST.
	seen chan handlerView
}

// handlerView is what a tool handler saw of its request.
type handlerView struct {
	postKey   string
	requestID string
}

// rpcMessage is what fakeMCP reads of a JSON-RPC message.
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

func (m *fakeMCP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var msgs []rpcMessage
	if bytes.HasPrefix(body, []byte("[")) {
		json.Unmarshal(body, &msgs)
	} else {
		var one rpcMessage
		json.Unmarshal(body, &one)
		msgs = []rpcMessage{one}
	}
	var ids []string
	for _, msg := range msgs {
		if msg.Method == "tools/call" {
			ids = append(ids, strings.Trim(string(msg.ID), `"`))
		}
	}
	if len(ids) == 0 {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	ctx := r.Context()
	if m.staleContext {
		ctx = m.tracker.Context(context.Background(), r.Header)
	}
	for _, id := range ids {
		Carries(ctx, "ex_"+id)
	}
	if m.seen != nil {
		m.seen <- handlerView{postKey: r.Header.Get(postKeyHeader), requestID: RequestID(ctx)}
	}
	if m.beforeWrite != nil {
		m.beforeWrite(r)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","result":{"executions":%q}}`, ids)
	http.NewResponseController(w).Flush()
	if m.afterWrite != nil {
		m.afterWrite(r)
	}
}

// rig is a Tracker in front of a fake MCP handler, served as the bastion serves it.
type rig struct {
	tracker *Tracker
	journal *fakeJournal
	clock   *syncClock
	mcp     *fakeMCP
	// served receives one value per request the tracker finished serving.
	served chan struct{}
}

// grace is the rigs' delivery revoke grace.
const grace = 30 * time.Second

func newRig(t testing.TB, replicas Replicas) *rig {
	t.Helper()
	r := &rig{journal: &fakeJournal{}, clock: &syncClock{t: time.Unix(1000, 0)}, served: make(chan struct{}, 64)}
	r.tracker = NewTracker(r.journal, replicas, grace, r.clock.now, slog.New(slog.DiscardHandler))
	r.mcp = &fakeMCP{tracker: r.tracker}
	return r
}

// handler is the tracker around the fake MCP handler, signalling each request it served.
func (r *rig) handler() http.Handler {
	tracked := r.tracker.Handler(r.mcp)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		tracked.ServeHTTP(w, req)
		r.served <- struct{}{}
	})
}

// waitServed waits until the tracker finished serving n more requests.
func (r *rig) waitServed(t testing.TB, n int) {
	t.Helper()
	for range n {
		select {
		case <-r.served:
		case <-time.After(time.Minute):
			t.Fatal("timed out waiting for the tracker to finish a request")
		}
	}
}

// remote is an HTTP endpoint of a rig: the tracker behind the transport's bearer-token auth,
// on a real TCP listener on 127.0.0.1, as the bastion's listen serves it.
type remote struct {
	url, host, token string
	client           *http.Client
}

// runID is the Postern-Run of the remote agent: its calls' intent scope is run:r1.
const runID = "r1"

func (r *rig) serveTCP(t testing.TB) *remote {
	t.Helper()
	token, err := transport.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	h, err := transport.HTTPHandler(r.handler(), transport.HTTPOptions{
		Actors: []transport.Actor{{Name: "agent", TokenSHA256: transport.HashToken(token)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnContext = RememberConn(nil)
	srv.Start()
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	return &remote{url: srv.URL, host: srv.Listener.Addr().String(), token: token, client: client}
}

// post sends body as the remote agent and reads the whole answer.
func (rm *remote) post(t testing.TB, body string, header ...string) (int, string) {
	t.Helper()
	status, answer, err := rm.tryPost(body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return status, answer
}

// tryPost is post for a goroutine other than the test's.
func (rm *remote) tryPost(body string, header ...string) (int, string, error) {
	req, err := http.NewRequest("POST", rm.url+"/mcp", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+rm.token)
	req.Header.Set(transport.RunHeader, runID)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := rm.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// rawRequest is the HTTP/1.1 request of body as the remote agent sends it.
func (rm *remote) rawRequest(body string) string {
	return fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n%s: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		rm.host, rm.token, transport.RunHeader, runID, len(body), body)
}

// serveUnix serves the rig on a unix socket behind the transport's peer credentials, as the
// bastion's socket serves it, and returns the socket's path.
func (r *rig) serveUnix(t testing.TB) string {
	t.Helper()
	sock := filepath.Join(sockdir.New(t), "mcp.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.UnixServer(r.handler(), transport.UnixOptions{})
	srv.ConnContext = RememberConn(srv.ConnContext)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func call(id string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"ssh_exec"}}`
}

func cancel(id string) string {
	return `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":` + id + `,"reason":"timeout"}}`
}

// wantDeliveries fails the test unless the journal holds exactly want.
func wantDeliveries(t testing.TB, j *fakeJournal, want ...delivered) {
	t.Helper()
	if got := j.deliveries(); !slices.Equal(got, want) {
		t.Fatalf("delivered = %+v; want %+v", got, want)
	}
}

func TestDeliveredWhenTheClientReads(t *testing.T) {
	r := newRig(t, nil)
	rm := r.serveTCP(t)
	status, body := rm.post(t, call("7"))
	if status != 200 || !strings.Contains(body, "7") {
		t.Fatalf("answer = %d %s; want 200 with the result", status, body)
	}
	r.waitServed(t, 1)
	wantDeliveries(t, r.journal, delivered{id: "ex_7", requestID: "7", actor: "token:agent"})

	rm.post(t, call(`"a-b"`))
	r.waitServed(t, 1)
	wantDeliveries(t, r.journal,
		delivered{id: "ex_7", requestID: "7", actor: "token:agent"},
		delivered{id: "ex_a-b", requestID: `"a-b"`, actor: "token:agent"})
	if got := r.journal.notDeliveries(); len(got) > 0 {
		t.Errorf("not delivered = %q; want nothing (both were delivered)", got)
	}
}

func TestDeliveredOverUnixSocket(t *testing.T) {
	r := newRig(t, nil)
	sock := r.serveUnix(t)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Post("http://postern/mcp", "application/json", strings.NewReader(call("3")))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status = %d; want 200", resp.StatusCode)
	}
	r.waitServed(t, 1)
	got := r.journal.deliveries()
	if len(got) != 1 || got[0].id != "ex_3" || got[0].requestID != "3" || !strings.HasPrefix(got[0].actor, "local:") {
		t.Fatalf("delivered = %+v; want ex_3 for request 3 of a local caller", got)
	}
}

// TestNotDeliveredWhenTheClientGoesAway: a client that is gone before it read the result
// did not take it, whether it closed, reset or simply never read — and the journal is told
// why, for the operator (Journal.NotDelivered).
func TestNotDeliveredWhenTheClientGoesAway(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(fmt.Sprintf("tcp gone before the response, reset %v", reset), func(t *testing.T) {
			r := newRig(t, nil)
			rm := r.serveTCP(t)
			c := dialRaw(t, "tcp", rm.host)
			r.mcp.beforeWrite = func(*http.Request) {
				if reset {
					c.(*net.TCPConn).SetLinger(0)
				}
				c.Close()
			}
			io.WriteString(c, rm.rawRequest(call("1")))
			r.waitServed(t, 1)
			wantDeliveries(t, r.journal)
			wantNotDelivered(t, r.journal, "ex_1")
		})
	}
	t.Run("unix close without reading the response", func(t *testing.T) {
		r := newRig(t, nil)
		sock := r.serveUnix(t)
		c := dialRaw(t, "unix", sock)
		// The response is on the socket, unread, when the client goes.
		r.mcp.afterWrite = func(*http.Request) { c.Close() }
		body := call("1")
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: postern\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		r.waitServed(t, 1)
		wantDeliveries(t, r.journal)
		wantNotDelivered(t, r.journal, "ex_1")
	})
}

// wantNotDelivered checks that the journal was told once why the result of id was not
// delivered, in the words of one of the evidence rule's reasons (which one depends on when
// the kernel noticed the client go).
func wantNotDelivered(t testing.TB, j *fakeJournal, id string) {
	t.Helper()
	got := j.notDeliveries()
	reasons := []string{"the response could not be written", "the client cancelled the request or went away",
		"the client's end did not acknowledge every byte while connected"}
	if len(got) != 1 || !slices.ContainsFunc(reasons, func(why string) bool { return got[0] == id+": "+why }) {
		t.Fatalf("not delivered = %q; want one %s: with one of %q", got, id, reasons)
	}
}

func dialRaw(t testing.TB, network, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestCancelInFlight: notifications/cancelled for a call in flight ends its handler and its
// result is not delivered, even though the client reads the response.
func TestCancelInFlight(t *testing.T) {
	r := newRig(t, nil)
	rm := r.serveTCP(t)
	aborted := make(chan bool, 1)
	started := make(chan struct{})
	r.mcp.beforeWrite = func(req *http.Request) {
		close(started)
		select {
		case <-req.Context().Done():
			aborted <- true
		case <-time.After(time.Minute):
			aborted <- false
		}
	}
	type answer struct {
		status int
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		status, _, err := rm.tryPost(call("8"))
		answered <- answer{status, err}
	}()
	<-started
	if status, _ := rm.post(t, cancel("8")); status != http.StatusAccepted {
		t.Fatalf("cancel answered %d; want 202", status)
	}
	if !<-aborted {
		t.Fatal("the cancelled call's handler was not ended")
	}
	if a := <-answered; a.err != nil || a.status != 200 {
		t.Fatalf("call answered %d, %v; want 200", a.status, a.err)
	}
	r.waitServed(t, 2)
	wantDeliveries(t, r.journal)
	if got := r.journal.revocations(); len(got) != 0 {
		t.Fatalf("revoked = %v; want nothing (nothing was delivered)", got)
	}
}

// TestCancelAfterDelivery: a cancel within the grace window revokes the delivery (and, with
// replicas, is published for the others); after it, the delivery stands.
func TestCancelAfterDelivery(t *testing.T) {
	tests := []struct {
		name        string
		after       time.Duration
		wantRevoked []string
	}{
		{name: "within the grace window", after: grace - time.Second, wantRevoked: []string{"ex_4"}},
		{name: "after the grace window", after: grace + time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replicas := &fakeReplicas{}
			r := newRig(t, replicas)
			rm := r.serveTCP(t)
			rm.post(t, call("4"))
			r.waitServed(t, 1)
			wantDeliveries(t, r.journal, delivered{id: "ex_4", requestID: "4", actor: "token:agent"})

			r.clock.advance(tt.after)
			if status, _ := rm.post(t, cancel("4")); status != http.StatusAccepted {
				t.Fatalf("cancel answered %d; want 202", status)
			}
			r.waitServed(t, 1)
			if got := r.journal.revocations(); !slices.Equal(got, tt.wantRevoked) {
				t.Fatalf("revoked = %v; want %v", got, tt.wantRevoked)
			}
			want := []string{`["token:agent","run:r1","4"]`}
			if got := replicas.publications(); !slices.Equal(got, want) {
				t.Fatalf("published = %v; want %v", got, want)
			}
		})
	}
}

// TestCancelBeforeItsCall: a cancel that overtakes its call (another connection) applies to
// the call of its caller when it comes, once; a cancel from another run does not.
func TestCancelBeforeItsCall(t *testing.T) {
	tests := []struct {
		name      string
		cancelRun string
		want      []delivered
	}{
		{name: "same caller: not delivered", cancelRun: runID},
		{name: "another run: delivered", cancelRun: "other-run", want: []delivered{{id: "ex_9", requestID: "9", actor: "token:agent"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil)
			rm := r.serveTCP(t)
			rm.post(t, cancel("9"), transport.RunHeader, tt.cancelRun)
			r.waitServed(t, 1)
			if status, body := rm.post(t, call("9")); status != 200 {
				t.Fatalf("call answered %d %s; want 200", status, body)
			}
			r.waitServed(t, 1)
			wantDeliveries(t, r.journal, tt.want...)

			// Used up: the next call with that id is delivered.
			rm.post(t, call("9"))
			r.waitServed(t, 1)
			wantDeliveries(t, r.journal, append(tt.want, delivered{id: "ex_9", requestID: "9", actor: "token:agent"})...)
		})
	}
}

func TestBatch(t *testing.T) {
	r := newRig(t, nil)
	rm := r.serveTCP(t)
	r.mcp.seen = make(chan handlerView, 1)
	rm.post(t, "["+call("1")+","+call("2")+"]")
	r.waitServed(t, 1)
	if v := <-r.mcp.seen; v.requestID != "" {
		t.Fatalf("handler's request id = %q; want none for a batch of two calls", v.requestID)
	}
	wantDeliveries(t, r.journal,
		delivered{id: "ex_1", actor: "token:agent"},
		delivered{id: "ex_2", actor: "token:agent"})
}

// TestPostKey: the handler of a call finds its POST through the header the tracker set (in
// place of any the client sent), as go-sdk's sessions make it; the key is forgotten after the
// response.
func TestPostKey(t *testing.T) {
	r := newRig(t, nil)
	rm := r.serveTCP(t)
	r.mcp.staleContext = true
	r.mcp.seen = make(chan handlerView, 1)
	rm.post(t, call("6"), postKeyHeader, "forged")
	r.waitServed(t, 1)
	v := <-r.mcp.seen
	if v.postKey == "" || v.postKey == "forged" {
		t.Fatalf("post key = %q; want the tracker's own", v.postKey)
	}
	if v.requestID != "6" {
		t.Fatalf("request id through the post key = %q; want 6", v.requestID)
	}
	wantDeliveries(t, r.journal, delivered{id: "ex_6", requestID: "6", actor: "token:agent"})

	h := http.Header{}
	h.Set(postKeyHeader, v.postKey)
	ctx := r.tracker.Context(context.Background(), h)
	if ctx != context.Background() {
		t.Fatal("the post key of a finished request still names it")
	}
	if ctx := r.tracker.Context(context.Background(), nil); ctx != context.Background() {
		t.Fatal("Context without headers changed the context")
	}
}

func TestCarriesOutsideARequest(t *testing.T) {
	ctx := context.Background()
	Carries(ctx, "ex_1") // nothing to note it in: no panic, nothing
	if id := RequestID(ctx); id != "" {
		t.Fatalf("RequestID = %q; want none", id)
	}
}

// TestJournalFailures: a cancel the journal cannot record is refused (the client may retry
// it); a delivery the journal cannot record is not revoked later.
func TestJournalFailures(t *testing.T) {
	t.Run("revocation", func(t *testing.T) {
		r := newRig(t, nil)
		rm := r.serveTCP(t)
		rm.post(t, call("1"))
		r.waitServed(t, 1)
		r.journal.mu.Lock()
		r.journal.revokeErr = errors.New("journal down")
		r.journal.mu.Unlock()
		status, body := rm.post(t, cancel("1"))
		r.waitServed(t, 1)
		if status != http.StatusServiceUnavailable || !strings.Contains(body, "could not record the cancellation") {
			t.Fatalf("cancel answered %d %q; want 503", status, body)
		}
	})
	t.Run("publication", func(t *testing.T) {
		replicas := &fakeReplicas{publishErr: errors.New("etcd down")}
		r := newRig(t, replicas)
		rm := r.serveTCP(t)
		status, _ := rm.post(t, cancel("1"))
		r.waitServed(t, 1)
		if status != http.StatusServiceUnavailable {
			t.Fatalf("cancel answered %d; want 503", status)
		}
	})
	t.Run("delivery", func(t *testing.T) {
		r := newRig(t, nil)
		r.journal.deliverErr = errors.New("journal down")
		rm := r.serveTCP(t)
		rm.post(t, call("1"))
		r.waitServed(t, 1)
		rm.post(t, cancel("1"))
		r.waitServed(t, 1)
		if got := r.journal.revocations(); len(got) != 0 {
			t.Fatalf("revoked = %v; want nothing: no delivery was recorded", got)
		}
	})
}

// TestReplicaCancel: a cancel received by one replica revokes a delivery another replica
// recorded.
func TestReplicaCancel(t *testing.T) {
	replicas := &fakeReplicas{}
	a, b := newRig(t, replicas), newRig(t, replicas)
	ctx, stop := context.WithCancel(context.Background())
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		a.tracker.WatchCancels(ctx)
	}()
	t.Cleanup(func() { stop(); <-watching })

	a.serveTCP(t).post(t, call("2"))
	a.waitServed(t, 1)
	b.serveTCP(t).post(t, cancel("2"))
	b.waitServed(t, 1)
	testutil.WaitFor(t, "the published cancel to revoke the delivery", func() bool {
		return slices.Equal(a.journal.revocations(), []string{"ex_2"})
	})
	if got := b.journal.revocations(); len(got) != 0 {
		t.Fatalf("replica b revoked %v; want nothing (it delivered nothing)", got)
	}
}

// TestWatchCancels: a cancel another replica published is applied as if received here, within
// the grace window; a malformed one is ignored.
func TestWatchCancels(t *testing.T) {
	key := requestKey{"token:agent", "run:r1", "3"}
	tests := []struct {
		name        string
		wait        time.Duration
		published   []byte
		wantRevoked []string
	}{
		{name: "applied", wait: grace - time.Second, published: key.encode(), wantRevoked: []string{"ex_3"}},
		{name: "after the grace window", wait: grace + time.Second, published: key.encode()},
		{name: "another request", published: requestKey{"token:agent", "run:r1", "4"}.encode()},
		{name: "malformed", published: []byte(`["token:agent","3"]`)},
		{name: "not JSON", published: []byte(`token:agent run:r1 3`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				replicas := &fakeReplicas{}
				j := &fakeJournal{}
				tr := NewTracker(j, replicas, grace, time.Now, slog.New(slog.DiscardHandler))
				tr.reg.finish(tr.reg.begin(key, nil), []string{"ex_3"})
				ctx, stop := context.WithCancel(t.Context())
				defer stop()
				go tr.WatchCancels(ctx)
				time.Sleep(tt.wait)
				synctest.Wait()
				replicas.PublishCancel(ctx, tt.published)
				synctest.Wait()
				if got := j.revocations(); !slices.Equal(got, tt.wantRevoked) {
					t.Fatalf("revoked = %v; want %v", got, tt.wantRevoked)
				}
			})
		})
	}
}

// TestWatchCancelsSingleNode: without replicas there is nothing to watch.
func TestWatchCancelsSingleNode(t *testing.T) {
	tr := NewTracker(&fakeJournal{}, nil, grace, time.Now, slog.New(slog.DiscardHandler))
	tr.WatchCancels(t.Context()) // returns at once
}
