package ctxtime

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Sleep(context.Background(), time.Minute) {
			t.Fatal("Sleep = false; want true once the minute passed")
		}
		if got := time.Since(start); got != time.Minute {
			t.Fatalf("slept %v; want 1m", got)
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		if Sleep(ctx, time.Hour) {
			t.Fatal("Sleep = true; want false when the context ends first")
		}
		if got := time.Since(start); got != time.Minute+time.Second {
			t.Fatalf("woke after %v; want 1m1s", got)
		}
	})
}
