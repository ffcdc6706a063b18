package hostagent_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TestOpenSSHClient drives the server with the stock ssh(1) client, the compatibility the
// design promises to operators.
func TestOpenSSHClient(t *testing.T) {
	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		t.Skip("ssh client binary not installed; skipping OpenSSH compatibility test")
	}
	ts := startServer(t, nil)
	dir := t.TempDir()
	_, port, _ := net.SplitHostPort(ts.addr)
	knownHosts := testutil.WriteKnownHosts(t, filepath.Join(dir, "known_hosts"), ts.addr, ts.srv.HostPublicKey())
	keyFile := ts.key.WritePrivateKey(t, filepath.Join(dir, "id_ed25519"))

	certKey := testutil.NewSSHKey(t)
	certKeyFile := certKey.WritePrivateKey(t, filepath.Join(dir, "id_cert"))
	testutil.WriteCert(t, certKeyFile+"-cert.pub", testutil.SignUserCert(t, ts.ca, certKey.Public(),
		testutil.UserCert{KeyID: "ops", Principals: []string{ts.account}}))

	tests := []struct {
		name       string
		identity   string
		extra      []string
		cmd        string
		wantStdout string
		wantStderr string // substring
		wantStatus int
	}{
		{name: "run", identity: keyFile, extra: []string{"-o", "SetEnv=POSTERN_EXECUTION_ID=" + validID},
			cmd: "echo out; echo err >&2; exit 7", wantStdout: "out\n", wantStderr: "err", wantStatus: 7},
		{name: "certificate", identity: certKeyFile, extra: []string{"-o", "SetEnv=POSTERN_EXECUTION_ID=" + validID},
			cmd: "echo cert", wantStdout: "cert\n"},
		{name: "env allowlist", identity: keyFile,
			extra: []string{"-o", "SetEnv=POSTERN_EXECUTION_ID=" + validID + " LD_PRELOAD=/nonexistent.so LANG=C"},
			cmd:   `echo "${LD_PRELOAD-unset} $LANG"`, wantStdout: "unset C\n"},
		{name: "missing execution id", identity: keyFile, cmd: "echo ran",
			wantStderr: "postern: POSTERN_EXECUTION_ID is required", wantStatus: 255},
		// ssh -tt treats the refused pty as fatal (status 255) once the server says no.
		{name: "pty refused", identity: keyFile, extra: []string{"-tt", "-o", "SetEnv=POSTERN_EXECUTION_ID=" + validID},
			cmd: "true", wantStderr: "PTY allocation request failed", wantStatus: 255},
		{name: "remote port forwarding refused", identity: keyFile,
			extra: []string{"-o", "ExitOnForwardFailure=yes", "-R", "127.0.0.1:0:127.0.0.1:9", "-o", "SetEnv=POSTERN_EXECUTION_ID=" + validID},
			cmd:   "true", wantStderr: "remote port forwarding failed", wantStatus: 255},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(testutil.OpenSSHArgs(knownHosts, tt.identity, port), tt.extra...)
			args = append(args, ts.account+"@127.0.0.1", tt.cmd)
			cmd := exec.Command(sshBin, args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			status := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				status = exitErr.ExitCode()
			} else if err != nil {
				t.Fatalf("ssh: %v", err)
			}
			if status != tt.wantStatus || stdout.String() != tt.wantStdout || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("status %d stdout %q stderr %q; want %d, %q, stderr containing %q",
					status, stdout.String(), stderr.String(), tt.wantStatus, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

// TestOpenSSHMaxSessions multiplexes sessions over one OpenSSH connection (ControlMaster):
// sessions beyond max_sessions are refused, and ssh(1) says so. (TestMaxSessionsPerConnection
// checks the reason the server gives.)
func TestOpenSSHMaxSessions(t *testing.T) {
	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		t.Skip("ssh client binary not installed; skipping OpenSSH compatibility test")
	}
	const limit = 2
	ts := startServer(t, func(c *hostagent.Config) { c.MaxSessions = limit })
	dir := sockdir.New(t) // holds the control master's socket
	_, port, _ := net.SplitHostPort(ts.addr)
	knownHosts := testutil.WriteKnownHosts(t, filepath.Join(dir, "known_hosts"), ts.addr, ts.srv.HostPublicKey())
	keyFile := ts.key.WritePrivateKey(t, filepath.Join(dir, "id_ed25519"))
	mux := filepath.Join(dir, "mux")
	sshArgs := func(extra ...string) []string {
		args := append(testutil.OpenSSHArgs(knownHosts, keyFile, port), "-o", "ControlPath="+mux)
		return append(args, extra...)
	}

	// Multiplexed sessions get the master's SetEnv.
	master := exec.Command(sshBin, sshArgs("-o", "ControlMaster=yes", "-o", "SetEnv=POSTERN_EXECUTION_ID="+validID, "-N", ts.account+"@127.0.0.1")...)
	if err := master.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		master.Process.Kill()
		master.Wait()
	})
	testutil.WaitFor(t, "the OpenSSH control master", func() bool {
		return exec.Command(sshBin, sshArgs("-O", "check", ts.account+"@127.0.0.1")...).Run() == nil
	})

	// limit sessions that stay open, then one more.
	release := filepath.Join(dir, "release")
	var holders []*exec.Cmd
	for range limit {
		cmd := exec.Command(sshBin, sshArgs(ts.account+"@127.0.0.1",
			"echo open; while [ ! -e "+release+" ]; do sleep 0.05; done")...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, cmd)
		line := make([]byte, len("open\n"))
		if _, err := io.ReadFull(stdout, line); err != nil {
			t.Fatalf("held session did not start: %v", err)
		}
	}
	t.Cleanup(func() {
		os.WriteFile(release, nil, 0o600)
		for _, cmd := range holders {
			cmd.Wait()
		}
	})
	// ssh(1) reports the refusal, then tries a connection of its own, which the server
	// refuses for want of an execution id (SetEnv is the master's): nothing runs.
	one := exec.Command(sshBin, sshArgs(ts.account+"@127.0.0.1", "echo ran")...)
	out, err := one.CombinedOutput()
	if err == nil || strings.Contains(string(out), "ran") || !strings.Contains(string(out), "Session open refused by peer") {
		t.Errorf("session %d over one connection: %v, %q; want it refused by the server", limit+1, err, out)
	}
}
