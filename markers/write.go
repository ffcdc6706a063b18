package markers

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Durability says when a write returns.
type Durability uint8

const (
	// Sync: the write returns once it is durable (fsynced). Every write is Sync unless its
	// caller asks otherwise.
	Sync Durability = iota
	// NoSync: the write returns once it is in Pebble's write-ahead log, before the fsync.
	// Readers see it at once, and a crash may lose it — but only together with every write
	// committed after it: the log is fsynced and replayed in order, so the next synced write
	// (any Sync write, a checkpoint, Close) makes it durable, and a crash before that leaves
	// the store and its hash chain as they were before it. Use it only for a change whose
	// loss is harmless, and say why next to the call.
	NoSync
)

// Create stores r as a new execution in its graph's initial state, if no record with r.ID
// exists. It returns once the record is durable. If one exists, it returns that record and
// an error wrapping ErrExists; nothing is written. The store sets Graph, State, CreatedAt,
// UpdatedAt and StateTimes.
func (s *Store) Create(ctx context.Context, r *Record) (*Record, error) {
	return s.create(ctx, r, nil, "", nil)
}

// CreateAdvanced is Create followed by Advance from the initial state along path, in one
// durable write (one fsync) with one event per step — the create, then a transition per
// state, note on each — for an execution whose first states are all decided when it is
// created. Nothing of it is durable before all of it is.
func (s *Store) CreateAdvanced(ctx context.Context, r *Record, path []State, note string) (*Record, error) {
	return s.CreateAdvancedFor(ctx, r, path, note, nil)
}

// CreateAdvancedFor is CreateAdvanced for the tool call that asked for the execution: the
// create event carries call (and call.NewRun becomes the run's record) in the same write.
func (s *Store) CreateAdvancedFor(ctx context.Context, r *Record, path []State, note string, call *Call) (*Record, error) {
	if err := s.opts.Graph.checkPath(s.opts.Graph.Initial(), path); err != nil {
		return nil, err
	}
	return s.create(ctx, r, path, note, call)
}

func (s *Store) create(ctx context.Context, r *Record, path []State, note string, call *Call) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec := r.Clone()
	if rec.Graph == "" {
		rec.Graph = s.opts.Graph
	}
	if rec.Graph != s.opts.Graph {
		return nil, fmt.Errorf("markers: create %s: a %s record in a %s store", rec.ID, rec.Graph, s.opts.Graph)
	}
	if rec.State == "" {
		rec.State = s.opts.Graph.Initial()
	}
	if rec.State != s.opts.Graph.Initial() {
		return nil, fmt.Errorf("%w: records are created %s, not %s", ErrIllegalTransition, s.opts.Graph.Initial(), rec.State)
	}
	if err := rec.validateIdentity(); err != nil {
		return nil, fmt.Errorf("markers: create: %w", err)
	}
	now := s.now()
	rec.CreatedAt, rec.UpdatedAt = now, now
	rec.StateTimes = map[State]time.Time{rec.State: now}
	encoded, err := EncodeRecord(rec)
	if err != nil {
		return nil, err
	}
	steps := []step{{kind: KindCreate, to: rec.State, record: encoded}}
	for _, to := range path {
		from := rec.State
		advanceState(rec, to, now)
		if encoded, err = EncodeRecord(rec); err != nil {
			return nil, err
		}
		steps = append(steps, step{kind: KindTransition, from: from, to: to, note: note, record: encoded})
	}

	unlock := s.locks.lock(rec.ID)
	defer unlock()
	existing, err := s.getLocked(rec.ID)
	if err == nil {
		return existing.Clone(), fmt.Errorf("%w: %s is %s", ErrExists, rec.ID, existing.State)
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err := s.submit(&commitReq{rec: rec, encoded: encoded, steps: steps, call: call}); err != nil {
		return nil, err
	}
	return rec.Clone(), nil
}

// Transition moves execution id from state from to state to, if the record is in from, and
// applies mutate (which may set outcome fields, not identity fields) in the same write. It
// returns once durable.
//
// If the record is already in to (someone applied this transition first), it is returned
// unchanged with a nil error and mutate is not applied: re-applying a transition is
// idempotent. If it is in any other state, the current record is returned with ErrConflict.
// An edge not in the graph is ErrIllegalTransition.
func (s *Store) Transition(ctx context.Context, id string, from, to State, note string, mutate func(*Record) error) (*Record, error) {
	return s.Advance(ctx, id, from, []State{to}, note, mutate)
}

// TransitionWith is Transition with the write's durability chosen by the caller (see NoSync).
func (s *Store) TransitionWith(ctx context.Context, id string, from, to State, note string, d Durability, mutate func(*Record) error) (*Record, error) {
	if err := s.opts.Graph.checkPath(from, []State{to}); err != nil {
		return nil, err
	}
	return s.change(ctx, id, KindTransition, from, []State{to}, note, nil, d, mutate)
}

// Advance is Transition along several edges at once — from → path[0] → … → path[n-1] — in
// one durable write with one event per step, for states that are all already facts (a
// command observed running and exited before its running state was written). mutate applies
// to the final record. The same idempotence and conflict rules hold for the final state.
func (s *Store) Advance(ctx context.Context, id string, from State, path []State, note string, mutate func(*Record) error) (*Record, error) {
	if err := s.opts.Graph.checkPath(from, path); err != nil {
		return nil, err
	}
	return s.change(ctx, id, KindTransition, from, path, note, nil, Sync, mutate)
}

// MaxResultBytes bounds a stored result.
const MaxResultBytes = 1 << 20

// AdvanceWithResult is Advance that also stores result — an execution's capped output or
// response, read back with Result — in the same durable write, so a record never claims an
// outcome whose stored result is missing. A later call replaces the result.
func (s *Store) AdvanceWithResult(ctx context.Context, id string, from State, path []State, note string, result []byte, mutate func(*Record) error) (*Record, error) {
	if len(result) > MaxResultBytes {
		return nil, fmt.Errorf("markers: result of %s is %d bytes, more than %d", id, len(result), MaxResultBytes)
	}
	if result == nil {
		result = []byte{}
	}
	if err := s.opts.Graph.checkPath(from, path); err != nil {
		return nil, err
	}
	return s.change(ctx, id, KindTransition, from, path, note, result, Sync, mutate)
}

// Update applies mutate to execution id without changing its state (checkpoints, delivery
// time, evidence) and journals it as an update event with note.
func (s *Store) Update(ctx context.Context, id, note string, mutate func(*Record) error) (*Record, error) {
	return s.change(ctx, id, KindUpdate, "", nil, note, nil, Sync, mutate)
}

// UpdateWith is Update with the write's durability chosen by the caller (see NoSync).
func (s *Store) UpdateWith(ctx context.Context, id, note string, d Durability, mutate func(*Record) error) (*Record, error) {
	return s.change(ctx, id, KindUpdate, "", nil, note, nil, d, mutate)
}

// RevokeDelivery clears the result delivery time of execution id, journaled as a
// delivery_revoked event with note, and reports whether it did: a record whose result is not
// marked delivered is returned unchanged and nothing is written.
func (s *Store) RevokeDelivery(ctx context.Context, id, note string) (*Record, bool, error) {
	rec, err := s.change(ctx, id, KindDeliveryRevoked, "", nil, note, nil, Sync, func(r *Record) error {
		if r.ResultDeliveredAt == nil {
			return errUnchanged
		}
		r.ResultDeliveredAt = nil
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return rec, false, nil
	}
	return rec, err == nil, err
}

// errUnchanged is returned by a mutate function that leaves the record as it is: nothing is
// written and change returns the current record.
var errUnchanged = errors.New("unchanged")

// UpdateFor is UpdateWith for a tool call: the update event carries call (the call that was
// delivered the result, say).
func (s *Store) UpdateFor(ctx context.Context, id, note string, call *Call, d Durability, mutate func(*Record) error) (*Record, error) {
	return s.changeFor(ctx, id, KindUpdate, "", nil, note, nil, d, call, mutate)
}

func (s *Store) change(ctx context.Context, id string, kind EventKind, from State, path []State, note string, result []byte, durability Durability, mutate func(*Record) error) (*Record, error) {
	return s.changeFor(ctx, id, kind, from, path, note, result, durability, nil, mutate)
}

func (s *Store) changeFor(ctx context.Context, id string, kind EventKind, from State, path []State, note string, result []byte, durability Durability, call *Call, mutate func(*Record) error) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	unlock := s.locks.lock(id)
	defer unlock()
	cur, err := s.getLocked(id)
	if err != nil {
		return nil, err
	}
	if kind == KindTransition && cur.State != from {
		if cur.State == path[len(path)-1] {
			return cur.Clone(), nil
		}
		return cur.Clone(), fmt.Errorf("%w: %s is %s, not %s", ErrConflict, id, cur.State, from)
	}
	next := cur.Clone()
	if mutate != nil {
		if err := mutate(next); errors.Is(err, errUnchanged) {
			return cur.Clone(), err
		} else if err != nil {
			return nil, fmt.Errorf("markers: %s %s: %w", kind, id, err)
		}
	}
	if !next.sameIdentity(cur) || next.State != cur.State {
		return nil, fmt.Errorf("%w (%s)", ErrImmutable, id)
	}
	// Review required holds only while the outcome is unknown: a way out of unknown clears it.
	switch {
	case kind == KindUpdate && next.ReviewRequired && next.State != Unknown:
		return nil, fmt.Errorf("markers: update %s: review required is for unknown outcomes, and it is %s", id, next.State)
	case kind == KindTransition && path[len(path)-1] != Unknown:
		next.ReviewRequired = false
	}
	now := s.now()
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
			return nil, err
		}
		steps = append(steps, step{kind: kind, from: stepFrom, to: to, note: note, record: encoded})
	}
	final := steps[len(steps)-1].record
	if err := s.submit(&commitReq{rec: next, prev: cur, encoded: final, durability: durability, steps: steps, result: result, call: call}); err != nil {
		return nil, err
	}
	return next.Clone(), nil
}

func (g Graph) checkPath(from State, path []State) error {
	if len(path) == 0 {
		return fmt.Errorf("%w: empty path", ErrIllegalTransition)
	}
	prev := from
	for _, to := range path {
		if err := g.checkEdge(prev, to); err != nil {
			return err
		}
		prev = to
	}
	return nil
}

func advanceState(r *Record, to State, at time.Time) {
	r.State = to
	if r.StateTimes == nil {
		r.StateTimes = map[State]time.Time{}
	}
	r.StateTimes[to] = at
}

func (s *Store) now() time.Time { return s.opts.Now().UTC() }
