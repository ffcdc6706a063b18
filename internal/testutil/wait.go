package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// waitTimeout bounds WaitFor: generous, for busy machines; a test that waits this long has
// failed anyway.
const waitTimeout = 60 * time.Second

// WaitFor polls cond until it holds, and fails the test with "timed out waiting for what"
// once waitTimeout has passed. cond runs on the test's goroutine, so it may fail the test
// itself.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LockedBuffer is a bytes.Buffer that a process or goroutine writes while the test reads it.
type LockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
