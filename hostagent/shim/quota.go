package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// ErrSpoolFull: the spool root holds as many bytes as its cap allows, so a new execution is
// refused before anything of it exists. The error Admit returns also wraps ErrStartFailed:
// the command provably did not run.
var ErrSpoolFull = errors.New("spool is full")

// Quota caps the total size of a spool root: the directory holding every execution's spool
// directory. Admit is asked before each execution starts and refuses it once the bytes
// stored reach the cap. Running executions may still add up to their output caps beyond it:
// the cap is checked before an execution starts, never by cutting one off.
//
// Measuring is incremental. A spool directory with a status file is final, so it is
// measured once and remembered; the others (running, or never finished) are measured again
// at each Admit. A refusal is always decided on a full fresh measurement, so a directory
// removed behind the Quota's back never keeps it refusing.
type Quota struct {
	root  string
	limit int64

	mu      sync.Mutex       // guards the fields below
	scanned bool             // the root was listed once
	final   map[string]int64 // final directories: their size, measured once
	open    map[string]bool  // the other directories, measured at each Admit
}

// NewQuota returns a Quota of limit bytes on root. It reads nothing until the first Admit.
func NewQuota(root string, limit int64) *Quota {
	return &Quota{root: root, limit: limit, final: map[string]int64{}, open: map[string]bool{}}
}

// Admit returns nil if the spool has room for one more execution, whose directory will be
// root/name, and counts that directory from then on. It returns an error wrapping
// ErrSpoolFull and ErrStartFailed, saying how full the spool is and what to do, if it has
// no room; nothing is created then.
func (q *Quota) Admit(name string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.scanned {
		if err := q.rescanLocked(); err != nil {
			return err
		}
	}
	used, err := q.usedLocked()
	if err == nil && used >= q.limit {
		if err = q.rescanLocked(); err == nil {
			used, err = q.usedLocked()
		}
	}
	if err != nil {
		return err
	}
	if used >= q.limit {
		return fmt.Errorf("%w: %w: %d of %d bytes (spool_cap) hold stored output; "+
			"raise spool_cap, or lower marker_retention so older output goes sooner", ErrStartFailed, ErrSpoolFull, used, q.limit)
	}
	q.open[name] = true
	return nil
}

// Measure lists and measures the whole spool root afresh and returns the bytes it holds.
// Calling it at start moves the cost of the first full measurement out of the first Admit.
func (q *Quota) Measure() (int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.rescanLocked(); err != nil {
		return 0, err
	}
	return q.usedLocked()
}

// Forget stops counting root/name, which the caller removed.
func (q *Quota) Forget(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.final, name)
	delete(q.open, name)
}

// rescanLocked forgets everything and lists the root again.
func (q *Quota) rescanLocked() error {
	entries, err := os.ReadDir(q.root)
	if err != nil {
		return fmt.Errorf("shim: spool quota: %w", err)
	}
	clear(q.final)
	clear(q.open)
	for _, ent := range entries {
		if ent.IsDir() && !IsSpare(ent.Name()) {
			q.open[ent.Name()] = true
		}
	}
	q.scanned = true
	return nil
}

// usedLocked sums the remembered final sizes and measures the open directories, moving
// those that became final.
func (q *Quota) usedLocked() (int64, error) {
	var used int64
	for _, size := range q.final {
		used += size
	}
	for name := range q.open {
		size, final, err := measureOpenSpoolDir(filepath.Join(q.root, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Admitted but not created yet, or removed: nothing to count now.
			continue
		case err != nil:
			return 0, fmt.Errorf("shim: spool quota: %w", err)
		case final:
			delete(q.open, name)
			q.final[name] = size
		}
		used += size
	}
	return used, nil
}

// measureOpenSpoolDir measures a directory that was not final at the last look. While it
// is still open only its output streams are counted (three stats instead of a listing: this
// runs for every running execution at every Admit; the records are a few KiB); once it is
// final, everything in it.
func measureOpenSpoolDir(dir string) (size int64, final bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, StatusFile)); err == nil {
		return measureSpoolDir(dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, false, err
	}
	if _, err := os.Stat(dir); err != nil {
		return 0, false, err
	}
	for _, name := range []string{StdoutFile, StderrFile} {
		info, err := os.Stat(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the supervisor has not created it yet
		}
		if err != nil {
			return 0, false, err
		}
		size += info.Size()
	}
	return size, false, nil
}

// measureSpoolDir returns the bytes in dir's files and whether the directory is final (its
// status file exists, so nothing in it grows any more).
func measureSpoolDir(dir string) (size int64, final bool, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, false, err
	}
	for _, ent := range entries {
		info, err := ent.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // a temporary file renamed meanwhile
		}
		if err != nil {
			return 0, false, err
		}
		if info.Mode().IsRegular() {
			size += info.Size()
		}
		if ent.Name() == StatusFile {
			final = true
		}
	}
	return size, final, nil
}
