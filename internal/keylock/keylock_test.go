package keylock

import (
	"sync"
	"testing"
)

// TestLockSerializesOneKeyAndForgetsIt: holders of one key go one at a time, other keys are
// not held up, and a key nobody holds leaves nothing behind.
func TestLockSerializesOneKeyAndForgetsIt(t *testing.T) {
	var s Set
	var wg sync.WaitGroup
	// counts is only read as a map; each count is written under its key's lock.
	counts := map[string]*int{"a": new(int), "b": new(int), "c": new(int)}
	var inside sync.Map // key -> a holder is inside now
	for i := range 200 {
		key := []string{"a", "b", "c"}[i%3]
		wg.Go(func() {
			unlock := s.Lock(key)
			defer unlock()
			if _, loaded := inside.LoadOrStore(key, true); loaded {
				t.Errorf("two holders of %q at once", key)
			}
			*counts[key]++ // guarded by the key's lock alone: -race reports it otherwise
			inside.Delete(key)
		})
	}
	// Another key is free while one is held.
	unlockA := s.Lock("held")
	s.Lock("other")()
	unlockA()
	wg.Wait()
	if n := *counts["a"] + *counts["b"] + *counts["c"]; n != 200 {
		t.Fatalf("%d holders counted, want 200", n)
	}
	if n := len(s.locks); n != 0 {
		t.Fatalf("%d locks left behind", n)
	}
}
