package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// upCall runs ssh_exec of command on host local of the up at mcpURL with token.
func upCall(t *testing.T, mcpURL, token, command string) api.Execution {
	t.Helper()
	cs := harness.ConnectMCP(t, mcpURL, harness.BearerClient(token), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "local", "command": command}, &x)
	if err != nil {
		t.Fatalf("ssh_exec %q: %v", command, err)
	}
	if x.ExecutionID == "" {
		t.Fatalf("ssh_exec %q answered no execution: %s", command, harness.ResultText(res))
	}
	return x
}

// stopUp stops an up with SIGINT (Ctrl-C) and returns what it printed after.
func stopUp(t *testing.T, cmd *exec.Cmd, stderr *strings.Builder) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("up exited with %v\n%s", err, stderr.String())
	}
}

// TestUpConfigKeepsLocalAndTheToken: the quick start's config is a file (--config FILE,
// written on the first run from its settings); an actor and a rule added to it apply at the
// next start, which keeps host "local" and the quick start's token working — no switch to
// serve, nothing re-enrolled.
func TestUpConfigKeepsLocalAndTheToken(t *testing.T) {
	bin := harness.Binary(t, "postern")
	base := sockdir.New(t)
	dir := filepath.Join(base, "state")
	configPath := filepath.Join(base, "conf", "postern.toml") // a dir up makes
	listen, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)

	cmd, stdout, stderr := startUp(t, bin, dir, listen, agentListen, "--config", configPath)
	printed := readUntil(t, stdout, "Operator:")
	if !strings.Contains(printed, "Config: "+configPath) || !strings.Contains(printed, "postern mcp --config "+configPath+" --state-dir "+dir) {
		t.Errorf("up printed no config, or MCP clients are not told where it is:\n%s", printed)
	}
	tokenData, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenData))
	mcpURL := "http://" + listen + bastion.MCPPath
	if x := upCall(t, mcpURL, token, "echo first"); x.State != "completed" {
		t.Fatalf("first run: %+v", x)
	}
	stopUp(t, cmd, stderr)
	written, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatalf("up --config wrote no config: %v", err)
	}
	if info, _ := os.Stat(configPath); info.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v; want 0600", info.Mode().Perm())
	}
	for _, want := range []string{`state_dir = "` + dir + `"`, `listen = "` + listen + `"`, `name = "local-agent"`} {
		if !strings.Contains(string(written), want) {
			t.Errorf("the written config lacks %q:\n%s", want, written)
		}
	}

	// An operator adds an actor (postern token --static prints the lines) and a rule.
	out, err := exec.Command(bin, "token", "--static", "ci-bot").Output()
	if err != nil {
		t.Fatal(err)
	}
	ciToken := regexp.MustCompile(`(?m)^([A-Za-z0-9_-]{20,})$`).FindString(string(out))
	actor := string(out[strings.Index(string(out), "[[actors]]"):])
	rule := "\n[[rules]]\nname = \"no-rm\"\ndecision = \"deny\"\ncommands = [\"rm **\"]\n"
	if ciToken == "" {
		t.Fatalf("postern token printed no token:\n%s", out)
	}
	if err := os.WriteFile(configPath, append(append(written, "\n"+actor...), rule...), 0o600); err != nil {
		t.Fatal(err)
	}

	// Started again from the file alone: its state_dir, listen and actors.
	cmd2 := exec.Command(bin, "up", "--config", configPath, "--hostagent-listen", agentListen)
	cmd2.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout2, err := cmd2.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr2 := new(strings.Builder)
	cmd2.Stderr = stderr2
	if err := cmd2.Start(); err != nil {
		t.Fatal(err)
	}
	printed = readUntil(t, stdout2, "Operator:")
	if strings.Contains(printed, "enrolled host") || !strings.Contains(printed, `"local" (this machine`) {
		t.Errorf("second up re-enrolled or lost host local:\n%s", printed)
	}
	if x := upCall(t, mcpURL, token, "echo again"); x.State != "completed" || x.Stdout != "again\n" {
		t.Errorf("the quick start's token after the edit: %+v", x)
	}
	if x := upCall(t, mcpURL, ciToken, "echo from ci"); x.State != "completed" || x.Stdout != "from ci\n" {
		t.Errorf("the added actor: %+v", x)
	}
	if x := upCall(t, mcpURL, token, "rm -rf /nonexistent-postern-test"); x.State != "rejected" {
		t.Errorf("the added deny rule: %+v; want rejected", x)
	}
	stopUp(t, cmd2, stderr2)
}

// TestUpStartAndStop: up binds its HTTP port before it enrolls anything (a port in use fails
// first, with nothing enrolled), does not make its own hostagent log a failed handshake, keeps
// its config in the state dir, and says when Ctrl-C is stopping it and when it stopped.
func TestUpStartAndStop(t *testing.T) {
	bin := harness.Binary(t, "postern")
	dir := filepath.Join(sockdir.New(t), "state")
	listen, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(bin, "up", "--state-dir", dir, "--listen", listen, "--hostagent-listen", agentListen)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "up to serve", func() bool { return strings.Contains(stdout.String(), "Operator:") })
	if _, err := os.Stat(filepath.Join(dir, "postern.toml")); err != nil {
		t.Errorf("up kept no config in its state dir: %v", err)
	}
	// A second up on another state dir, whose HTTP port is taken: nothing is enrolled first.
	other := filepath.Join(sockdir.New(t), "state")
	out, err := exec.Command(bin, "up", "--state-dir", other, "--listen", listen, "--hostagent-listen", testutil.FreeAddr(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "address already in use") || strings.Contains(string(out), "enrolled host") {
		t.Errorf("up on a taken port: %v\n%s\nwant it to fail on the port before enrolling", err, out)
	}

	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("up exited with %v\n%s", err, stderr.String())
	}
	if after := stdout.String()[strings.Index(stdout.String(), "Operator:"):]; !strings.Contains(after, "postern: stopping") || !strings.Contains(after, "postern: stopped") {
		t.Errorf("after Ctrl-C up printed %q; want stopping… and stopped", after)
	}
	if strings.Contains(stderr.String(), "handshake failed") {
		t.Errorf("up's own hostagent logged a failed handshake:\n%s", stderr.String())
	}
}

// TestDoctorAfterUpListen: doctor checks the port the running daemon serves on, not the
// config's listen — up --listen moved it for this run — and finds the quick start's state
// dir by the discovery rule (here POSTERN_STATE_DIR).
func TestDoctorAfterUpListen(t *testing.T) {
	bin := harness.Binary(t, "postern")
	dir := filepath.Join(sockdir.New(t), "state")
	first, agentListen := testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd, stdout, stderr := startUp(t, bin, dir, first, agentListen)
	readUntil(t, stdout, "Operator:")
	stopUp(t, cmd, stderr)

	// The config says first; this run listens on moved.
	moved := testutil.FreeAddr(t)
	cmd, stdout, stderr = startUp(t, bin, dir, moved, agentListen)
	readUntil(t, stdout, "Operator:")
	t.Cleanup(func() { stopUp(t, cmd, stderr) })

	doctor := exec.Command(bin, "doctor")
	doctor.Env = append(os.Environ(), "POSTERN_STATE_DIR="+dir, "POSTERN_CONFIG=")
	out, err := doctor.CombinedOutput()
	if err != nil {
		t.Fatalf("doctor after up --listen: %v\n%s", err, out)
	}
	for _, want := range []string{
		"chosen by POSTERN_STATE_DIR",
		"Streamable HTTP answers on " + moved,
		"the daemon listens on " + moved + ", not on the config's " + first,
		"local (" + agentListen + "): reachable",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}
}
