package integration

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/internal/testutil"
)

// TestUpOnAFreshStateDir runs the README's first command: `postern up` brings up a bastion
// and a local hostagent, enrolls it, prints how to connect, and serves ssh_exec on host
// "local" — and comes back up on the same state dir with the same keys.
func TestUpOnAFreshStateDir(t *testing.T) {
	bin := testutil.Binary(t, "postern")
	dir := filepath.Join(t.TempDir(), "state")
	listen, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)
	for round := 1; round <= 2; round++ {
		cmd := exec.Command(bin, "up", "--state-dir", dir, "--listen", listen, "--hostagent-listen", agentListen)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		printed := readUntil(t, stdout, "Operator:")
		for _, want := range []string{"http://" + listen + "/mcp", "claude mcp add", `"mcpServers"`, "curl "} {
			if !strings.Contains(printed, want) {
				t.Errorf("round %d: up printed no %q:\n%s", round, want, printed)
			}
		}
		if enrolled := strings.Contains(printed, `enrolled host "local"`); enrolled != (round == 1) {
			t.Errorf("round %d: enrolled line present = %v; want it only on the first run:\n%s", round, enrolled, printed)
		}

		token, err := os.ReadFile(filepath.Join(dir, "token"))
		if err != nil {
			t.Fatal(err)
		}
		hc := testutil.BearerClient(strings.TrimSpace(string(token)))
		cs := testutil.ConnectMCP(t, "http://"+listen+bastion.MCPPath, hc, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var x bastion.Execution
		_, err = testutil.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "local", "command": "echo up"}, &x)
		cancel()
		if err != nil || x.State != "completed" || x.Stdout != "up\n" {
			t.Fatalf("round %d: ssh_exec on local = %+v, %v\n%s", round, x, err, stderr.String())
		}
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("round %d: up exited with %v\n%s", round, err, stderr.String())
		}
	}
}

// readUntil reads lines from r until one contains marker, and returns them all.
func readUntil(t *testing.T, r interface{ Read([]byte) (int, error) }, marker string) string {
	t.Helper()
	var out strings.Builder
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), marker) {
			go func() { // keep the pipe drained
				for sc.Scan() {
				}
			}()
			return out.String()
		}
	}
	t.Fatalf("output ended before %q:\n%s", marker, out.String())
	return ""
}
