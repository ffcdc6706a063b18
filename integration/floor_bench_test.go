package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The physical floor of one execution on this machine (issue 13): what running `true` costs
// with nothing of Postern's — a fork/exec of `sh -c true` from Go — plus the four durable
// writes an execution needs (two on the bastion, two on the host), each a write of 512 bytes
// and an fdatasync, in the benchmark's temp dir: the filesystem of the data dirs.

// floorWrites is how many durable writes the floor includes.
const floorWrites = 4

// newFloor returns one floor sample as a benchSide call: appending to a file like a log does.
func newFloor(b *testing.B) func() error {
	b.Helper()
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "floor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	payload := bytes.Repeat([]byte{'x'}, 512)
	return func() error {
		if err := exec.Command("sh", "-c", "true").Run(); err != nil {
			return fmt.Errorf("sh -c true: %w", err)
		}
		for range floorWrites {
			if _, err := f.Write(payload); err != nil {
				return err
			}
			if err := syscall.Fdatasync(int(f.Fd())); err != nil {
				return fmt.Errorf("fdatasync: %w", err)
			}
		}
		return nil
	}
}

// procCPU is a process's CPU time from /proc/<pid>/stat: its own (utime+stime) and that of
// its waited-for children (cutime+cstime: children that ended and were reaped, with theirs).
type procCPU struct{ self, children time.Duration }

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every Linux ABI Go runs on.
const clockTick = 10 * time.Millisecond

// readProcCPU reads pid's CPU times; pid 0 is this process.
func readProcCPU(pid int) (procCPU, error) {
	path := "/proc/self/stat"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/stat"
	}
	stat, err := os.ReadFile(path)
	if err != nil {
		return procCPU{}, err
	}
	// Fields after the command name (which may hold spaces) start at field 3 (state); utime,
	// stime, cutime, cstime are fields 14-17.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 15 {
		return procCPU{}, fmt.Errorf("%s: %d fields", path, len(f))
	}
	var t [4]time.Duration
	for i, v := range f[11:15] {
		ticks, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return procCPU{}, fmt.Errorf("%s: %v", path, err)
		}
		t[i] = time.Duration(ticks) * clockTick
	}
	return procCPU{self: t[0] + t[1], children: t[2] + t[3]}, nil
}

// supervisorPID finds the hostagent's long-lived supervisor, if it has one: it lives in a
// session of its own (nobody's child but init's), so it is looked up by the records it keeps
// in <data dir>/supervisor — a pid file (*.pid) or its record supervisor-<pid>.json — and
// else by its environment naming that directory. 0 if there is none (per-command shims).
func supervisorPID(dataDir string) int {
	dir := filepath.Join(dataDir, "supervisor")
	alive := func(pid int) bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return pid > 0 && err == nil
	}
	pidFiles, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	for _, p := range pidFiles {
		data, err := os.ReadFile(p)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && perr == nil && alive(pid) {
			return pid
		}
	}
	records, _ := filepath.Glob(filepath.Join(dir, "supervisor-*.json"))
	for _, p := range records {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "supervisor-"), ".json")
		if pid, err := strconv.Atoi(name); err == nil && alive(pid) {
			return pid
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	want := []byte("POSTERN_SUPERVISOR_DIR=" + dir + "\x00")
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			return pid
		}
	}
	return 0
}

// execCPU is the CPU time that executions cost each process involved.
type execCPU struct {
	bastion, hostagent time.Duration
	// supervisor is the long-lived supervisor's own time, commands that of the commands it
	// forked; hasSupervisor says whether there is one.
	supervisor, commands time.Duration
	hasSupervisor        bool
	// shims is the hostagent's children's time: per-command shims with their commands (all
	// of the commands' time when there is no supervisor).
	shims   time.Duration
	callers time.Duration // this process: the benchmark's clients
}

// cpuSnapshot reads the CPU times so far of the bastion (pid), the hostagent (agentPID), its
// supervisor (supPID, 0 for none) and this process.
func cpuSnapshot(b *testing.B, pid, agentPID, supPID int) execCPU {
	b.Helper()
	read := func(pid int) procCPU {
		c, err := readProcCPU(pid)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	bastion, agent, self := read(pid), read(agentPID), read(0)
	out := execCPU{bastion: bastion.self + bastion.children, hostagent: agent.self, shims: agent.children, callers: self.self}
	if supPID != 0 {
		sup := read(supPID)
		out.supervisor, out.commands, out.hasSupervisor = sup.self, sup.children, true
	}
	return out
}

func (c execCPU) sub(o execCPU) execCPU {
	return execCPU{
		bastion: c.bastion - o.bastion, hostagent: c.hostagent - o.hostagent,
		supervisor: c.supervisor - o.supervisor, commands: c.commands - o.commands, hasSupervisor: c.hasSupervisor,
		shims: c.shims - o.shims, callers: c.callers - o.callers,
	}
}

func (c execCPU) add(o execCPU) execCPU {
	return execCPU{
		bastion: c.bastion + o.bastion, hostagent: c.hostagent + o.hostagent,
		supervisor: c.supervisor + o.supervisor, commands: c.commands + o.commands, hasSupervisor: c.hasSupervisor || o.hasSupervisor,
		shims: c.shims + o.shims, callers: c.callers + o.callers,
	}
}

// TestSupervisorLookup: the benchmark's supervisor lookup finds a live pid by either record
// the supervisor may keep, and nothing when there is none or its pid is gone.
func TestSupervisorLookup(t *testing.T) {
	self := os.Getpid()
	for _, tc := range []struct {
		name, file, content string
		want                int
	}{
		{name: "none", want: 0},
		{name: "pid file", file: "supervisor.pid", content: strconv.Itoa(self) + "\n", want: self},
		{name: "record", file: fmt.Sprintf("supervisor-%d.json", self), content: "{}", want: self},
		{name: "record of a gone process", file: "supervisor-999999999.json", content: "{}", want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			if tc.file != "" {
				dir := filepath.Join(data, "supervisor")
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := supervisorPID(data); got != tc.want {
				t.Errorf("supervisorPID = %d; want %d", got, tc.want)
			}
		})
	}
}
