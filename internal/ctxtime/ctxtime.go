// Package ctxtime waits for time to pass unless a context ends first.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
