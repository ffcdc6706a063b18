package supervisor

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/procfs"
)

// maxAncestry bounds the ppid walk of IsDescendant; real chains are a few dozen deep.
const maxAncestry = 4096

// IsDescendant reports whether pid is ancestor or one of its descendants, by walking the
// parent chain in /proc. The caller must make sure ancestor still names the process it means
// (compare its start time with procfs.StartTime before and after). A process that exits
// during the walk ends it with an error wrapping fs.ErrNotExist. Reparented orphans (whose
// parent died) are no longer descendants.
func IsDescendant(pid, ancestor int) (bool, error) {
	if pid <= 0 || ancestor <= 0 {
		return false, fmt.Errorf("supervisor: is descendant: pids %d, %d out of range", pid, ancestor)
	}
	for range maxAncestry {
		if pid == ancestor {
			return true, nil
		}
		if pid == 1 {
			return false, nil
		}
		st, err := procfs.ReadStat(pid)
		if err != nil {
			return false, err
		}
		if st.PPID == 0 {
			return false, nil
		}
		pid = st.PPID
	}
	return false, fmt.Errorf("supervisor: is descendant: ancestry deeper than %d", maxAncestry)
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
	if !procfs.Running(p.PID, p.PIDStart) {
		return false, nil
	}
	ok, err := IsDescendant(pid, p.PID)
	if err != nil || !ok || !procfs.Running(p.PID, p.PIDStart) {
		return false, err
	}
	return true, nil
}
