package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TestUpOnAFreshStateDir runs the README's first command: `postern up` brings up a bastion
// and a local hostagent, enrolls it, prints how to connect, and serves ssh_exec on host
// "local" — and comes back up on the same state dir with the same keys.
func TestUpOnAFreshStateDir(t *testing.T) {
	bin := harness.Binary(t, "postern")
	dir := filepath.Join(sockdir.New(t), "state")
	listen, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)
	for round := 1; round <= 2; round++ {
		cmd, stdout, stderr := startUp(t, bin, dir, listen, agentListen)
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
		hc := harness.BearerClient(strings.TrimSpace(string(token)))
		cs := harness.ConnectMCP(t, "http://"+listen+bastion.MCPPath, hc, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var x api.Execution
		_, err = harness.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "local", "command": "echo up"}, &x)
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

// startUp starts `postern up` on dir and the two addresses (and extra flags), in its own
// process group; the caller reads stdout and stops it.
func startUp(t *testing.T, bin, dir, listen, agentListen string, extra ...string) (*exec.Cmd, io.Reader, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"up", "--state-dir", dir, "--listen", listen, "--hostagent-listen", agentListen}, extra...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := new(strings.Builder)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdout, stderr
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

// TestUpErrorsSayWhatToDo: a second `up` on a state dir in use names the first one's pid; a
// port in use names the flag that moves it; and an `up` that fails takes back only what it
// created — a fresh state dir (and the parents it made) disappears, a pre-existing one keeps
// exactly its entries.
func TestUpErrorsSayWhatToDo(t *testing.T) {
	bin := harness.Binary(t, "postern")
	base := sockdir.New(t)
	dir := filepath.Join(base, "state")
	listen, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)
	first, stdout, firstErr := startUp(t, bin, dir, listen, agentListen)
	t.Cleanup(func() {
		first.Process.Signal(syscall.SIGTERM)
		if err := first.Wait(); err != nil {
			t.Errorf("first up exited with %v\n%s", err, firstErr.String())
		}
	})
	readUntil(t, stdout, "Operator:")

	failedUp := func(t *testing.T, stateDir, listen, agentListen string) string {
		t.Helper()
		out, err := exec.Command(bin, "up", "--state-dir", stateDir, "--listen", listen, "--hostagent-listen", agentListen).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("up = %v; want exit status 1\n%s", err, out)
		}
		return string(out)
	}
	names := func(t *testing.T, dir string) []string {
		t.Helper()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, e := range entries {
			n = append(n, e.Name())
		}
		return n
	}

	t.Run("state dir in use", func(t *testing.T) {
		before := names(t, dir)
		out := failedUp(t, dir, testutil.FreeAddr(t), testutil.FreeAddr(t))
		for _, want := range []string{fmt.Sprintf("(pid %d)", first.Process.Pid), "--state-dir"} {
			if !strings.Contains(out, want) {
				t.Errorf("second up said %q; want it to name %q", out, want)
			}
		}
		if after := names(t, dir); !slices.Equal(after, before) {
			t.Errorf("the state dir in use changed: %v → %v", before, after)
		}
	})
	for _, tt := range []struct {
		name, listen, agentListen, flag string
	}{
		{"listen port in use", listen, testutil.FreeAddr(t), "--listen ADDR"},
		{"hostagent port in use", testutil.FreeAddr(t), agentListen, "--hostagent-listen ADDR"},
	} {
		t.Run(tt.name+", fresh state dir", func(t *testing.T) {
			parent := filepath.Join(sockdir.New(t), "made-by-up") // unix socket paths are short
			out := failedUp(t, filepath.Join(parent, "state"), tt.listen, tt.agentListen)
			if !strings.Contains(out, "address already in use") || !strings.Contains(out, tt.flag) {
				t.Errorf("up said %q; want the port in use and %q", out, tt.flag)
			}
			if _, err := os.Lstat(parent); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed up left %s behind (%v)", parent, err)
			}
		})
		t.Run(tt.name+", existing state dir", func(t *testing.T) {
			existing := sockdir.New(t)
			if err := os.WriteFile(filepath.Join(existing, "mine"), []byte("kept\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			failedUp(t, existing, tt.listen, tt.agentListen)
			if got := names(t, existing); !slices.Equal(got, []string{"mine"}) {
				t.Errorf("after a failed up the dir holds %v; want only what was there: [mine]", got)
			}
		})
	}
}

// TestUpBrowserOrigins: a browser page on a loopback origin (the MCP Inspector's) gets its
// CORS preflight answered and its call served; `--allow-origin` admits another origin; any
// other origin is refused with a body that names the flag; an origin that can never be
// allowed ("null") is refused before up writes anything.
func TestUpBrowserOrigins(t *testing.T) {
	bin := harness.Binary(t, "postern")
	base := sockdir.New(t)
	if out, err := exec.Command(bin, "up", "--state-dir", filepath.Join(base, "never"), "--allow-origin", "null").CombinedOutput(); err == nil || !strings.Contains(string(out), `"null"`) {
		t.Errorf("up --allow-origin null = %v:\n%s\nwant a refusal naming null", err, out)
	}
	if _, err := os.Stat(filepath.Join(base, "never")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("up --allow-origin null left its state dir: %v", err)
	}

	dir := filepath.Join(base, "state")
	cmd, stdout, stderr := startUp(t, bin, dir, "127.0.0.1:0", "127.0.0.1:0", "--allow-origin", "https://console.example")
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("up exited with %v\n%s", err, stderr.String())
		}
	})
	mcpURL := upURL(t, readUntil(t, stdout, "Operator:"))
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, origin string, header map[string]string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, mcpURL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", origin)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(body)
	}
	call := map[string]string{
		"Authorization": "Bearer " + strings.TrimSpace(string(token)),
		"Content-Type":  "application/json", "Accept": "application/json, text/event-stream",
	}

	status, h, _ := do(http.MethodOptions, "http://localhost:6274", map[string]string{
		"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type,mcp-protocol-version",
	})
	if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "http://localhost:6274" ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("inspector preflight = %d, %v; want 204 allowing the origin and Authorization", status, h)
	}
	for _, origin := range []string{"http://localhost:6274", "http://[::1]:5173", "https://console.example"} {
		status, h, body := do(http.MethodPost, origin, call)
		if status != http.StatusOK || h.Get("Access-Control-Allow-Origin") != origin || !strings.Contains(body, "ssh_exec") {
			t.Errorf("tools/list from %s = %d (ACAO %q): %.200s; want 200 with the tools", origin, status, h.Get("Access-Control-Allow-Origin"), body)
		}
	}
	status, h, body := do(http.MethodPost, "https://evil.example", call)
	if status != http.StatusForbidden || h.Get("Access-Control-Allow-Origin") != "" || !strings.Contains(body, "--allow-origin https://evil.example") {
		t.Errorf("tools/list from a foreign origin = %d (ACAO %q): %s; want 403 naming --allow-origin", status, h.Get("Access-Control-Allow-Origin"), body)
	}
}

// upURL is the Streamable HTTP URL up printed.
func upURL(t *testing.T, printed string) string {
	t.Helper()
	m := regexp.MustCompile(`MCP \(Streamable HTTP\): (\S+)`).FindStringSubmatch(printed)
	if m == nil {
		t.Fatalf("up printed no Streamable HTTP URL:\n%s", printed)
	}
	return m[1]
}
