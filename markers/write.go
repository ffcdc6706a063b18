package markers

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Create stores r as a new execution in its graph's initial state, if no record with r.ID
// exists. It returns once the record is durable. If one exists, it returns that record and
// an error wrapping ErrExists; nothing is written. The store sets Graph, State, CreatedAt,
// UpdatedAt and StateTimes.
func (s *Store) Create(ctx context.Context, r *Record) (*Record, error) {
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

	unlock := s.locks.lock(rec.ID)
	defer unlock()
	existing, err := s.getLocked(rec.ID)
	if err == nil {
		return existing, fmt.Errorf("%w: %s is %s", ErrExists, rec.ID, existing.State)
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err := s.submit(&commitReq{rec: rec, encoded: encoded, kind: KindCreate, to: rec.State}); err != nil {
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
	if err := s.opts.Graph.checkEdge(from, to); err != nil {
		return nil, err
	}
	return s.change(ctx, id, KindTransition, from, to, note, mutate)
}

// Update applies mutate to execution id without changing its state (checkpoints, delivery
// time, evidence) and journals it as an update event with note.
func (s *Store) Update(ctx context.Context, id, note string, mutate func(*Record) error) (*Record, error) {
	return s.change(ctx, id, KindUpdate, "", "", note, mutate)
}

func (s *Store) change(ctx context.Context, id string, kind EventKind, from, to State, note string, mutate func(*Record) error) (*Record, error) {
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
		if cur.State == to {
			return cur, nil
		}
		return cur, fmt.Errorf("%w: %s is %s, not %s", ErrConflict, id, cur.State, from)
	}
	next := cur.Clone()
	if mutate != nil {
		if err := mutate(next); err != nil {
			return nil, fmt.Errorf("markers: %s %s: %w", kind, id, err)
		}
	}
	if !next.sameIdentity(cur) || next.State != cur.State {
		return nil, fmt.Errorf("%w (%s)", ErrImmutable, id)
	}
	now := s.now()
	next.UpdatedAt = now
	if kind == KindTransition {
		next.State = to
		if next.StateTimes == nil {
			next.StateTimes = map[State]time.Time{}
		}
		next.StateTimes[to] = now
	} else {
		from, to = cur.State, cur.State
	}
	encoded, err := EncodeRecord(next)
	if err != nil {
		return nil, err
	}
	if err := s.submit(&commitReq{rec: next, prev: cur, encoded: encoded, kind: kind, from: from, to: to, note: note}); err != nil {
		return nil, err
	}
	return next.Clone(), nil
}

func (s *Store) now() time.Time { return s.opts.Now().UTC() }
