// Package dirlock keeps a second daemon out of a directory a running one is using, and names
// the process that holds it — so a second `postern up` on the same state dir says "in use by
// pid 1234" instead of the store's "resource temporarily unavailable".
//
// The lock is flock(2) on <dir>/daemon.lock, held for as long as the Lock is (the kernel
// drops it when the holder exits, however it exits: a stale file never locks anyone out). The
// holder writes its pid into the file after taking the lock and clears it on Release, so a pid
// in an unlocked file names a holder that never released it — one that crashed or was killed
// (LastHolder: what `postern status` reports after a crash). The store inside the directory
// keeps its own lock as well: this one adds the name, it does not replace that protection.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// FileName is the lock file inside the directory.
const FileName = "daemon.lock"

// HeldError is the answer when another process holds the directory.
type HeldError struct {
	Dir string
	// PID is the holder's pid as it wrote it, 0 when it could not be read (the holder is
	// still starting, or wrote nothing).
	PID int
}

func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("%s is in use by another process (pid %d)", e.Dir, e.PID)
	}
	return fmt.Sprintf("%s is in use by another process", e.Dir)
}

// Lock is a held directory lock.
type Lock struct{ f *os.File }

// Acquire takes the lock on dir (which must exist) without waiting. When another process
// holds it, the error is a *HeldError.
func Acquire(dir string) (*Lock, error) {
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := flockRetry(f); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Dir: dir, PID: readPID(f)}
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := writePID(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return &Lock{f: f}, nil
}

func flockNB(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) }

// flockRetry is flockNB tried a few times over contentionWait: LastHolder holds a shared lock
// for the moment it reads the file, and a daemon starting in that moment must not be told
// the directory is in use.
func flockRetry(f *os.File) error {
	var err error
	for i := 0; i < 5; i++ {
		if err = flockNB(f); !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		time.Sleep(contentionWait / 5)
	}
	return err
}

const contentionWait = 250 * time.Millisecond

// Release drops the lock after clearing the holder's pid: the file stays, locks nobody out,
// and an empty file says the last holder stopped cleanly (LastHolder).
func (l *Lock) Release() error {
	return errors.Join(l.f.Truncate(0), l.f.Close())
}

// LastHolder reports how the last holder of dir's lock stopped, when nobody holds it now:
// pid is the holder that never released it (it crashed or was killed), 0 when it released
// it or there was none. held is true when a process holds the lock now (pid is then its pid,
// if written). It reads without creating or writing anything.
func LastHolder(dir string) (pid int, held bool, err error) {
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("lock %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return readPID(f), true, nil
		}
		return 0, false, fmt.Errorf("lock %s: %w", dir, err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return readPID(f), false, nil
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
