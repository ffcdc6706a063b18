package hostagent_test

import (
	"bytes"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
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
