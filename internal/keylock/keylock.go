// Package keylock is a set of mutexes keyed by string, created on demand and dropped when
// unused, so any number of distinct keys (execution ids, intents) can be locked without
// striping collisions and without the set growing with every key ever locked.
package keylock

import "sync"

// Set is the zero-value-ready set of locks.
type Set struct {
	mu    sync.Mutex // guards locks
	locks map[string]*entry
}

type entry struct {
	mu   sync.Mutex // the key's lock; taken after Set.mu is released
	refs int        // guarded by Set.mu
}

// Lock locks key and returns its unlock function.
func (s *Set) Lock(key string) (unlock func()) {
	s.mu.Lock()
	if s.locks == nil {
		s.locks = make(map[string]*entry)
	}
	e := s.locks[key]
	if e == nil {
		e = &entry{}
		s.locks[key] = e
	}
	e.refs++
	s.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		s.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(s.locks, key)
		}
		s.mu.Unlock()
	}
}
