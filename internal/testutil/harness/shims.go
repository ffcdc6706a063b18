package harness

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/procfs"
)

// reapGrace bounds how long a killed shim or command may take to disappear.
const reapGrace = 30 * time.Second

// reapShims ends what a hostagent detached under dataDir and waits until it is gone: every
// long-lived supervisor with its commands' sessions, and every per-command shim with its
// command's process group. Supervisors outlive the hostagent by design, so without this they
// keep writing into the test's temp dir while it is being removed. Call it after the
// hostagent was stopped.
func reapShims(t testing.TB, dataDir string) {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(dataDir, "spool", "*"))
	if err != nil {
		t.Errorf("reap shims: %v", err)
		return
	}
	var pidfds []int
	// The long-lived supervisors first, also those that have no spool directory (yet), each
	// after its commands' sessions: every command leads one, which may hold grandchildren
	// that the supervisor's death (its commands' SIGKILL) would not reach.
	sups, _ := filepath.Glob(filepath.Join(dataDir, "supervisor", "supervisor-*.json"))
	for _, rec := range sups {
		fd, pid := openSpooled(rec)
		if fd < 0 {
			continue
		}
		for _, child := range childrenOf(pid) {
			if cfd, err := unix.PidfdOpen(child, 0); err == nil {
				unix.Kill(-child, unix.SIGKILL)
				pidfds = append(pidfds, cfd)
			}
		}
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		pidfds = append(pidfds, fd)
	}
	// Then per-command shims (a previous release's), each after its command's group.
	for _, dir := range dirs {
		// The command first: it leads its own process group, which may hold grandchildren
		// that the supervisor's death would not reach.
		if fd, pid := openSpooled(filepath.Join(dir, supervisor.ProcessFile)); fd >= 0 {
			unix.Kill(-pid, unix.SIGKILL)
			pidfds = append(pidfds, fd)
		}
		if fd, _ := openSpooled(filepath.Join(dir, supervisor.SupervisorFile)); fd >= 0 {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			pidfds = append(pidfds, fd)
		}
	}
	deadline := time.Now().Add(reapGrace)
	for _, fd := range pidfds {
		for !pidfdExited(fd) {
			if time.Now().After(deadline) {
				t.Errorf("reap shims: a process under %s is still alive %v after SIGKILL", dataDir, reapGrace)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		unix.Close(fd)
	}
}

// openSpooled opens a pidfd on the process a spool record (pid + start time) names, if that
// process still runs. It returns -1 when there is none.
func openSpooled(path string) (pidfd, pid int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1, 0
	}
	var p struct {
		PID   int    `json:"pid"`
		Start uint64 `json:"start"`
	}
	if json.Unmarshal(data, &p) != nil || p.PID <= 0 {
		return -1, 0
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return -1, 0
	}
	// The pidfd pins the process it was opened on; another start time means the pid now
	// belongs to a process that is not ours.
	if start, err := procfs.StartTime(p.PID); err != nil || start != p.Start {
		unix.Close(fd)
		return -1, 0
	}
	return fd, p.PID
}

// pidfdExited reports whether the process of a pidfd has exited (the pidfd is readable).
func pidfdExited(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if errors.Is(err, unix.EINTR) {
		return false
	}
	return err != nil || n > 0
}

// childrenOf lists pid's children (every thread's, from /proc).
func childrenOf(pid int) []int {
	var pids []int
	lists, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	for _, list := range lists {
		data, _ := os.ReadFile(list)
		for _, f := range strings.Fields(string(data)) {
			if child, err := strconv.Atoi(f); err == nil {
				pids = append(pids, child)
			}
		}
	}
	return pids
}
