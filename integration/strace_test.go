package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// TestMarkerSyncedBeforeExecve watches the hostagent and everything it starts (the keeper,
// the supervisor, the command) with strace: the marker's write and its sync complete before
// the command's execve — marker before start, whatever process forks the command.
func TestMarkerSyncedBeforeExecve(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Skip("strace not installed (apt-get install strace; .ci/run installs it)")
	}
	h := harness.StartHostagent(t)
	c := h.Dial(t)
	out := filepath.Join(t.TempDir(), "strace.out")
	// -f follows every process the agent starts from now on (the supervisor is started by
	// the first command); -y names each descriptor's file; the order of lines is the order
	// in which the syscalls were seen to enter and complete.
	strace := exec.Command("strace", "-f", "-qq", "-y", "-s", "65536", "-o", out,
		"-e", "trace=execve,write,pwrite64,writev,fsync,fdatasync,sync_file_range",
		"-p", strconv.Itoa(h.PID()))
	var straceErr strings.Builder
	strace.Stderr = &straceErr
	if err := strace.Start(); err != nil {
		t.Fatalf("strace: %v", err)
	}
	defer func() {
		strace.Process.Signal(syscall.SIGINT)
		strace.Wait()
	}()
	testutil.WaitFor(t, "strace to attach to every thread", func() bool {
		tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(h.PID()) + "/task")
		for _, task := range tasks {
			status, _ := os.ReadFile("/proc/" + strconv.Itoa(h.PID()) + "/task/" + task.Name() + "/status")
			if strings.Contains(string(status), "TracerPid:\t0\n") {
				if strace.ProcessState != nil || strings.Contains(straceErr.String(), "Operation not permitted") {
					t.Skipf("strace cannot attach here: %s", straceErr.String())
				}
				return false
			}
		}
		return len(tasks) > 0
	})

	id := newID(t)
	token := "strace-token-" + id
	got := execOn(t, c, hostproto.Exec{ExecutionID: id, Command: "echo " + token})
	if got.err != nil || got.stdout != token+"\n" {
		t.Fatalf("exec = %+v", got)
	}
	time.Sleep(200 * time.Millisecond) // let strace write out what it saw
	strace.Process.Signal(syscall.SIGINT)
	strace.Wait()

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	markers := filepath.Join(h.DataDir, "markers") + "/"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var wrote, synced, execve int // line numbers, 1-based; 0: not seen
	var lines []string
	pending := map[string]bool{} // pids in an unfinished sync of a marker file
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		lines = append(lines, line)
		switch {
		case execve == 0 && strings.Contains(line, "execve(") && strings.Contains(line, token):
			execve = n
		case wrote == 0 && strings.Contains(line, markers) && isWrite(line) && strings.Contains(line, id):
			wrote = n
		case wrote != 0 && synced == 0:
			pid, rest, _ := strings.Cut(line, " ")
			rest = strings.TrimSpace(rest)
			switch {
			case isSync(rest, markers) && strings.HasSuffix(rest, "= 0"):
				synced = n
			case isSync(rest, markers) && strings.HasSuffix(rest, "<unfinished ...>"):
				pending[pid] = true
			case pending[pid] && strings.Contains(rest, "sync resumed>") && strings.HasSuffix(rest, "= 0"):
				synced = n
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if execve == 0 || wrote == 0 || synced == 0 {
		var dump strings.Builder
		for i, l := range lines {
			fmt.Fprintf(&dump, "%d: %.200s\n", i+1, l)
		}
		t.Fatalf("from strace: marker write at line %d, its sync completed at %d, the command's execve at %d; want all three:\n%s", wrote, synced, execve, dump.String())
	}
	t.Logf("marker write: %.160s\nits sync: %s\nthe command's execve: %s", lines[wrote-1], lines[synced-1], lines[execve-1])
	if !(wrote < synced && synced < execve) {
		t.Errorf("marker write at line %d, its sync completed at %d, the command's execve at %d; want write < sync < execve:\n%s\n%s\n%s",
			wrote, synced, execve, lines[wrote-1][:min(len(lines[wrote-1]), 200)], lines[synced-1], lines[execve-1])
	}
}

func isWrite(line string) bool {
	for _, call := range []string{"write(", "pwrite64(", "writev("} {
		if strings.Contains(line, call) {
			return true
		}
	}
	return false
}

// isSync reports whether a syscall line (without its pid) syncs a file in dir.
func isSync(call, dir string) bool {
	return (strings.HasPrefix(call, "fsync(") || strings.HasPrefix(call, "fdatasync(")) && strings.Contains(call, dir)
}
