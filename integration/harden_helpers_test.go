package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// The hardening tests attack the daemons as a local user would: the test binary, re-executed
// as a throwaway unprivileged account (TestHardenHelper), floods sockets or squats names.

// Roles of the re-executed test binary (testutil.Role).
const (
	// roleFlood connects to every target of $POSTERN_TEST_TARGETS (newline-separated: a
	// socket path, an @abstract name, or procnet:PREFIX for every abstract socket in
	// /proc/net/unix whose name starts with @PREFIX), first holding $POSTERN_TEST_HOLD
	// connections to each, then connecting and hanging up $POSTERN_TEST_COUNT times; it
	// prints "connected N failed M" and holds on until stdin closes.
	roleFlood = "harden-flood"
	// roleSquat binds the abstract names the next supervisors would take, as the previous
	// release named them, and connects to every supervisor socket it finds (squatProcess).
	roleSquat = "harden-squat"
	// roleHoldTCP opens TCP connections to an HTTP endpoint and holds them (holdTCPProcess).
	roleHoldTCP = "harden-hold-tcp"
)

// TestHardenHelper is not a test: it is the test binary re-executed in a role by runAs.
func TestHardenHelper(t *testing.T) {
	switch testutil.Role() {
	case roleFlood:
		os.Exit(floodProcess())
	case roleSquat:
		os.Exit(squatProcess())
	case roleHoldTCP:
		os.Exit(holdTCPProcess())
	default:
		t.Skip("runs only re-executed by a hardening test")
	}
}

// helper is a process a test drives through its stdin and stdout: the test binary in a role
// as another user (runAs), or a client such as `postern mcp`.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// runAs starts the test binary (a copy every user can run) as u in role, with env added.
func runAs(t *testing.T, u unixuser.User, role string, env ...string) *helper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unixuser.SharedBinary(t, exe), "-test.run=^TestHardenHelper$")
	cmd.Env = append([]string{"POSTERN_TEST_ROLE=" + role}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.Credential()}
	return startHelper(t, cmd)
}

// startHelper starts cmd with pipes to its stdin and from its stdout (its stderr is the
// test's); stop, or the test's end, closes its stdin and waits for it.
func startHelper(t *testing.T, cmd *exec.Cmd) *helper {
	t.Helper()
	cmd.Stderr = os.Stderr
	h := &helper{cmd: cmd}
	var err error
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.stop)
	return h
}

// line reads the helper's next line of output.
func (h *helper) line(t *testing.T) string {
	t.Helper()
	line, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("helper %s: %v", h.cmd.Path, err)
	}
	return strings.TrimSpace(line)
}

// stop closes the helper's stdin and waits for it.
func (h *helper) stop() {
	if h.stdin != nil {
		h.stdin.Close()
		h.stdin = nil
		h.cmd.Wait()
	}
}

// flood runs roleFlood as u and returns how many connections it made and how many failed,
// once it made them all; the connections it holds stay open until stop (or the test's end).
func flood(t *testing.T, u unixuser.User, hold, count int, targets ...string) (connected, failed int, stop func()) {
	t.Helper()
	h := runAs(t, u, roleFlood, "POSTERN_TEST_TARGETS="+strings.Join(targets, "\n"),
		"POSTERN_TEST_HOLD="+strconv.Itoa(hold), "POSTERN_TEST_COUNT="+strconv.Itoa(count))
	line := h.line(t)
	if _, err := fmt.Sscanf(line, "connected %d failed %d", &connected, &failed); err != nil {
		t.Fatalf("flood helper said %q: %v", line, err)
	}
	return connected, failed, h.stop
}

func floodProcess() int {
	hold, _ := strconv.Atoi(os.Getenv("POSTERN_TEST_HOLD"))
	count, _ := strconv.Atoi(os.Getenv("POSTERN_TEST_COUNT"))
	var targets []string
	for _, t := range strings.Split(os.Getenv("POSTERN_TEST_TARGETS"), "\n") {
		if prefix, ok := strings.CutPrefix(t, "procnet:"); ok {
			targets = append(targets, abstractSockets(prefix)...)
		} else if t != "" {
			targets = append(targets, t)
		}
	}
	connected, failed := 0, 0
	var held []net.Conn
	for _, target := range targets {
		for range hold {
			if c, err := net.Dial("unix", target); err == nil {
				held = append(held, c)
			}
		}
		for range count {
			c, err := dialRetrying(target)
			if err != nil {
				failed++
				continue
			}
			connected++
			c.Close()
		}
	}
	fmt.Printf("connected %d failed %d\n", connected, failed)
	io.Copy(io.Discard, os.Stdin)
	for _, c := range held {
		c.Close()
	}
	return 0
}

// dialRetrying connects to the unix socket target, waiting while its backlog is full (Go's
// connect does not block then: EAGAIN).
func dialRetrying(target string) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		c, err := net.Dial("unix", target)
		if err == nil || !errors.Is(err, syscall.EAGAIN) || attempt == 1000 {
			return c, err
		}
		time.Sleep(time.Millisecond)
	}
}

// abstractSockets lists the listening abstract unix sockets whose name starts with @prefix,
// as every local user can read them from /proc/net/unix.
func abstractSockets(prefix string) []string {
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return nil
	}
	defer f.Close()
	seen := map[string]bool{}
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		if name := fields[7]; strings.HasPrefix(name, "@"+prefix) && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}

// startBastion starts a bastion (extraConfig as harness.NewBastion takes it) whose log the
// test shows if it fails.
func startBastion(t *testing.T, extraConfig ...string) *harness.Bastion {
	t.Helper()
	b := harness.NewBastion(t, testutil.NewSSHKey(t), extraConfig...)
	b.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s", b.Logs())
		}
	})
	return b
}

// postMCP posts an MCP message body to url with hc (with a bearer token unless "") and
// returns the status and the answer.
func postMCP(ctx context.Context, hc *http.Client, url, token string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// refusals is the bastion's postern_refusals_total{where,reason} (labels in the exposition's
// sorted order).
func refusals(t *testing.T, b *harness.Bastion, where, reason string) float64 {
	t.Helper()
	return metric(t, b, fmt.Sprintf("postern_refusals_total{reason=%q,where=%q}", reason, where))
}
