package markers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Write is one planned change of a record — a create, a transition, an update, a joined
// call — with its events, computed by the same rules for every journal backend so that
// both produce the same records, the same events and the same hash chain. A backend commits
// a Write atomically: the record, its index entries, its result and its chained events
// (Chain) together or not at all.
type Write struct {
	rec     *Record
	prev    *Record // nil on create
	encoded []byte  // EncodeRecord(rec)
	// steps are the events of the write, in order; the last one carries rec.
	steps []step
	// result, if set, is stored under the record's result key in the same write.
	result []byte
	// call, if set, is the tool call the write is for: carried by its first event, and its
	// NewRun recorded with it.
	call *Call
	// at, if set, is the event time (a joined event does not change the record's times).
	at time.Time
	// carried (a carried event): the event lines it carries; the write also drops the
	// record's event index up to the last of them (dropTo).
	carried [][]byte
	dropTo  uint64
}

// Record is the record as the write leaves it (the caller's to clone, not to change).
func (w *Write) Record() *Record { return w.rec }

// Prev is the record the write changes, nil for a create.
func (w *Write) Prev() *Record { return w.prev }

// NewRun is the agent run the write's call names, if the call carries its identity: a
// backend records it unless the run is already recorded (the first contact stays).
func (w *Write) NewRun() *Run {
	if w.call == nil {
		return nil
	}
	run := w.call.NewRun
	if run == nil {
		run = w.call.RunIdentity
	}
	if run != nil {
		run.bound()
	}
	return run
}

// Events is the number of events the write appends.
func (w *Write) Events() int { return len(w.steps) }

// KV is one key and its value in the journal's key layout (see keys.go).
type KV struct{ Key, Value []byte }

// ChainedEvent is one event line of a write, at its place in the chain.
type ChainedEvent struct {
	Seq  uint64
	Line []byte // as exported: the JSON line with this_hash, no newline
}

// Chain seals the write's events after head and returns them with the new head.
func (w *Write) Chain(head ChainPos) ([]ChainedEvent, ChainPos, error) {
	at := w.rec.UpdatedAt
	if !w.at.IsZero() {
		at = w.at
	}
	out := make([]ChainedEvent, 0, len(w.steps))
	for i, st := range w.steps {
		ev := Event{
			Seq:         head.Seq + 1,
			At:          at,
			ExecutionID: w.rec.ID,
			Kind:        st.kind,
			From:        st.from,
			To:          st.to,
			Note:        st.note,
			Record:      st.record[1:],
			PrevHash:    head.Hash,
		}
		if i == 0 {
			ev.Call = w.call // the write's first event: the create, joined or update
			for _, line := range w.carried {
				ev.Carried = append(ev.Carried, line)
			}
		}
		line, err := ev.seal()
		if err != nil {
			return nil, head, err
		}
		out = append(out, ChainedEvent{Seq: ev.Seq, Line: line})
		head = ChainPos{Seq: ev.Seq, Hash: ev.ThisHash}
	}
	return out, head, nil
}

// ChainKeys are the keys the write's chained events take: each event line and its entry in
// the record's event index.
func (w *Write) ChainKeys(events []ChainedEvent) []KV {
	kvs := make([]KV, 0, 2*len(events))
	for _, ev := range events {
		kvs = append(kvs, KV{seqKey(pEvent, ev.Seq), ev.Line}, KV{execEventKey(w.rec.ID, ev.Seq), nil})
	}
	return kvs
}

// DeleteRanges are the key ranges the write deletes: a carried event's part of its record's
// event index (the events it carries, which the pass then prunes).
func (w *Write) DeleteRanges() []Family {
	if w.steps[0].kind != KindCarried {
		return nil
	}
	f := ExecEventFamily(w.rec.ID)
	return []Family{{f.Start, execEventKey(w.rec.ID, w.dropTo+1)}}
}

// CarriedBytes is the size of the event lines a carried event carries (0 for any other).
func (w *Write) CarriedBytes() int {
	n := 0
	for _, l := range w.carried {
		n += len(l)
	}
	return n
}

// Mutations are the keys the write sets and deletes besides its events and run: the
// record, its result, and its secondary index entries.
func (w *Write) Mutations() (puts []KV, dels [][]byte) {
	if k := w.steps[0].kind; k != KindJoined && k != KindCarried { // those leave the record as it is
		puts = append(puts, KV{recordKey(w.rec.ID), w.encoded})
	}
	if w.result != nil {
		puts = append(puts, KV{resultKey(w.rec.ID), w.result})
	}
	if w.prev == nil {
		for _, e := range indexEntries(w.rec) {
			puts = append(puts, KV{e.key, e.value})
		}
	} else if w.prev.State != w.rec.State {
		dels = append(dels, stateKey(w.prev.State, w.prev.ID))
		puts = append(puts, KV{stateKey(w.rec.State, w.rec.ID), nil})
	}
	return puts, dels
}

// PlanCreate plans the create of r in g's initial state at now, followed by the steps of
// path (each an event with note), its first event carrying call.
func (g Graph) PlanCreate(r *Record, path []State, note string, call *Call, now time.Time) (*Write, error) {
	if len(path) > 0 {
		if err := g.checkPath(g.Initial(), path); err != nil {
			return nil, err
		}
	}
	rec := r.Clone()
	if rec.Graph == "" {
		rec.Graph = g
	}
	if rec.Graph != g {
		return nil, fmt.Errorf("markers: create %s: a %s record in a %s store", rec.ID, rec.Graph, g)
	}
	if rec.State == "" {
		rec.State = g.Initial()
	}
	if rec.State != g.Initial() {
		return nil, fmt.Errorf("%w: records are created %s, not %s", ErrIllegalTransition, g.Initial(), rec.State)
	}
	if err := rec.validateIdentity(); err != nil {
		return nil, fmt.Errorf("markers: create: %w", err)
	}
	rec.CreatedAt, rec.UpdatedAt = now, now
	rec.StateTimes = map[State]time.Time{rec.State: now}
	// Review required holds only while the outcome is unknown: a record created along a path
	// to unknown (postern recover) carries it from that step on, not before.
	review := rec.ReviewRequired
	if review && (len(path) == 0 || path[len(path)-1] != Unknown) {
		return nil, fmt.Errorf("markers: create %s: review required is for unknown outcomes, and it is not created unknown", rec.ID)
	}
	rec.ReviewRequired = false
	encoded, err := EncodeRecord(rec)
	if err != nil {
		return nil, err
	}
	steps := []step{{kind: KindCreate, to: rec.State, record: encoded}}
	for i, to := range path {
		from := rec.State
		advanceState(rec, to, now)
		rec.ReviewRequired = review && i == len(path)-1
		if encoded, err = EncodeRecord(rec); err != nil {
			return nil, err
		}
		steps = append(steps, step{kind: KindTransition, from: from, to: to, note: note, record: encoded})
	}
	return &Write{rec: rec, encoded: encoded, steps: steps, call: call}, nil
}

// PlanJoined plans a joined event for call on rec as it stands (encoded, if known, is its
// encoding as stored), at at.
func PlanJoined(rec *Record, encoded []byte, call *Call, at time.Time) (*Write, error) {
	if encoded == nil {
		var err error
		if encoded, err = EncodeRecord(rec); err != nil {
			return nil, err
		}
	}
	return &Write{rec: rec, prev: rec, encoded: encoded, at: at, call: call,
		steps: []step{{kind: KindJoined, from: rec.State, to: rec.State, record: encoded}}}, nil
}

// maxCarriedBytes bounds the event lines one carried event carries; a record with more in a
// pruned prefix gets several.
const maxCarriedBytes = 256 << 10

// PlanCarries plans the carried events of rec as it stands, at at: entries are the record's
// events in a prefix of the chain a pass prunes (its event index's sequence numbers and the
// lines), in order. Each carried event carries the lines of a run of entries — an entry
// that is itself a carried event (an earlier pass's) gives the lines it carries, so lines
// are carried once, never nested — and drops those entries from the record's event index.
// The record itself is not written: each carried event holds it as it is.
func PlanCarries(rec *Record, entries []LogEntry, at time.Time) ([]*Write, error) {
	encoded, err := EncodeRecord(rec)
	if err != nil {
		return nil, err
	}
	var writes []*Write
	var lines [][]byte
	size := 0
	flush := func(dropTo uint64) {
		if len(lines) == 0 {
			return
		}
		first, last := lineSeq(lines[0]), lineSeq(lines[len(lines)-1])
		writes = append(writes, &Write{rec: rec, prev: rec, encoded: encoded, at: at, dropTo: dropTo, carried: lines,
			steps: []step{{kind: KindCarried, from: rec.State, to: rec.State, record: encoded,
				note: fmt.Sprintf("events %d..%d carried forward: the chain's prefix holding them was pruned by retention", first, last)}}})
		lines, size = nil, 0
	}
	for i, e := range entries {
		own, err := carriedLines(e.Value)
		if err != nil {
			return nil, fmt.Errorf("markers: carry %s: event %d: %w", rec.ID, e.Seq, err)
		}
		n := 0
		for _, l := range own {
			n += len(l)
		}
		if size > 0 && size+n > maxCarriedBytes {
			flush(entries[i-1].Seq)
		}
		lines, size = append(lines, own...), size+n
	}
	if len(entries) > 0 {
		flush(entries[len(entries)-1].Seq)
	}
	return writes, nil
}

// carriedLines are the original event lines an event line stands for: itself, or the lines
// a carried event carries.
func carriedLines(line []byte) ([][]byte, error) {
	if !bytes.Contains(line, []byte(`"kind":"carried"`)) {
		return [][]byte{line}, nil
	}
	var ev Event
	if err := json.Unmarshal(line, &ev); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if ev.Kind != KindCarried {
		return [][]byte{line}, nil
	}
	out := make([][]byte, len(ev.Carried))
	for i, l := range ev.Carried {
		out[i] = l
	}
	return out, nil
}

// lineSeq is the sequence number of an event line (0 if it has none).
func lineSeq(line []byte) uint64 {
	var ev struct {
		Seq uint64 `json:"seq"`
	}
	head := line
	if i := bytes.Index(line, []byte(`,"at":`)); i > 0 {
		head = append(line[:i:i], '}')
	}
	if json.Unmarshal(head, &ev) != nil {
		return 0
	}
	return ev.Seq
}

// PlanChange plans a change of cur (the record as last committed; not modified): a
// transition from → path (checked against the graph by the caller), an update or a
// delivery revocation, mutate applied to the final record, at now. When there is nothing to
// write it returns a nil Write with the record to answer and the error to answer with: nil
// when cur already is in path's last state (re-applying a transition is idempotent),
// ErrConflict when it is in another state than from, errUnchanged when mutate left it as it is.
func PlanChange(cur *Record, kind EventKind, from State, path []State, note string, result []byte, call *Call, now time.Time, mutate func(*Record) error) (*Write, *Record, error) {
	id := cur.ID
	if kind == KindTransition && cur.State != from {
		if cur.State == path[len(path)-1] {
			return nil, cur.Clone(), nil
		}
		return nil, cur.Clone(), fmt.Errorf("%w: %s is %s, not %s", ErrConflict, id, cur.State, from)
	}
	next := cur.Clone()
	if mutate != nil {
		if err := mutate(next); errors.Is(err, errUnchanged) {
			return nil, cur.Clone(), err
		} else if err != nil {
			return nil, nil, fmt.Errorf("markers: %s %s: %w", kind, id, err)
		}
	}
	if !next.sameIdentity(cur) || next.State != cur.State {
		return nil, nil, fmt.Errorf("%w (%s)", ErrImmutable, id)
	}
	// Review required holds only while the outcome is unknown: a way out of unknown clears it.
	switch {
	case kind == KindUpdate && next.ReviewRequired && next.State != Unknown:
		return nil, nil, fmt.Errorf("markers: update %s: review required is for unknown outcomes, and it is %s", id, next.State)
	case kind == KindTransition && path[len(path)-1] != Unknown:
		next.ReviewRequired = false
	}
	next.UpdatedAt = now
	if kind != KindTransition {
		path = []State{cur.State}
	}
	// Each step's event carries the record as that step left it: intermediate steps show the
	// state reached without mutate's changes (cloned only for multi-step paths); the last
	// carries the mutated record that is stored.
	steps := make([]step, 0, len(path))
	var base *Record
	last := len(path) - 1
	for i, to := range path {
		stepFrom := cur.State
		if i > 0 {
			stepFrom = path[i-1]
		}
		rec := next
		if kind == KindTransition {
			advanceState(next, to, now)
			if i < last {
				if base == nil {
					base = cur.Clone()
					base.UpdatedAt = now
				}
				advanceState(base, to, now)
				base.ReviewRequired = base.ReviewRequired && to == Unknown
				rec = base
			}
		}
		encoded, err := EncodeRecord(rec)
		if err != nil {
			return nil, nil, err
		}
		steps = append(steps, step{kind: kind, from: stepFrom, to: to, note: note, record: encoded})
	}
	return &Write{rec: next, prev: cur, encoded: steps[len(steps)-1].record, steps: steps, result: result, call: call}, nil, nil
}

// ErrUnchanged is what a mutate function returns to leave the record as it is (nothing is
// written); RevokeDelivery's callers see it as "not revoked".
var ErrUnchanged = errUnchanged

// CheckPath checks that from → path[0] → … is a path of g's edges.
func (g Graph) CheckPath(from State, path []State) error { return g.checkPath(from, path) }

// GenesisHash is the prev_hash of a journal's first event.
func GenesisHash() string { return genesisHash }

// SignCheckpoint signs a checkpoint of the chain at head (see checkpointBody).
func SignCheckpoint(opts *Options, head ChainPos, at time.Time) ([]byte, error) {
	return signCheckpoint(opts.Signer, opts.Origin, head.Seq, head.Hash, at)
}

// CheckpointSeq is the sequence number a checkpoint this package signed covers (its
// signature is not checked).
func CheckpointSeq(signed []byte) (uint64, error) {
	cp, err := parseOwnCheckpoint(signed)
	return cp.Seq, err
}
