package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
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

	mu         sync.Mutex       // guards the fields below
	scanned    bool             // the root was listed once
	final      map[string]int64 // final directories: their size, measured once
	finalBytes int64            // the sum of final
	open       map[string]bool  // the other directories, measured again when stale
	openBytes  int64            // what open held at measuredAt
	measuredAt time.Time
}

// quotaMeasureEvery bounds how often Admit measures the open directories again: each costs a
// few stats, and at 64 concurrent starts that was hundreds of stats per start. An ended
// execution is counted at once (Finished), so only the running ones' growth may be up to this
// old — and the cap never bounded that: it is checked before an execution starts, never by
// cutting one off. A refusal is always decided on a fresh measurement.
const quotaMeasureEvery = 100 * time.Millisecond

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
	used, err := q.usedLocked(false)
	if err == nil && used >= q.limit {
		if err = q.rescanLocked(); err == nil {
			used, err = q.usedLocked(true)
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
	return q.usedLocked(true)
}

// Finished counts root/name, whose execution has ended, as final: measured once now, so an
// ended execution's output counts at the next Admit whatever the staleness of the running
// ones' measurement.
func (q *Quota) Finished(name string) {
	size, final, err := measureSpoolDir(filepath.Join(q.root, name))
	if err != nil || !final {
		return // left open: measured with the running ones
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.open[name]; !ok {
		return // forgotten meanwhile, or already final
	}
	delete(q.open, name)
	q.final[name] = size
	q.finalBytes += size
}

// Forget stops counting root/name, which the caller removed.
func (q *Quota) Forget(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.finalBytes -= q.final[name]
	delete(q.final, name)
	delete(q.open, name)
}

// rescanLocked forgets everything and lists the root again.
func (q *Quota) rescanLocked() error {
	entries, err := os.ReadDir(q.root)
	if err != nil {
		return fmt.Errorf("supervisor: spool quota: %w", err)
	}
	clear(q.final)
	clear(q.open)
	q.finalBytes, q.measuredAt = 0, time.Time{}
	for _, ent := range entries {
		if ent.IsDir() && !IsSpare(ent.Name()) {
			q.open[ent.Name()] = true
		}
	}
	q.scanned = true
	return nil
}

// usedLocked sums the remembered final sizes and the open directories' — measured again if
// fresh is set or the last measurement is stale — moving those that became final.
func (q *Quota) usedLocked(fresh bool) (int64, error) {
	if !fresh && time.Since(q.measuredAt) < quotaMeasureEvery {
		return q.finalBytes + q.openBytes, nil
	}
	var open int64
	for name := range q.open {
		size, final, err := measureOpenSpoolDir(filepath.Join(q.root, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Admitted but not created yet, or removed: nothing to count now.
			continue
		case err != nil:
			return 0, fmt.Errorf("supervisor: spool quota: %w", err)
		case final:
			delete(q.open, name)
			q.final[name] = size
			q.finalBytes += size
			continue
		}
		open += size
	}
	q.openBytes, q.measuredAt = open, time.Now()
	return q.finalBytes + q.openBytes, nil
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
