package delivery

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
)

// A client that gives up on a tool call (the official SDKs' timeout or AbortSignal) sends
// notifications/cancelled for its request id — on Streamable HTTP as a separate POST — and
// may then re-issue the call. Whatever the connection said, that client did not take the
// result: before the result was delivered, delivery is never recorded for the request; after
// it, within the grace window, delivery is revoked (a journaled event), so the re-issue joins
// the execution and gets the stored result replayed. callRegistry matches the notification to the
// call by (actor, scope, JSON-RPC request id). With replicas the notification may reach
// another replica than the one serving the request (a load balancer sends each POST where it
// likes): the replica that receives it publishes it through the journal's etcd, and every
// replica applies it to its own registry as if received (Tracker.WatchCancels).

// requestKey names one JSON-RPC request of one caller: the actor, the intent scope the
// transport knows (intent.Scope without a run_id argument: the agent's run of a local caller,
// the Postern-Run header of a remote one, else the OAuth subject's or the actor's window) and
// the request id in compact JSON.
type requestKey struct {
	actor, scope, id string
}

// encode is k as a replica publishes it to the others (markers.Replicated.PublishCancel).
func (k requestKey) encode() []byte {
	b, _ := json.Marshal([]string{k.actor, k.scope, k.id}) // strings: cannot fail
	return b
}

func decodeRequestKey(b []byte) (requestKey, bool) {
	var f []string
	if json.Unmarshal(b, &f) != nil || len(f) != 3 {
		return requestKey{}, false
	}
	return requestKey{f[0], f[1], f[2]}, true
}

// Bounds of the cancel registry.
const (
	// maxFinishedCalls bounds the calls remembered after their response (delivered, or a
	// cancel that named no call in flight); the oldest are forgotten first.
	maxFinishedCalls = 16384
)

// trackedCall is one tools/call request the registry follows.
type trackedCall struct {
	key requestKey
	// abort ends the request's handler: its client no longer waits for it.
	abort func()

	// Guarded by cancels.mu:
	abandoned bool
	finished  time.Time // when the response ended (zero while in flight)
	delivered []string  // the executions whose delivery this request recorded
	revoked   bool      // delivered was revoked (or is being revoked) by a cancel
	orphan    bool      // a cancel that came before any call with its key
}

// callRegistry is the registry of calls in flight and recently answered.
type callRegistry struct {
	grace time.Duration
	now   func() time.Time

	mu sync.Mutex // guards the fields below
	// calls holds, by key, the calls in flight and the finished ones not yet forgotten.
	calls map[requestKey][]*trackedCall
	// finished lists the finished calls oldest first, for expiry and the size bound.
	finished []*trackedCall
}

func newCallRegistry(grace time.Duration, now func() time.Time) *callRegistry {
	return &callRegistry{grace: grace, now: now, calls: map[requestKey][]*trackedCall{}}
}

// begin registers a call in flight. A cancel that already came for its key (the notification
// overtook the call on another connection) cancels it: its delivery will not be recorded. Its
// handler is left to run, since a request id may be reused by another client of the same run,
// and not recording a delivery is always safe where ending a wait early is not.
func (cs *callRegistry) begin(key requestKey, abort func()) *trackedCall {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	now := cs.now()
	cs.expireLocked(now)
	c := &trackedCall{key: key, abort: abort}
	for _, other := range cs.calls[key] {
		if other.orphan && !other.revoked {
			other.revoked = true // used up
			c.abandoned = true
		}
	}
	cs.calls[key] = append(cs.calls[key], c)
	return c
}

// abandoned reports whether the client gave up on c (notifications/cancelled).
func (cs *callRegistry) abandoned(c *trackedCall) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return c.abandoned
}

// finish ends c once its response is done, with the executions whose delivery it recorded.
// If a cancel came while they were being recorded, it returns them: the caller revokes them.
func (cs *callRegistry) finish(c *trackedCall, delivered []string) (revoke []string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	now := cs.now()
	c.finished, c.delivered = now, delivered
	switch {
	case len(delivered) > 0 && c.abandoned:
		c.revoked = true
		revoke = delivered
		cs.removeLocked(c)
	case cs.grace <= 0:
		cs.removeLocked(c)
	default:
		// Kept for the grace window even with nothing delivered: a late cancel then
		// matches its call instead of waiting for one that will not come.
		cs.finished = append(cs.finished, c)
	}
	cs.expireLocked(now)
	return revoke
}

// abandon records that the client abandoned request key. Calls in flight are cancelled (their
// delivery will not be recorded, their handlers end); calls delivered within the grace window
// return their executions, whose delivery the caller revokes. An abandon that matches nothing is
// kept for the grace window, for a call still on its way.
func (cs *callRegistry) abandon(key requestKey) (revoke []string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	now := cs.now()
	cs.expireLocked(now)
	matched := false
	for _, c := range cs.calls[key] {
		switch {
		case c.orphan:
		case c.finished.IsZero():
			matched = true
			if !c.abandoned {
				c.abandoned = true
				if c.abort != nil {
					c.abort()
				}
			}
		case now.Sub(c.finished) <= cs.grace:
			matched = true
			if !c.revoked {
				c.revoked = true
				revoke = append(revoke, c.delivered...)
			}
		}
	}
	if !matched && cs.grace > 0 {
		orphan := &trackedCall{key: key, orphan: true, finished: now}
		cs.calls[key] = append(cs.calls[key], orphan)
		cs.finished = append(cs.finished, orphan)
		cs.expireLocked(now)
	}
	return revoke
}

// expireLocked forgets finished calls older than the grace window, and the oldest beyond
// maxFinishedCalls.
func (cs *callRegistry) expireLocked(now time.Time) {
	n := 0
	for n < len(cs.finished) && (len(cs.finished)-n > maxFinishedCalls || now.Sub(cs.finished[n].finished) > cs.grace) {
		cs.removeLocked(cs.finished[n])
		cs.finished[n] = nil
		n++
	}
	cs.finished = cs.finished[n:]
}

// removeLocked drops c from the index by key (not from finished).
func (cs *callRegistry) removeLocked(c *trackedCall) {
	list := cs.calls[c.key]
	for i, other := range list {
		if other == c {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(cs.calls, c.key)
	} else {
		cs.calls[c.key] = list
	}
}

// rpcPeek is what the delivery tracking reads of one JSON-RPC message a client POSTed.
type rpcPeek struct {
	// Call is the compact id of a tools/call request ("" otherwise).
	Call string
	// Cancelled is the compact requestId of a notifications/cancelled ("" otherwise).
	Cancelled string
}

// peekMessages reads the tools/call ids and the notifications/cancelled request ids of a
// POSTed body: one JSON-RPC message or a batch. A body that does not parse yields nothing
// (go-sdk answers it).
func peekMessages(body []byte) []rpcPeek {
	type message struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	var msgs []message
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		if json.Unmarshal(body, &msgs) != nil {
			return nil
		}
	} else {
		var m message
		if json.Unmarshal(body, &m) != nil {
			return nil
		}
		msgs = []message{m}
	}
	var out []rpcPeek
	for _, m := range msgs {
		switch m.Method {
		case "tools/call", "tasks/result", "tasks/get": // each can carry a result (tasks/get: with the tasks extension)
			if id := compactID(m.ID); id != "" {
				out = append(out, rpcPeek{Call: id})
			}
		case "notifications/cancelled":
			if compactID(m.ID) != "" {
				continue // a notification has no id
			}
			var p struct {
				RequestID json.RawMessage `json:"requestId"`
			}
			if json.Unmarshal(m.Params, &p) == nil {
				if id := compactID(p.RequestID); id != "" {
					out = append(out, rpcPeek{Cancelled: id})
				}
			}
		}
	}
	return out
}

// compactID is the canonical form of a JSON-RPC id (a string or a number), "" for none or
// anything else.
func compactID(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '"' && raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return ""
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil || buf.Len() > maxRequestIDBytes {
		return ""
	}
	return buf.String()
}

// maxRequestIDBytes bounds a request id the registry keeps.
const maxRequestIDBytes = 256
