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
	if len(path) == 0 {
		return nil, fmt.Errorf("%w: empty path", ErrIllegalTransition)
	}
	return s.create(ctx, r, path, note, call)
}

func (s *Store) create(ctx context.Context, r *Record, path []State, note string, call *Call) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w, err := s.opts.Graph.PlanCreate(r, path, note, call, s.now())
	if err != nil {
		return nil, err
	}
	unlock := s.locks.Lock(w.rec.ID)
	defer unlock()
	existing, err := s.getLocked(w.rec.ID)
	if err == nil {
		return existing.Clone(), fmt.Errorf("%w: %s is %s", ErrExists, w.rec.ID, existing.State)
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err := s.submit(&commitReq{Write: w}); err != nil {
		return nil, err
	}
	return w.rec.Clone(), nil
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
var errUnchanged = errors.New("markers: unchanged")

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
	unlock := s.locks.Lock(id)
	defer unlock()
	cur, err := s.getLocked(id)
	if err != nil {
		return nil, err
	}
	w, answer, err := PlanChange(cur, kind, from, path, note, result, call, s.now(), mutate)
	if w == nil {
		return answer, err
	}
	if err := s.submit(&commitReq{Write: w, durability: durability}); err != nil {
		return nil, err
	}
	return w.rec.Clone(), nil
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
