package markers

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Call is one tool call that touched an execution, as the bastion saw it: the call that
// created it (carried by the create event) and every later call that joined it, replayed it,
// was delivered its result or was refused because of it (a joined event each). Calls travel
// in the hash-chained log, so the chain covers who asked, how and when.
type Call struct {
	// Transport is how the call came: "unix" (the MCP socket), "stdio-bridge" (`postern mcp`
	// on the socket) or "http" (Streamable HTTP).
	Transport string `json:"transport"`
	// RequestID is the JSON-RPC id of the tools/call, in compact JSON ("" if unknown).
	RequestID string `json:"request_id,omitempty"`
	// Run is the call's agent run: its intent scope (see Run).
	Run string `json:"run,omitempty"`
	// Subject is the person or service behind a remote call made with an OAuth access
	// token: its sub claim (the actor is the one its rules mapped it to). "" otherwise.
	Subject string `json:"subject,omitempty"`
	// Match is what the matching rule made of the call: new, new_attempt, continue, pending,
	// rejection, attach, reconcile, replay, idempotency_key_reused — or delivered, for the
	// call that was handed the result.
	Match string `json:"match,omitempty"`
	// Replayed is the replayed flag the call was answered with: true when it started nothing.
	Replayed bool `json:"replayed"`
	// Replica is the bastion replica that served the call (replicas on etcd; empty on a
	// single node).
	Replica string `json:"replica,omitempty"`
	// NewRun is the run's identity at its first contact, set on the first write that names
	// the run; the store then keeps it as the run's record (Store.Run).
	NewRun *Run `json:"new_run,omitempty"`
	// RunIdentity is the run's identity when the caller believes the journal holds its record
	// already (NewRun is nil). It is not journaled in the event: the store records it only if
	// the run's record is missing — retention removed the run since the caller learned of it
	// (a run with no execution left, docs/design.md "Retention").
	RunIdentity *Run `json:"-"`
}

// Run is one agent run: the intent scope of its calls, with the identity of the agent
// behind it as first seen. Local agents are processes read from the kernel; remote ones are
// a bearer token's actor and the run id they named (or none: the actor's window).
type Run struct {
	Actor string `json:"actor"`
	// Scope is the intent scope: "run:<pid>-<start ticks>" (local), "run:<run id>" (remote
	// with a run id) or "window" (remote without one).
	Scope     string    `json:"scope"`
	FirstSeen time.Time `json:"first_seen"`
	Transport string    `json:"transport"`
	// Local agent process: pid, executable, command line, start time and uid.
	PID       int       `json:"pid,omitempty"`
	Exe       string    `json:"exe,omitempty"`
	Cmdline   []string  `json:"cmdline,omitempty"`
	StartTime time.Time `json:"start_time,omitzero"`
	UID       *int      `json:"uid,omitempty"`
	// Remote agent: the run id it named and the token's actor name.
	RunID string `json:"run_id,omitempty"`
	Token string `json:"token,omitempty"`
	// Subject is the OAuth access token's sub of the run's first call ("" for Postern's own
	// tokens); each call names its own (Call.Subject).
	Subject string `json:"subject,omitempty"`
}

// Bounds on what a run record keeps.
const (
	maxCmdlineArgs  = 64
	maxCmdlineBytes = 4096
)

// bound cuts a run's command line to maxCmdlineArgs arguments and maxCmdlineBytes in all.
func (r *Run) bound() {
	n := 0
	for i, a := range r.Cmdline {
		if i == maxCmdlineArgs || n+len(a) > maxCmdlineBytes {
			r.Cmdline = append(r.Cmdline[:i:i], "…")
			return
		}
		n += len(a)
	}
}

// KindJoined is an event that changes nothing in its record: a call joined, replayed or
// was refused because of the execution (Event.Call says which). Its record is the record as
// it stood.
const KindJoined EventKind = "joined"

// CreateFor is Create for the call that asked for the execution: the create event carries
// call (and call.NewRun becomes the run's record) in the same durable write.
func (s *Store) CreateFor(ctx context.Context, r *Record, call *Call) (*Record, error) {
	return s.create(ctx, r, nil, "", call)
}

// Joined journals a call that touched execution id without changing it, as a joined event
// carrying call and the record as it stands. It returns once durable.
func (s *Store) Joined(ctx context.Context, id string, call *Call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock := s.locks.Lock(id)
	defer unlock()
	if err := s.readable(); err != nil {
		return err
	}
	v, closer, err := s.db.Get(recordKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("markers: get %s: %w", id, err)
	}
	encoded := append([]byte(nil), v...)
	closer.Close()
	rec, err := DecodeRecord(encoded)
	if err != nil {
		return err
	}
	w, err := PlanJoined(rec, encoded, call, s.now())
	if err != nil {
		return err
	}
	return s.submit(&commitReq{Write: w})
}

// Run returns the record of actor's agent run scope, or ErrNotFound.
func (s *Store) Run(actor, scope string) (*Run, error) {
	if err := s.readable(); err != nil {
		return nil, err
	}
	r, err := s.runAt(runKey(actor, scope))
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: no run %s of %s", ErrNotFound, scope, actor)
	}
	return r, err
}

// RunQuery selects runs for Runs.
type RunQuery struct {
	// Actor, if set, selects that actor's runs.
	Actor string
	// Limit is the most runs returned, newest first seen first. Default 100, at most 1000.
	Limit int
}

// Runs lists agent runs, newest first seen first.
func (s *Store) Runs(q RunQuery) ([]*Run, error) {
	if err := s.readable(); err != nil {
		return nil, err
	}
	limit := q.PageSize()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{pRunTime}, UpperBound: []byte{pRunTime + 1}})
	if err != nil {
		return nil, fmt.Errorf("markers: runs: %w", err)
	}
	defer it.Close()
	var out []*Run
	seen := map[string]bool{} // two writes in one commit may both have indexed a new run
	for ok := it.Last(); ok && len(out) < limit; ok = it.Prev() {
		if seen[string(it.Value())] {
			continue
		}
		seen[string(it.Value())] = true
		r, err := s.runAt(it.Value())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if q.Actor == "" || r.Actor == q.Actor {
			out = append(out, r)
		}
	}
	return out, it.Error()
}

func (s *Store) runAt(key []byte) (*Run, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("markers: run: %w", err)
	}
	defer closer.Close()
	var r Run
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("%w: run: %v", ErrCorrupt, err)
	}
	return &r, nil
}

// stageRun adds a run's record and its time index entry to b, unless the run is already
// recorded: the first contact stays.
func (s *Store) stageRun(b *pebble.Batch, r *Run) error {
	key := runKey(r.Actor, r.Scope)
	if _, closer, err := s.db.Get(key); err == nil {
		closer.Close()
		return nil
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return errors.Join(b.Set(key, v, nil), b.Set(runTimeKey(r.FirstSeen, r.Actor, r.Scope), key, nil))
}

func runKey(actor, scope string) []byte { return joinKey(pRun, actor, scope) }

func runTimeKey(t time.Time, actor, scope string) []byte {
	k := binary.BigEndian.AppendUint64([]byte{pRunTime}, uint64(t.UnixNano()))
	return append(k, joinKey(0, actor, scope)[1:]...)
}

// SiblingIDs returns the ids of actor's executions with fingerprint in intent scope, oldest
// first: the executions of one intent (a new one after a delivered result, a new attempt of
// a failed keyed one). At most limit.
func (s *Store) SiblingIDs(actor, scope, fingerprint string, limit int) ([]string, error) {
	if err := s.readable(); err != nil {
		return nil, err
	}
	prefix := append(joinKey(pSiblings, actor, scope, fingerprint), 0)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, fmt.Errorf("markers: siblings: %w", err)
	}
	defer it.Close()
	var ids []string
	for ok := it.First(); ok && len(ids) < limit; ok = it.Next() {
		ids = append(ids, string(it.Key()[len(prefix):]))
	}
	return ids, it.Error()
}
