package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/postern-dev/postern/internal/dirlock"
	"github.com/postern-dev/postern/internal/privdir"
)

// stateClaim is a daemon's hold on its state dir: the lock that keeps a second postern out,
// and — for `up` on a fresh machine — what to take back if it fails before serving.
type stateClaim struct {
	dir  string
	lock *dirlock.Lock
	// created is the topmost directory this run created (the state dir or an ancestor of
	// it), "" when the state dir was already there.
	created string
	// existing are the names in a pre-existing state dir just before it was locked: what
	// this run may take back is everything else (nobody else writes there while it holds
	// the lock).
	existing map[string]bool
	serving  atomic.Bool
}

// claimStateDir makes dir private (privdir: created 0700 if missing, refused if another user
// could tamper with it — before anything is written into it) and locks it. Another process
// holding it is named, with what to do: flag is how the user picks another state dir.
func claimStateDir(dir, flag string, logger *slog.Logger) (*stateClaim, error) {
	top := topMissing(dir)
	if err := privdir.Ensure(dir, "state dir", logger); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	lock, err := dirlock.Acquire(dir)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		// The dir may have been made by the holder a moment ago: it is not ours to remove.
		how := "stop it"
		if held.PID > 0 {
			how = fmt.Sprintf("stop it (kill %d)", held.PID)
		}
		return nil, fmt.Errorf("state dir %w — a postern is already running on it: use that one, %s, or pass another %s", err, how, flag)
	}
	if err != nil {
		return nil, err
	}
	c := &stateClaim{dir: dir, lock: lock, created: top, existing: map[string]bool{}}
	for _, e := range entries {
		c.existing[e.Name()] = true
	}
	return c, nil
}

// markServing records that the daemon is up: from now on its state is kept whatever happens.
func (c *stateClaim) markServing() { c.serving.Store(true) }

// release unlocks the dir. A run that never served removes what it created itself — the
// state dir and the parents it had to make, or in a dir that was already there the entries
// that were not — so a failed first `up` leaves nothing half-made, and never touches what
// was there before. Called after everything that wrote into the dir is closed.
func (c *stateClaim) release() {
	defer c.lock.Release()
	if c.serving.Load() {
		return
	}
	if c.created == "" {
		entries, _ := os.ReadDir(c.dir)
		for _, e := range entries {
			if !c.existing[e.Name()] {
				os.RemoveAll(filepath.Join(c.dir, e.Name()))
			}
		}
		return
	}
	os.RemoveAll(c.dir)
	for d := filepath.Dir(c.dir); len(d) >= len(c.created); d = filepath.Dir(d) {
		if os.Remove(d) != nil { // not empty: someone else put something there
			break
		}
	}
}

// topMissing is the topmost of dir and its ancestors that does not exist, "" if dir exists.
func topMissing(dir string) string {
	top := ""
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			return top
		}
		top = d
		if d == filepath.Dir(d) {
			return top
		}
	}
}

// portHint adds fix — the flag that moves the listener — to a listen error whose address is
// taken; other errors pass through unchanged.
func portHint(err error, fix string) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "listen" && errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: another process (another postern?) has that port — %s", err, fix)
	}
	return err
}
