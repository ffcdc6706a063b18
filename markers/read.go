package markers

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Get returns the durable record of execution id, or ErrNotFound. The record is the
// caller's own copy.
func (s *Store) Get(id string) (*Record, error) {
	unlock := s.locks.Lock(id)
	defer unlock()
	rec, err := s.getLocked(id)
	if err != nil {
		return nil, err
	}
	return rec.Clone(), nil
}

// getLocked reads a record; the caller holds id's lock, so the record is durable. The record
// may be the cache's: the caller must not mutate it, nor hand it out without cloning it.
func (s *Store) getLocked(id string) (*Record, error) {
	if err := s.readable(); err != nil {
		return nil, err
	}
	return s.getRecord(id)
}

// getRecord is getLocked for a caller that keeps the store open (a retention pass).
func (s *Store) getRecord(id string) (*Record, error) {
	if rec := s.records.get(id); rec != nil {
		return rec, nil
	}
	key := recordKey(id)
	if !s.present.mayContain(key) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("markers: get %s: %w", id, err)
	}
	defer closer.Close()
	rec, err := DecodeRecord(v)
	if err != nil {
		return nil, err
	}
	s.records.put(rec)
	return rec, nil
}

// Result returns the result stored with execution id by AdvanceWithResult, or ErrNotFound.
func (s *Store) Result(id string) ([]byte, error) {
	unlock := s.locks.Lock(id)
	defer unlock()
	if err := s.readable(); err != nil {
		return nil, err
	}
	v, closer, err := s.db.Get(resultKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: no result for %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("markers: result %s: %w", id, err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

func (s *Store) readable() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// FindByFingerprint returns the newest execution of actor with fingerprint in intent scope
// and no idempotency key (keyed executions are found by FindByIdempotencyKey), or
// ErrNotFound — a *RemovedError when retention removed it. The caller applies the matching
// rule (state, attach window) to it.
func (s *Store) FindByFingerprint(actor, scope, fingerprint string) (*Record, error) {
	return s.follow(fingerprintKey(actor, scope, fingerprint))
}

// FindByIdempotencyKey returns the newest execution that carried key in key space space
// (SharedKeySpace, or an actor for the records made before principals: KeySpace), or
// ErrNotFound (a *RemovedError when retention removed it).
func (s *Store) FindByIdempotencyKey(space, key string) (*Record, error) {
	return s.follow(idempotencyKey(space, key))
}

// FindByOperationKey returns the newest execution with the host-scoped operation key, or
// ErrNotFound.
func (s *Store) FindByOperationKey(key string) (*Record, error) {
	return s.follow(operationKey(key))
}

// follow reads a pointer index entry and returns the record it names.
func (s *Store) follow(key []byte) (*Record, error) {
	if err := s.readable(); err != nil {
		return nil, err
	}
	if !s.present.mayContain(key) {
		return nil, ErrNotFound
	}
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("markers: index lookup: %w", err)
	}
	id, err := lookupAnswer(v)
	closer.Close()
	if err != nil {
		return nil, err
	}
	return s.Get(id)
}

// Query selects records for List.
type Query struct {
	// State, if set, selects records in that state (using the state index).
	State State
	// Actor, if set, selects that actor's records (the actor index, without State).
	Actor string
	// Scope, with Actor, selects that agent run's records (the run index, without State).
	Scope string
	// Since and Until, if set, bound CreatedAt to [Since, Until).
	Since, Until time.Time
	// Newest lists newest first; otherwise oldest first.
	Newest bool
	// Limit is the page size. Default 100, at most 1000.
	Limit int
	// Cursor continues a previous List from where it stopped (its returned next cursor).
	Cursor string
}

// MaxPage is the most records (or runs) one List (or Runs) returns.
const MaxPage = 1000

// PageSize is the most records one List of q returns: Limit, 100 when unset, at most 1000.
func (q Query) PageSize() int { return pageSize(q.Limit) }

// PageSize is the most runs one Runs of q returns: Limit, 100 when unset, at most 1000.
func (q RunQuery) PageSize() int { return pageSize(q.Limit) }

func pageSize(limit int) int {
	if limit <= 0 {
		return 100
	}
	return min(limit, MaxPage)
}

// Selects reports whether rec passes q's actor, scope and time filters: List applies them,
// on any backend, to each record its index scan (ListBounds) finds.
func (q Query) Selects(rec *Record) bool {
	return (q.Actor == "" || rec.Actor == q.Actor) && (q.Actor == "" || q.Scope == "" || rec.IntentScope == q.Scope) &&
		(q.Since.IsZero() || !rec.CreatedAt.Before(q.Since)) &&
		(q.Until.IsZero() || rec.CreatedAt.Before(q.Until))
}

// ErrInvalidCursor: a List cursor that no List of this journal handed out.
var ErrInvalidCursor = errors.New("markers: list: invalid cursor")

// ListRange is the key range [Lower, Upper) a List scans, on any backend, and where the
// execution id sits in its keys.
type ListRange struct {
	Lower, Upper []byte
	// idAt is the offset of the id in a key of the range.
	idAt int
}

// ID is the execution id of key, a key of the range.
func (r ListRange) ID(key []byte) string { return string(key[r.idAt:]) }

// ListBounds is the key range a List of q scans: the state index when q names a state; else
// the run index for an actor and a scope, the actor index for an actor — when indexed, the
// journal holds them (index.go) — and otherwise the time index, bounded by Since and Until;
// a cursor narrows it past its key. A cursor that is not a key of the scanned index is
// ErrInvalidCursor.
func ListBounds(q Query, indexed bool) (ListRange, error) {
	var r ListRange
	var prefix []byte // the keys' common prefix: a cursor must start with it
	switch {
	case q.State != "":
		prefix = append(joinKey(pState, string(q.State)), 0)
		r = ListRange{Lower: prefix, Upper: prefixEnd(prefix), idAt: len(prefix)}
	case q.Actor != "" && indexed:
		prefix = actorPrefix(q.Actor)
		if q.Scope != "" {
			prefix = runPrefix(q.Actor, q.Scope)
		}
		r = ListRange{Lower: prefix, Upper: prefixEnd(prefix), idAt: len(prefix) + 8}
		if !q.Since.IsZero() {
			r.Lower = timedKey(prefix, q.Since, "")
		}
		if !q.Until.IsZero() {
			r.Upper = timedKey(prefix, q.Until, "")
		}
	default:
		prefix = []byte{pTime}
		r = ListRange{Lower: []byte{pTime}, Upper: []byte{pTime + 1}, idAt: 9}
		if !q.Since.IsZero() {
			r.Lower = timePrefix(q.Since)
		}
		if !q.Until.IsZero() {
			r.Upper = timePrefix(q.Until)
		}
	}
	if q.Cursor == "" {
		return r, nil
	}
	c, err := hex.DecodeString(q.Cursor)
	if err != nil || !bytes.HasPrefix(c, prefix) || len(c) <= r.idAt {
		return ListRange{}, ErrInvalidCursor
	}
	if q.Newest {
		r.Upper = c
	} else {
		r.Lower = append(c, 0)
	}
	return r, nil
}

// List returns one page of records matching q, and the cursor of the next page ("" when
// this was the last).
func (s *Store) List(q Query) ([]*Record, string, error) {
	if err := s.readable(); err != nil {
		return nil, "", err
	}
	limit := q.PageSize()
	r, err := ListBounds(q, s.indexed)
	if err != nil {
		return nil, "", err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: r.Lower, UpperBound: r.Upper})
	if err != nil {
		return nil, "", fmt.Errorf("markers: list: %w", err)
	}
	defer it.Close()
	first, next := it.First, it.Next
	if q.Newest {
		first, next = it.Last, it.Prev
	}
	var out []*Record
	var lastKey []byte
	for ok := first(); ok; ok = next() {
		if len(out) == limit {
			return out, hex.EncodeToString(lastKey), nil
		}
		lastKey = append(lastKey[:0], it.Key()...)
		rec, err := s.Get(r.ID(it.Key()))
		if errors.Is(err, ErrNotFound) {
			continue // removed by retention after the scan began
		}
		if err != nil {
			return nil, "", err
		}
		if q.Selects(rec) {
			out = append(out, rec)
		}
	}
	return out, "", it.Error()
}

// Events returns the events of execution id in order: the story of the execution, with the
// events carried forward past a pruned prefix of the chain in their place (StoryOf).
func (s *Store) Events(id string) ([]Event, error) {
	unlock := s.locks.Lock(id) // events of a write in flight are not durable yet
	defer unlock()
	if err := s.readable(); err != nil {
		return nil, err
	}
	prefix := append(joinKey(pExecEvents, id), 0)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, fmt.Errorf("markers: events of %s: %w", id, err)
	}
	defer it.Close()
	var out []Event
	for ok := it.First(); ok; ok = it.Next() {
		seq, err := seqOf(append([]byte{pEvent}, it.Key()[len(prefix):]...))
		if err != nil {
			return nil, err
		}
		v, closer, err := s.db.Get(seqKey(pEvent, seq))
		if errors.Is(err, pebble.ErrNotFound) {
			continue // pruned by event retention
		}
		if err != nil {
			return nil, fmt.Errorf("markers: event %d: %w", seq, err)
		}
		var ev Event
		err = json.Unmarshal(v, &ev)
		closer.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: event %d: %v", ErrCorrupt, seq, err)
		}
		out = append(out, ev)
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	return StoryOf(out)
}
