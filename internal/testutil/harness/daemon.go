package harness

import (
	"bufio"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
)

// daemon is a long-running helper process (a hostagent, a bastion) started from a built
// binary: its own process group (like under systemd, so signals to the test never reach it),
// ready once its first stdout line has the expected prefix, stderr kept for failure reports.
type daemon struct {
	what string // for messages: "hostagent", "bastion"

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd

	logs testutil.LockedBuffer // the process's stderr
}

// start runs bin with args and waits for the ready line.
func (d *daemon) start(t testing.TB, ready, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, ready) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("%s did not start: %q %v\n%s", d.what, line, err, d.Logs())
	}
	// The pipe is drained until the process exits (Kill waits for it, closing the pipe).
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := stdout.Read(buf); err != nil {
				return
			}
		}
	}()
	d.mu.Lock()
	d.cmd = cmd
	d.mu.Unlock()
}

// Kill SIGKILLs the process (what it started in other sessions lives on).
func (d *daemon) Kill(t testing.TB) {
	t.Helper()
	d.signalAndWait(syscall.SIGKILL)
}

// Stop asks the process to shut down (SIGTERM) and waits for it: a clean stop, which
// writes out what a kill may lose (e.g. a journal's unsynced writes).
func (d *daemon) Stop(t testing.TB) {
	t.Helper()
	d.signalAndWait(syscall.SIGTERM)
}

func (d *daemon) signalAndWait(sig syscall.Signal) {
	d.mu.Lock()
	cmd := d.cmd
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	cmd.Wait()
}

// PID is the running process's id (0 when stopped).
func (d *daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// Logs is what the process wrote to stderr.
func (d *daemon) Logs() string {
	return d.logs.String()
}
