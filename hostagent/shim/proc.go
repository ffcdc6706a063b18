package shim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxStatBytes bounds a /proc/<pid>/stat read; the comm field is at most 64 bytes and the
// rest is ~50 numbers.
const maxStatBytes = 4096

// maxAncestry bounds the ppid walk of IsDescendant; real chains are a few dozen deep.
const maxAncestry = 4096

// procStat is the part of /proc/<pid>/stat this package uses.
type procStat struct {
	State     byte // 'Z' for a zombie
	PPID      int
	StartTime uint64
}

// parseStat parses /proc/<pid>/stat. The comm field (2) is in parentheses and may itself
// contain spaces and parentheses, so fields are counted from the last ')'.
func parseStat(data []byte) (procStat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return procStat{}, errors.New("shim: parse stat: no comm field")
	}
	// Fields after comm start at field 3 (state).
	fields := bytes.Fields(data[end+1:])
	const stateIndex, ppidIndex, startTimeIndex = 3 - 3, 4 - 3, 22 - 3
	if len(fields) <= startTimeIndex {
		return procStat{}, fmt.Errorf("shim: parse stat: %d fields after comm, want more than %d", len(fields), startTimeIndex)
	}
	ppid, err := strconv.Atoi(string(fields[ppidIndex]))
	if err != nil || ppid < 0 {
		return procStat{}, fmt.Errorf("shim: parse stat: ppid %q", fields[ppidIndex])
	}
	start, err := strconv.ParseUint(string(fields[startTimeIndex]), 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("shim: parse stat: start time %q: %w", fields[startTimeIndex], err)
	}
	if len(fields[stateIndex]) != 1 {
		return procStat{}, fmt.Errorf("shim: parse stat: state %q", fields[stateIndex])
	}
	return procStat{State: fields[stateIndex][0], PPID: ppid, StartTime: start}, nil
}

func readStat(pid int) (procStat, error) {
	if pid <= 0 {
		return procStat{}, fmt.Errorf("shim: read stat: pid %d out of range", pid)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("shim: read stat of pid %d: %w", pid, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStatBytes))
	if err != nil {
		return procStat{}, fmt.Errorf("shim: read stat of pid %d: %w", pid, err)
	}
	st, err := parseStat(data)
	if err != nil {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// ProcessStartTime returns the start time of pid (/proc/<pid>/stat field 22, clock ticks
// since boot). A pid together with its start time names one process even after pid reuse.
// The error wraps fs.ErrNotExist if there is no such process.
func ProcessStartTime(pid int) (uint64, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return st.StartTime, nil
}

// running reports whether pid is currently the process that started at start and has not
// exited (a zombie has exited).
func running(pid int, start uint64) bool {
	st, err := readStat(pid)
	return err == nil && st.StartTime == start && st.State != 'Z'
}

// IsDescendant reports whether pid is ancestor or one of its descendants, by walking the
// parent chain in /proc. The caller must make sure ancestor still names the process it means
// (compare its start time with ProcessStartTime before and after). A process that exits
// during the walk ends it with an error wrapping fs.ErrNotExist. Reparented orphans (whose
// parent died) are no longer descendants.
func IsDescendant(pid, ancestor int) (bool, error) {
	if pid <= 0 || ancestor <= 0 {
		return false, fmt.Errorf("shim: is descendant: pids %d, %d out of range", pid, ancestor)
	}
	for range maxAncestry {
		if pid == ancestor {
			return true, nil
		}
		if pid == 1 {
			return false, nil
		}
		st, err := readStat(pid)
		if err != nil {
			return false, err
		}
		if st.PPID == 0 {
			return false, nil
		}
		pid = st.PPID
	}
	return false, fmt.Errorf("shim: is descendant: ancestry deeper than %d", maxAncestry)
}

// InExecution reports whether pid belongs to the execution p names: the command's process
// group (the command leads it, and its pgid stays reserved while any member lives) or the
// command's descendants while the command runs. Not the supervisor's descendants: the
// long-lived supervisor is every command's parent.
func InExecution(pid int, p Process) (bool, error) {
	if p.PID <= 0 {
		return false, nil
	}
	if pgid, err := unix.Getpgid(pid); err == nil && pgid == p.PID {
		return true, nil
	}
	// The start time is checked after the walk as well: the command's pid must not have been
	// reused while the walk read /proc.
	if !running(p.PID, p.PIDStart) {
		return false, nil
	}
	ok, err := IsDescendant(pid, p.PID)
	if err != nil || !ok || !running(p.PID, p.PIDStart) {
		return false, err
	}
	return true, nil
}
