package delivery

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
)

// Journal is what the tracking writes: the engine's record of a result's delivery.
type Journal interface {
	// Delivered journals that the result of execution id reached the caller of ctx (its
	// transport caller and the request id, RequestID, name the call).
	Delivered(ctx context.Context, id string) error
	// RevokeDelivery journals that the result of id was not delivered after all; false when
	// the delivery stays (a newer execution of the intent was accepted since).
	RevokeDelivery(ctx context.Context, id string) (bool, error)
	// NotDelivered journals why the response to the call of ctx, which carried the result
	// of id, does not count as its delivery: what investigate and executions show tell the
	// operator. It never changes whether the result counts as delivered.
	NotDelivered(ctx context.Context, id, why string) error
	// Delivering notes that a response carrying the result of id is on its way, before any
	// of it is written: until done is called — once the delivery was journaled or found not
	// to be — whether the result was delivered is not known yet. (A client can read the
	// response and call again before the kernel's evidence is in; the engine lets such a
	// call wait for the verdict rather than take the result for undelivered.)
	Delivering(id string) (done func())
}

// Replicas carries cancels between bastion replicas (markers.Replicated does): a
// notifications/cancelled may reach another replica than the one serving its request.
type Replicas interface {
	PublishCancel(ctx context.Context, key []byte) error
	WatchCancels(ctx context.Context, apply func(key []byte))
}

// Tracker judges the delivery of the results a transport carries, and applies the clients'
// cancels to them. One Tracker serves every transport of a bastion: its cancel registry is
// shared, so a cancel on one connection finds its call on another.
type Tracker struct {
	journal  Journal
	replicas Replicas // nil on a single node
	reg      *callRegistry
	log      *slog.Logger
	// posts holds the POSTs in flight by their postKeyHeader value → *postState.
	posts sync.Map
}

// NewTracker returns a tracker that journals through j. A cancel revokes a delivery
// recorded within grace of it; r is nil on a single node.
func NewTracker(j Journal, r Replicas, grace time.Duration, now func() time.Time, log *slog.Logger) *Tracker {
	return &Tracker{journal: j, replicas: r, reg: newCallRegistry(grace, now), log: log}
}

// deliveries collects the executions whose results a response carries, so they are marked
// delivered only once the response was written to the transport.
type deliveries struct {
	journal Journal
	mu      sync.Mutex // guards ids and judged: the handlers of one POST add to them concurrently
	ids     []string
	// judged end the Delivering notes of ids (finish).
	judged []func()
}

func (d *deliveries) add(id string) {
	done := d.journal.Delivering(id)
	d.mu.Lock()
	d.ids = append(d.ids, id)
	d.judged = append(d.judged, done)
	d.mu.Unlock()
}

// finish says that the delivery of every result the response carries has been judged.
func (d *deliveries) finish() {
	d.mu.Lock()
	judged := d.judged
	d.judged = nil
	d.mu.Unlock()
	for _, done := range judged {
		done()
	}
}

type deliveriesKey struct{}

// postKeyHeader names the POST a message came in on. go-sdk runs the handlers of a stateful
// session outside the POST's context, so Handler sets this header (replacing anything
// a client sent) and registers the POST's state under it, and Context finds it again.
const postKeyHeader = "Postern-Post-Key"

// postState is what a handler needs of the POST that carried its request.
type postState struct {
	dl        *deliveries
	requestID string
}

// Context returns ctx with the deliveries and request id of the POST that carried a
// request, given the request's headers. In a stateful session go-sdk runs handlers in a
// context derived from the session's first POST, whose values are stale: the header decides.
func (t *Tracker) Context(ctx context.Context, header http.Header) context.Context {
	if header == nil {
		return ctx
	}
	v, ok := t.posts.Load(header.Get(postKeyHeader))
	if !ok {
		return ctx
	}
	st := v.(*postState)
	ctx = context.WithValue(ctx, deliveriesKey{}, st.dl)
	if st.requestID != "" {
		ctx = withRequestID(ctx, st.requestID)
	}
	return ctx
}

// Carries notes that the response to the request of ctx carries the result of execution id:
// it is journaled delivered once that response reached the client (Tracker.Handler). Outside
// a tracked request it does nothing.
func Carries(ctx context.Context, id string) {
	if d, _ := ctx.Value(deliveriesKey{}).(*deliveries); d != nil {
		d.add(id)
	}
}

// Handler wraps the MCP handler. It reads each POSTed body (already bounded by the
// transport) for tools/call requests and notifications/cancelled (calls.go). A tool call's
// executions are marked delivered only on positive evidence (evidence.go): the response was
// written and flushed, the request was not cancelled, and the client's end of the connection
// has every byte while still connected. Anything else leaves them
// completed-but-not-delivered, so a retry replays them. A cancel revokes a delivery recorded
// within the grace window, before go-sdk answers the notification (202).
func (t *Tracker) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, known := transport.CallerFromContext(r.Context())
		var msgs []rpcPeek
		if known && r.Method == http.MethodPost && r.Body != nil {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "reading request body failed", http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			msgs = peekMessages(body)
		}
		scope := intent.Scope(caller, "")
		ctx, abort := context.WithCancel(r.Context())
		defer abort()
		for _, m := range msgs {
			if m.Cancelled == "" {
				continue
			}
			key := requestKey{caller.Actor, scope, m.Cancelled}
			err := t.revokeDeliveries(ctx, t.reg.abandon(key))
			if t.replicas != nil && err == nil {
				// The request may be served by another replica: it applies the cancel too.
				err = t.replicas.PublishCancel(ctx, key.encode())
			}
			if err != nil {
				t.log.Error("journal delivery revocation", "actor", caller.Actor, "err", err)
				http.Error(w, "the journal could not record the cancellation", http.StatusServiceUnavailable)
				return
			}
		}
		var calls []*trackedCall
		for _, m := range msgs {
			if m.Call != "" {
				calls = append(calls, t.reg.begin(requestKey{caller.Actor, scope, m.Call}, abort))
			}
		}
		if len(calls) == 1 {
			ctx = withRequestID(ctx, calls[0].key.id)
		}

		dl := &deliveries{journal: t.journal}
		defer dl.finish() // after the verdict and any revocation below
		post := &postState{dl: dl}
		if len(calls) == 1 {
			post.requestID = calls[0].key.id
		}
		key := rand.Text()
		t.posts.Store(key, post)
		defer t.posts.Delete(key)
		r.Header.Set(postKeyHeader, key)
		r = r.WithContext(context.WithValue(ctx, deliveriesKey{}, dl))
		tw := &trackingWriter{ResponseWriter: w}
		next.ServeHTTP(tw, r)
		var delivered []string
		if len(dl.ids) > 0 {
			delivered = t.recordDelivery(ctx, tw, w, calls, dl.ids)
		}
		for _, c := range calls {
			if err := t.revokeDeliveries(ctx, t.reg.finish(c, delivered)); err != nil {
				t.log.Error("journal delivery revocation", "actor", caller.Actor, "err", err)
			}
		}
	})
}

// recordDelivery journals the executions of a response as delivered if the evidence holds,
// and returns those it journaled.
func (t *Tracker) recordDelivery(ctx context.Context, tw *trackingWriter, w http.ResponseWriter, calls []*trackedCall, ids []string) []string {
	flushErr := http.NewResponseController(w).Flush()
	cancelled := func() bool {
		for _, c := range calls {
			if t.reg.abandoned(c) {
				return true
			}
		}
		return false
	}
	why := ""
	switch {
	case tw.err != nil || flushErr != nil:
		why = "the response could not be written"
	case ctx.Err() != nil || cancelled():
		why = "the client cancelled the request or went away"
	case !received(ctx):
		why = "the client's end did not acknowledge every byte while connected"
	case cancelled():
		why = "the client cancelled the request"
	}
	if why != "" {
		t.log.Info("result not delivered; a retry will replay it", "executions", ids, "why", why)
		// Evidence for the operator, written whatever became of the request (its context may
		// be done: the client went away).
		for _, id := range ids {
			if err := t.journal.NotDelivered(context.WithoutCancel(ctx), id, why); err != nil {
				t.log.Error("journal why a result was not delivered", "execution_id", id, "err", err)
			}
		}
		return nil
	}
	var delivered []string
	for _, id := range ids {
		if err := t.journal.Delivered(ctx, id); err != nil {
			t.log.Error("journal result delivery", "execution_id", id, "err", err)
			continue
		}
		delivered = append(delivered, id)
	}
	return delivered
}

// revokeDeliveries journals that the results of ids were not delivered after all: their
// client cancelled the request that carried them.
func (t *Tracker) revokeDeliveries(ctx context.Context, ids []string) error {
	var errs []error
	for _, id := range ids {
		revoked, err := t.journal.RevokeDelivery(context.WithoutCancel(ctx), id)
		if err != nil {
			errs = append(errs, fmt.Errorf("revoke delivery of %s: %w", id, err))
			continue
		}
		if revoked {
			t.log.Info("result delivery revoked: the client cancelled the request; a retry will replay it", "execution_id", id)
		}
	}
	return errors.Join(errs...)
}

// trackingWriter remembers whether any write to the connection failed.
type trackingWriter struct {
	http.ResponseWriter
	err error
}

func (t *trackingWriter) Write(p []byte) (int, error) {
	n, err := t.ResponseWriter.Write(p)
	if err != nil && t.err == nil {
		t.err = err
	}
	return n, err
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func (t *trackingWriter) Flush() {
	if err := http.NewResponseController(t.ResponseWriter).Flush(); err != nil && t.err == nil {
		t.err = err
	}
}

// requestIDKey is the context key of the JSON-RPC id of the tools/call being served (set by
// Handler when the POST carries exactly one call).
type requestIDKey struct{}

func withRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is the JSON-RPC id of the call whose request ctx serves, "" when the POST that
// carried it held other than exactly one call.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// WatchCancels applies the cancels other replicas received, until ctx ends. It does nothing
// on a single node.
func (t *Tracker) WatchCancels(ctx context.Context) {
	if t.replicas == nil {
		return
	}
	t.replicas.WatchCancels(ctx, func(k []byte) {
		key, ok := decodeRequestKey(k)
		if !ok {
			t.log.Warn("ignored a malformed cancel published by another replica")
			return
		}
		if err := t.revokeDeliveries(ctx, t.reg.abandon(key)); err != nil {
			t.log.Error("journal delivery revocation", "actor", key.actor, "err", err)
		}
	})
}
