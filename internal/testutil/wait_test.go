package testutil

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fatalRecorder records a Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestWaitFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		polls := 0
		WaitFor(t, "the third poll", func() bool { polls++; return polls == 3 })
		if polls != 3 || time.Since(start) >= time.Second {
			t.Errorf("polls = %d after %v; want 3 in well under a second", polls, time.Since(start))
		}

		rec := &fatalRecorder{TB: t}
		start = time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			WaitFor(rec, "the moon", func() bool { return false })
		}()
		<-done
		if want := "timed out after 1m0s waiting for the moon"; rec.msg != want {
			t.Errorf("failure = %q; want %q", rec.msg, want)
		}
		if waited := time.Since(start); waited < waitTimeout {
			t.Errorf("gave up after %v; want %v", waited, waitTimeout)
		}
	})
}

func TestLockedBuffer(t *testing.T) {
	var b LockedBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprint(&b, "x")
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 800) {
		t.Errorf("got %d bytes; want 800 x", len(got))
	}
}
