package markers

import "sync"

// keyLocks is a set of mutexes keyed by string, created on demand and dropped when unused,
// so any number of distinct execution ids can be locked without striping collisions.
type keyLocks struct {
	mu    sync.Mutex // guards locks
	locks map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int // guarded by keyLocks.mu
}

// lock locks key and returns its unlock function.
func (l *keyLocks) lock(key string) (unlock func()) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = make(map[string]*keyLock)
	}
	k := l.locks[key]
	if k == nil {
		k = &keyLock{}
		l.locks[key] = k
	}
	k.refs++
	l.mu.Unlock()

	k.mu.Lock()
	return func() {
		k.mu.Unlock()
		l.mu.Lock()
		k.refs--
		if k.refs == 0 {
			delete(l.locks, key)
		}
		l.mu.Unlock()
	}
}
