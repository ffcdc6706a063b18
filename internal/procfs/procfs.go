// Package procfs reads what Postern needs of a process from Linux's /proc/PID/stat: its state,
// parent, process group and start time, which together with the pid name one process for its whole
// life (pids are reused; the pair is not). The stat file is parsed as untrusted input: a
// process chooses its own comm, which may hold spaces and parentheses.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Root is where the system mounts /proc.
const Root = "/proc"

// ErrBadStat: a stat file that does not parse.
var ErrBadStat = errors.New("procfs: malformed /proc stat")

// maxStatBytes bounds a stat read: the comm field is at most 64 bytes and the rest is ~50
// numbers.
const maxStatBytes = 4096

// Stat is the part of /proc/PID/stat Postern uses.
type Stat struct {
	// State is field 3: 'R', 'S', 'D', 'Z' (a zombie: exited, not yet reaped), ….
	State byte
	// PPID is field 4, the parent's pid (0 for the kernel's own).
	PPID int
	// PGID is field 5, the process group.
	PGID int
	// StartTime is field 22: when the process started, in clock ticks after boot.
	StartTime uint64
}

// ParseStat parses the contents of /proc/PID/stat. The comm field (2) is in parentheses and
// may itself hold spaces and parentheses, so the fields after it are counted from its LAST
// ')'. On error the Stat is zero.
func ParseStat(data []byte) (Stat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 || bytes.IndexByte(data[:end], '(') < 0 {
		return Stat{}, fmt.Errorf("%w: no (comm)", ErrBadStat)
	}
	// fields[0] is field 3 (state), so field N is fields[N-3].
	fields := bytes.Fields(data[end+1:])
	const stateField, ppidField, pgidField, startField = 3, 4, 5, 22
	if len(fields) <= startField-3 {
		return Stat{}, fmt.Errorf("%w: %d fields after comm, want at least %d", ErrBadStat, len(fields), startField-2)
	}
	state := fields[stateField-3]
	if len(state) != 1 {
		return Stat{}, fmt.Errorf("%w: state %q", ErrBadStat, state)
	}
	ppid, err := strconv.Atoi(string(fields[ppidField-3]))
	if err != nil || ppid < 0 {
		return Stat{}, fmt.Errorf("%w: ppid %q", ErrBadStat, fields[ppidField-3])
	}
	pgid, err := strconv.Atoi(string(fields[pgidField-3]))
	if err != nil || pgid < 0 {
		return Stat{}, fmt.Errorf("%w: pgid %q", ErrBadStat, fields[pgidField-3])
	}
	start, err := strconv.ParseUint(string(fields[startField-3]), 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("%w: start time %q", ErrBadStat, fields[startField-3])
	}
	return Stat{State: state[0], PPID: ppid, PGID: pgid, StartTime: start}, nil
}

// ReadStat reads and parses the stat of pid from the system's /proc. The error wraps
// fs.ErrNotExist when there is no such process.
func ReadStat(pid int) (Stat, error) { return ReadStatAt(Root, pid) }

// ReadStatAt is ReadStat from a /proc mounted at root (tests give their own tree).
func ReadStatAt(root string, pid int) (Stat, error) {
	if pid <= 0 {
		return Stat{}, fmt.Errorf("procfs: pid %d out of range", pid)
	}
	f, err := os.Open(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, fmt.Errorf("procfs: process %d: %w", pid, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStatBytes))
	if err != nil {
		return Stat{}, fmt.Errorf("procfs: process %d: %w", pid, err)
	}
	st, err := ParseStat(data)
	if err != nil {
		return Stat{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return st, nil
}

// StartTime is pid's start time (field 22, clock ticks after boot). The error wraps
// fs.ErrNotExist when there is no such process.
func StartTime(pid int) (uint64, error) {
	st, err := ReadStat(pid)
	return st.StartTime, err
}

// Running reports whether pid is, now, the process that started at start and has not exited
// (a zombie has).
func Running(pid int, start uint64) bool {
	st, err := ReadStat(pid)
	return err == nil && st.StartTime == start && st.State != 'Z'
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's start time: 100 on
// every Linux architecture Postern runs on.
const clockTicks = 100

// bootTime is when the system booted (/proc/stat btime); zero if unreadable.
var bootTime = sync.OnceValue(func() time.Time {
	f, err := os.Open(filepath.Join(Root, "stat"))
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(secs, 0).UTC()
			}
		}
	}
	return time.Time{}
})

// StartedAt is the wall-clock start of a process that started ticks after boot (StartTime's
// unit); zero when the boot time cannot be read.
func StartedAt(ticks uint64) time.Time {
	boot := bootTime()
	if boot.IsZero() || ticks == 0 {
		return time.Time{}
	}
	return boot.Add(time.Duration(ticks) * time.Second / clockTicks)
}
