package hostagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

const validID = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW"

// testHandler runs commands with os/exec and reports the exit status; it records every
// request it was handed.
type testHandler struct {
	mu       sync.Mutex
	execs    []hostagent.ExecRequest
	controls []hostagent.Identity
}

func (h *testHandler) Exec(ctx context.Context, s gliderssh.Session, req hostagent.ExecRequest) {
	h.mu.Lock()
	h.execs = append(h.execs, req)
	h.mu.Unlock()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", req.Command)
	cmd.Env = req.Env
	cmd.Stdout, cmd.Stderr = s, s.Stderr()
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		s.Exit(0)
	case errors.As(err, &exitErr):
		s.Exit(exitErr.ExitCode())
	default:
		io.WriteString(s.Stderr(), err.Error())
		s.Exit(254)
	}
}

func (h *testHandler) Control(ctx context.Context, s gliderssh.Session, caller hostagent.Identity) {
	h.mu.Lock()
	h.controls = append(h.controls, caller)
	h.mu.Unlock()
	io.WriteString(s, `{"ok":true,"account":"`+caller.Account+`"}`+"\n")
	s.Exit(0)
}

func (h *testHandler) execCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.execs)
}

func (h *testHandler) lastExec(t *testing.T) hostagent.ExecRequest {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.execs) == 0 {
		t.Fatal("handler was not called")
	}
	return h.execs[len(h.execs)-1]
}

type testServer struct {
	srv            *hostagent.Server
	cfg            hostagent.Config
	addr           string
	account        string
	handler        *testHandler
	key            testutil.SSHKey // listed in authorized_keys
	ca             testutil.SSHKey // listed in the trusted CA file
	authorizedKeys string
}

func currentUser(t testing.TB) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatalf("current user: %v", err)
	}
	return u.Username
}

// startServer runs a hostagent on 127.0.0.1 with one authorized key and one trusted CA.
func startServer(t testing.TB, configure func(*hostagent.Config)) *testServer {
	t.Helper()
	dir := t.TempDir()
	ts := &testServer{
		account:        currentUser(t),
		handler:        &testHandler{},
		key:            testutil.NewSSHKey(t),
		ca:             testutil.NewSSHKey(t),
		authorizedKeys: filepath.Join(dir, "authorized_keys"),
	}
	testutil.WriteAuthorizedKeys(t, ts.authorizedKeys, ts.key.AuthorizedLine())
	caFile := filepath.Join(dir, "user_ca.pub")
	testutil.WriteAuthorizedKeys(t, caFile, ts.ca.AuthorizedLine())

	cfg := hostagent.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.AuthorizedKeysFile = ts.authorizedKeys
	cfg.TrustedUserCAKeysFile = caFile
	cfg.AllowedAccounts = []string{ts.account}
	cfg.AcceptEnv = []string{"EXTRA_OK", "APP_*"}
	if configure != nil {
		configure(&cfg)
	}
	ts.cfg = cfg
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := hostagent.NewServer(cfg, ts.handler, logger)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ts.srv, ts.addr = srv, ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ts
}

// testWriter sends server logs to the test log, which shows them only on failure.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (ts *testServer) dial(t *testing.T, user string, auth ...gossh.AuthMethod) (*gossh.Client, error) {
	t.Helper()
	return testutil.DialSSH(t, ts.addr, user, ts.srv.HostPublicKey(), auth...)
}

func (ts *testServer) client(t testing.TB) *gossh.Client {
	t.Helper()
	return testutil.MustDialSSH(t, ts.addr, ts.account, ts.srv.HostPublicKey(), gossh.PublicKeys(ts.key.Signer))
}

type result struct {
	stdout, stderr string
	status         int // -1 when the server sent no exit status
	// refusedEnv are the env requests the server answered false (dropped), in order.
	refusedEnv []string
}

// run executes cmd with env (sent as env requests, in order) on a new session.
func run(t *testing.T, client *gossh.Client, env [][2]string, cmd string) result {
	t.Helper()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	defer sess.Close()
	var refused []string
	for _, kv := range env {
		if err := sess.Setenv(kv[0], kv[1]); err != nil {
			refused = append(refused, kv[0])
		}
	}
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr = &stdout, &stderr
	err = sess.Run(cmd)
	res := result{stdout: stdout.String(), stderr: stderr.String(), refusedEnv: refused}
	var exitErr *gossh.ExitError
	var missing *gossh.ExitMissingError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.status = exitErr.ExitStatus()
	case errors.As(err, &missing):
		res.status = -1
	default:
		t.Fatalf("run %q: %v", cmd, err)
	}
	return res
}

func withID(env ...[2]string) [][2]string {
	return append([][2]string{{"POSTERN_EXECUTION_ID", validID}}, env...)
}

func TestExecStreamsAndExitStatus(t *testing.T) {
	ts := startServer(t, nil)
	client := ts.client(t)
	tests := []struct {
		name                   string
		cmd                    string
		wantStdout, wantStderr string
		wantStatus             int
	}{
		{name: "success", cmd: "echo hello", wantStdout: "hello\n"},
		{name: "separate streams", cmd: "echo out; echo err >&2; exit 3", wantStdout: "out\n", wantStderr: "err\n", wantStatus: 3},
		{name: "high status", cmd: "exit 200", wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := run(t, client, withID(), tt.cmd)
			if got.stdout != tt.wantStdout || got.stderr != tt.wantStderr || got.status != tt.wantStatus {
				t.Errorf("got %+v; want stdout %q stderr %q status %d", got, tt.wantStdout, tt.wantStderr, tt.wantStatus)
			}
		})
	}
	req := ts.handler.lastExec(t)
	if req.ExecutionID != validID || req.Assigned || req.Account.Name != ts.account {
		t.Errorf("ExecRequest = %+v; want id %s, not assigned, account %s", req, validID, ts.account)
	}
	if want := gossh.FingerprintSHA256(ts.key.Public()); req.Identity.Fingerprint != want {
		t.Errorf("KeyFingerprint = %q; want %q", req.Identity.Fingerprint, want)
	}
}

func TestEnvAllowlist(t *testing.T) {
	ts := startServer(t, nil)
	got := run(t, ts.client(t), withID(
		[2]string{"LD_PRELOAD", "/nonexistent/evil.so"},
		[2]string{"BASH_ENV", "/tmp/evil"},
		[2]string{"FOO", "bar"},
		[2]string{"POSTERN_STEP", "2"},
		[2]string{"LANG", "C.UTF-8"},
		[2]string{"LC_TIME", "C"},
		[2]string{"EXTRA_OK", "yes"},
		[2]string{"APP_MODE", "prod"},
	), "env")
	if got.status != 0 {
		t.Fatalf("env: %+v", got)
	}
	want := []string{"APP_MODE=prod", "EXTRA_OK=yes", "LANG=C.UTF-8", "LC_TIME=C", "POSTERN_EXECUTION_ID=" + validID, "POSTERN_STEP=2"}
	if req := ts.handler.lastExec(t); strings.Join(req.Env, " ") != strings.Join(want, " ") {
		t.Errorf("ExecRequest.Env = %q; want %q", req.Env, want)
	}
	// A client that asks for replies is told what was dropped.
	if got, want := strings.Join(got.refusedEnv, " "), "LD_PRELOAD BASH_ENV FOO"; got != want {
		t.Errorf("refused env requests = %q; want %q", got, want)
	}
	for _, dropped := range []string{"LD_PRELOAD", "BASH_ENV", "FOO"} {
		if strings.Contains(got.stdout, dropped+"=") {
			t.Errorf("child environment contains %s:\n%s", dropped, got.stdout)
		}
	}
}

func TestExecutionIDRequired(t *testing.T) {
	ts := startServer(t, nil)
	client := ts.client(t)
	tests := []struct {
		name       string
		id         string // "" sends none
		wantStderr string
	}{
		{name: "missing", wantStderr: "postern: POSTERN_EXECUTION_ID is required"},
		{name: "no prefix", id: "01J3Z5V8Q4K7M2N9P0R6S8T1VW", wantStderr: "postern: invalid POSTERN_EXECUTION_ID"},
		{name: "too short", id: "ex_01J3Z5V8Q4", wantStderr: "postern: invalid POSTERN_EXECUTION_ID"},
		{name: "lower case", id: "ex_01j3z5v8q4k7m2n9p0r6s8t1vw", wantStderr: "postern: invalid POSTERN_EXECUTION_ID"},
		{name: "not crockford", id: "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VU", wantStderr: "postern: invalid POSTERN_EXECUTION_ID"},
		{name: "overflows 128 bits", id: "ex_81J3Z5V8Q4K7M2N9P0R6S8T1VW", wantStderr: "postern: invalid POSTERN_EXECUTION_ID"},
		{name: "shell metacharacters", id: "ex_$(touch /tmp/x)", wantStderr: "postern: invalid POSTERN_EXECUTION_ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var env [][2]string
			if tt.id != "" {
				env = append(env, [2]string{"POSTERN_EXECUTION_ID", tt.id})
			}
			got := run(t, client, env, "echo ran")
			if got.status != 255 || !strings.HasPrefix(got.stderr, tt.wantStderr) || got.stdout != "" {
				t.Errorf("got %+v; want status 255, stderr starting %q, no stdout", got, tt.wantStderr)
			}
		})
	}
	if n := ts.handler.execCount(); n != 0 {
		t.Errorf("handler ran %d commands; want 0", n)
	}
}

func TestExecutionIDAssigned(t *testing.T) {
	ts := startServer(t, func(c *hostagent.Config) { c.MissingExecutionID = hostagent.MissingIDAssign })
	client := ts.client(t)
	got := run(t, client, nil, `printf %s "$POSTERN_EXECUTION_ID"`)
	if got.status != 0 || !markers.ValidExecutionID(got.stdout) {
		t.Fatalf("got %+v; want a valid assigned id on stdout", got)
	}
	req := ts.handler.lastExec(t)
	if !req.Assigned || req.ExecutionID != got.stdout {
		t.Errorf("ExecRequest = %+v; want Assigned with id %s", req, got.stdout)
	}
	// An invalid id is refused even in assign mode.
	if got := run(t, client, [][2]string{{"POSTERN_EXECUTION_ID", "ex_bad"}}, "true"); got.status != 255 {
		t.Errorf("invalid id in assign mode: got %+v; want status 255", got)
	}
}

func TestOperationKeyTimeoutCwd(t *testing.T) {
	ts := startServer(t, nil)
	client := ts.client(t)
	tests := []struct {
		name       string
		env        [][2]string
		wantStatus int
		wantKey    string
		wantTO     time.Duration
		wantCwd    string
	}{
		{name: "none", env: withID()},
		{name: "both", env: withID([2]string{"POSTERN_OPERATION_KEY", "migration:2026_07_22"}, [2]string{"POSTERN_TIMEOUT_S", "90"}),
			wantKey: "migration:2026_07_22", wantTO: 90 * time.Second},
		{name: "key with space", env: withID([2]string{"POSTERN_OPERATION_KEY", "a b"}), wantStatus: 255},
		{name: "key too long", env: withID([2]string{"POSTERN_OPERATION_KEY", strings.Repeat("k", 257)}), wantStatus: 255},
		{name: "timeout zero", env: withID([2]string{"POSTERN_TIMEOUT_S", "0"}), wantStatus: 255},
		{name: "timeout negative", env: withID([2]string{"POSTERN_TIMEOUT_S", "-5"}), wantStatus: 255},
		{name: "timeout not a number", env: withID([2]string{"POSTERN_TIMEOUT_S", "10s"}), wantStatus: 255},
		{name: "cwd", env: withID([2]string{"POSTERN_CWD", "/tmp"}), wantCwd: "/tmp"},
		{name: "cwd relative", env: withID([2]string{"POSTERN_CWD", "tmp"}), wantStatus: 255},
		{name: "cwd unclean", env: withID([2]string{"POSTERN_CWD", "/tmp/../etc"}), wantStatus: 255},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := ts.handler.execCount()
			got := run(t, client, tt.env, "true")
			if got.status != tt.wantStatus {
				t.Fatalf("got %+v; want status %d", got, tt.wantStatus)
			}
			if tt.wantStatus != 0 {
				if ts.handler.execCount() != before || !strings.HasPrefix(got.stderr, "postern: ") {
					t.Errorf("refusal: got %+v, handler calls %d -> %d", got, before, ts.handler.execCount())
				}
				return
			}
			req := ts.handler.lastExec(t)
			if req.OperationKey != tt.wantKey || req.Timeout != tt.wantTO {
				t.Errorf("OperationKey, Timeout = %q, %v; want %q, %v", req.OperationKey, req.Timeout, tt.wantKey, tt.wantTO)
			}
			if tt.wantCwd != "" && req.Cwd != tt.wantCwd {
				t.Errorf("Cwd = %q; want %q", req.Cwd, tt.wantCwd)
			}
		})
	}
}

func TestAuthenticationRefused(t *testing.T) {
	ts := startServer(t, nil)
	stranger := testutil.NewSSHKey(t)
	tests := []struct {
		name string
		auth []gossh.AuthMethod
	}{
		{name: "unknown key", auth: []gossh.AuthMethod{gossh.PublicKeys(stranger.Signer)}},
		{name: "password only", auth: []gossh.AuthMethod{gossh.Password("hunter2")}},
		{name: "keyboard-interactive only", auth: []gossh.AuthMethod{gossh.KeyboardInteractive(
			func(string, string, []string, []bool) ([]string, error) { return nil, nil })}},
		{name: "no credentials", auth: nil},
		{name: "authorized key as a self-signed certificate", auth: []gossh.AuthMethod{gossh.PublicKeys(testutil.CertSigner(t,
			testutil.SignUserCert(t, ts.key, ts.key.Public(), testutil.UserCert{Principals: []string{ts.account}}), ts.key))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ts.dial(t, ts.account, tt.auth...); err == nil {
				t.Fatal("login succeeded; want refused")
			}
		})
	}
}

func TestUserCertificates(t *testing.T) {
	ts := startServer(t, nil)
	now := time.Now()
	otherCA := testutil.NewSSHKey(t)
	tests := []struct {
		name   string
		ca     testutil.SSHKey
		cert   testutil.UserCert
		wantOK bool
	}{
		{name: "valid", cert: testutil.UserCert{KeyID: "bastion-1", Principals: []string{ts.account}}, wantOK: true},
		{name: "one of several principals", cert: testutil.UserCert{Principals: []string{"ops", ts.account}}, wantOK: true},
		{name: "source-address matches", cert: testutil.UserCert{Principals: []string{ts.account},
			CriticalOptions: map[string]string{"source-address": "10.0.0.0/8,127.0.0.1/32"}}, wantOK: true},
		{name: "expired", cert: testutil.UserCert{Principals: []string{ts.account},
			ValidAfter: now.Add(-2 * time.Hour), ValidBefore: now.Add(-time.Hour)}},
		{name: "not yet valid", cert: testutil.UserCert{Principals: []string{ts.account},
			ValidAfter: now.Add(time.Hour), ValidBefore: now.Add(2 * time.Hour)}},
		{name: "wrong principal", cert: testutil.UserCert{Principals: []string{"someone-else"}}},
		{name: "wrong source-address", cert: testutil.UserCert{Principals: []string{ts.account},
			CriticalOptions: map[string]string{"source-address": "10.1.2.3"}}},
		{name: "unknown critical option", cert: testutil.UserCert{Principals: []string{ts.account},
			CriticalOptions: map[string]string{"force-command": "/bin/true"}}},
		{name: "untrusted CA", ca: otherCA, cert: testutil.UserCert{Principals: []string{ts.account}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca := ts.ca
			if tt.ca.Signer != nil {
				ca = tt.ca
			}
			key := testutil.NewSSHKey(t)
			cert := testutil.SignUserCert(t, ca, key.Public(), tt.cert)
			client, err := ts.dial(t, ts.account, gossh.PublicKeys(testutil.CertSigner(t, cert, key)))
			if gotOK := err == nil; gotOK != tt.wantOK {
				t.Fatalf("login ok = %v (err %v); want %v", gotOK, err, tt.wantOK)
			}
			if !tt.wantOK {
				return
			}
			if got := run(t, client, withID(), "echo cert"); got.status != 0 || got.stdout != "cert\n" {
				t.Errorf("got %+v; want cert output", got)
			}
			want := hostagent.Identity{Account: ts.account, Fingerprint: gossh.FingerprintSHA256(key.Public()), KeyID: tt.cert.KeyID}
			if got := ts.handler.lastExec(t).Identity; got != want {
				t.Errorf("Identity = %+v; want %+v (the certified key and the key id)", got, want)
			}
		})
	}
}

// TestUnusableCertificateKeyIDRefused: a key id that cannot name an identity (control
// characters, oversized) refuses the request with the reason; nothing reaches the handler.
func TestUnusableCertificateKeyIDRefused(t *testing.T) {
	ts := startServer(t, nil)
	key := testutil.NewSSHKey(t)
	cert := testutil.SignUserCert(t, ts.ca, key.Public(), testutil.UserCert{KeyID: "evil\nkey", Principals: []string{ts.account}})
	client, err := ts.dial(t, ts.account, gossh.PublicKeys(testutil.CertSigner(t, cert, key)))
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, client, withID(), "echo ran"); got.status != hostproto.ExitRefused || !strings.Contains(got.stderr, "key id") {
		t.Errorf("got %+v; want refused for the key id", got)
	}
	if ts.handler.execCount() != 0 {
		t.Error("the handler ran a request of an unusable identity")
	}
}

// A client offering a source-restricted certificate first and then a plain key must not
// carry the certificate's restrictions (or lose them) onto the wrong key.
func TestPermissionsFollowTheSigningKey(t *testing.T) {
	ts := startServer(t, nil)
	restricted := testutil.NewSSHKey(t)
	cert := testutil.SignUserCert(t, ts.ca, restricted.Public(), testutil.UserCert{
		Principals: []string{ts.account}, CriticalOptions: map[string]string{"source-address": "10.9.9.9"}})
	client, err := ts.dial(t, ts.account, gossh.PublicKeys(testutil.CertSigner(t, cert, restricted), ts.key.Signer))
	if err != nil {
		t.Fatalf("login with a restricted cert then an authorized key: %v", err)
	}
	if got := run(t, client, withID(), "true"); got.status != 0 {
		t.Fatalf("got %+v", got)
	}
	if want := gossh.FingerprintSHA256(ts.key.Public()); ts.handler.lastExec(t).Identity.Fingerprint != want {
		t.Errorf("KeyFingerprint = %q; want the authorized key %q", ts.handler.lastExec(t).Identity.Fingerprint, want)
	}
}

func TestAuthorizedKeysReload(t *testing.T) {
	ts := startServer(t, nil)
	second := testutil.NewSSHKey(t)
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(second.Signer)); err == nil {
		t.Fatal("second key accepted before it was authorized")
	}
	testutil.WriteAuthorizedKeys(t, ts.authorizedKeys, ts.key.AuthorizedLine(), second.AuthorizedLine())
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(second.Signer)); err != nil {
		t.Fatalf("second key refused after it was added: %v", err)
	}
	// Revocation; a key with an option the server does not implement is skipped.
	testutil.WriteAuthorizedKeys(t, ts.authorizedKeys, `command="/bin/true" `+second.AuthorizedLine(), "no-pty "+ts.key.AuthorizedLine())
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(second.Signer)); err == nil {
		t.Fatal("key with command= option accepted; want skipped")
	}
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(ts.key.Signer)); err != nil {
		t.Fatalf("key with benign no-pty option refused: %v", err)
	}
	if err := os.Remove(ts.authorizedKeys); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(ts.key.Signer)); err == nil {
		t.Fatal("key accepted after authorized_keys was removed")
	}
}

func TestRefusedRequests(t *testing.T) {
	ts := startServer(t, nil)
	client := ts.client(t)
	newSession := func(t *testing.T) *gossh.Session {
		t.Helper()
		sess, err := client.NewSession()
		if err != nil {
			t.Fatalf("new session: %v", err)
		}
		t.Cleanup(func() { sess.Close() })
		return sess
	}
	tests := []struct {
		name string
		try  func(t *testing.T) error
	}{
		{name: "pty", try: func(t *testing.T) error { return newSession(t).RequestPty("xterm", 24, 80, gossh.TerminalModes{}) }},
		{name: "shell", try: func(t *testing.T) error { return newSession(t).Shell() }},
		{name: "sftp subsystem", try: func(t *testing.T) error { return newSession(t).RequestSubsystem("sftp") }},
		{name: "agent forwarding", try: func(t *testing.T) error { return agent.RequestAgentForwarding(newSession(t)) }},
		{name: "x11", try: func(t *testing.T) error {
			ok, err := newSession(t).SendRequest("x11-req", true, gossh.Marshal(struct {
				Single        bool
				Proto, Cookie string
				Screen        uint32
			}{false, "MIT-MAGIC-COOKIE-1", "00", 0}))
			if err == nil && !ok {
				err = errors.New("refused")
			}
			return err
		}},
		{name: "local port forwarding", try: func(t *testing.T) error {
			c, err := client.Dial("tcp", ts.addr)
			if err == nil {
				c.Close()
			}
			return err
		}},
		{name: "remote port forwarding", try: func(t *testing.T) error {
			ln, err := client.Listen("tcp", "127.0.0.1:0")
			if err == nil {
				ln.Close()
			}
			return err
		}},
		{name: "second exec on one session", try: func(t *testing.T) error {
			sess := newSession(t)
			if err := sess.Start("sleep 0"); err != nil {
				return nil // also fine: refused outright
			}
			ok, err := sess.SendRequest("exec", true, gossh.Marshal(struct{ Command string }{"echo again"}))
			if err == nil && !ok {
				err = errors.New("refused")
			}
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.try(t); err == nil {
				t.Fatal("accepted; want refused")
			}
		})
	}
	// The connection still works after all the refusals.
	if got := run(t, client, withID(), "echo still"); got.stdout != "still\n" {
		t.Errorf("after refusals: %+v", got)
	}
}

func TestOversizedRequestsRefused(t *testing.T) {
	ts := startServer(t, func(c *hostagent.Config) {
		c.MaxCommandBytes = 100
		c.MaxEnvVars = 4
		c.MaxEnvValueBytes = 32
	})
	client := ts.client(t)
	tests := []struct {
		name       string
		env        [][2]string
		cmd        string
		wantStderr string
	}{
		{name: "command too long", env: withID(), cmd: "echo " + strings.Repeat("x", 100), wantStderr: "command is 105 bytes, the limit is 100"},
		{name: "too many variables", env: withID([2]string{"A1", "1"}, [2]string{"A2", "2"}, [2]string{"A3", "3"}, [2]string{"A4", "4"}),
			cmd: "true", wantStderr: "more than 4 environment variables"},
		{name: "value too long", env: withID([2]string{"LANG", strings.Repeat("v", 33)}), cmd: "true", wantStderr: "LANG is longer than 32 bytes"},
		{name: "invalid name", env: withID([2]string{"A=B", "1"}), cmd: "true", wantStderr: "invalid environment variable name"},
		{name: "empty command", env: withID(), cmd: "  ", wantStderr: "empty command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := run(t, client, tt.env, tt.cmd)
			if got.status != 255 || !strings.HasPrefix(got.stderr, "postern: ") || !strings.Contains(got.stderr, tt.wantStderr) {
				t.Errorf("got %+v; want status 255 and stderr containing %q", got, tt.wantStderr)
			}
		})
	}
	if n := ts.handler.execCount(); n != 0 {
		t.Errorf("handler ran %d commands; want 0", n)
	}
	// At the limits exactly, the command runs.
	if got := run(t, client, withID([2]string{"LANG", strings.Repeat("v", 32)}), "echo "+strings.Repeat("x", 95)); got.status != 0 {
		t.Errorf("at the limits: got %+v; want status 0", got)
	}
}

func TestAccountNotAllowed(t *testing.T) {
	ts := startServer(t, nil)
	other := "nobody"
	if ts.account == other {
		other = "daemon"
	}
	client, err := ts.dial(t, other, gossh.PublicKeys(ts.key.Signer))
	if err != nil {
		t.Fatalf("dial as %s: %v", other, err)
	}
	got := run(t, client, withID(), "id")
	if got.status != 255 || !strings.Contains(got.stderr, "account not allowed") {
		t.Errorf("got %+v; want status 255 and 'account not allowed'", got)
	}
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	stderr, err := sess.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.RequestSubsystem(hostagent.ControlSubsystem); err == nil {
		if msg, _ := io.ReadAll(stderr); !strings.Contains(string(msg), "account not allowed") {
			t.Errorf("control as %s: stderr %q; want refused", other, msg)
		}
	}
	if ts.handler.execCount() != 0 || len(ts.handler.controls) != 0 {
		t.Error("handler was called for a disallowed account")
	}
}

func TestControlSubsystem(t *testing.T) {
	ts := startServer(t, nil)
	sess, err := ts.client(t).NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	stdout, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.RequestSubsystem(hostagent.ControlSubsystem); err != nil {
		t.Fatalf("subsystem: %v", err)
	}
	got, err := io.ReadAll(stdout)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if want := `{"ok":true,"account":"` + ts.account + `"}` + "\n"; string(got) != want {
		t.Errorf("stdout = %q; want %q", got, want)
	}
}

// TestHello: the server answers the protocol hello with its version, hangs up on a client
// outside its window, and still serves a client that sends none (the previous release).
func TestHello(t *testing.T) {
	ts := startServer(t, nil)
	v, build, err := hostproto.SayHello(ts.client(t), "test")
	if err != nil || v != hostproto.Version || build == "" {
		t.Errorf("SayHello = %d, %q, %v; want version %d and the agent's build", v, build, err, hostproto.Version)
	}
	// The previous release sends no hello: its exec is served as ever.
	if got := run(t, ts.client(t), withID(), "echo ran"); got.status != 0 {
		t.Errorf("exec without a hello: %+v", got)
	}
	tooOld := ts.client(t)
	if ok, _, err := tooOld.SendRequest(hostproto.HelloRequest, true, []byte(`{"version":0}`)); ok && err == nil {
		t.Errorf("a hello of version 0 was accepted")
	}
	if err := tooOld.Wait(); err == nil {
		t.Errorf("the connection of a client outside the window stayed open")
	}
}

func TestHandshakeTimeout(t *testing.T) {
	ts := startServer(t, func(c *hostagent.Config) { c.HandshakeTimeout = 100 * time.Millisecond })
	conn, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Say nothing; the server must hang up. The deadline only bounds a broken test.
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Fatal("server did not close a connection that never authenticated")
	}
}

func TestCloseEndsRunningSessions(t *testing.T) {
	ts := startServer(t, nil)
	sess, err := ts.client(t).NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Setenv("POSTERN_EXECUTION_ID", validID); err != nil {
		t.Fatal(err)
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start("echo started; exec sleep 600"); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("started\n"))
	if _, err := io.ReadFull(stdout, line); err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := ts.srv.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := sess.Wait(); err == nil {
		t.Error("session ended cleanly; want it cut off by Close")
	}
}

func TestShutdownWaitsForHandlers(t *testing.T) {
	ts := startServer(t, nil)
	client := ts.client(t)
	done := make(chan result, 1)
	go func() {
		sess, err := client.NewSession()
		if err != nil {
			done <- result{stderr: err.Error()}
			return
		}
		defer sess.Close()
		sess.Setenv("POSTERN_EXECUTION_ID", validID)
		out, _ := sess.Output("sleep 1; echo finished")
		done <- result{stdout: string(out)}
	}()
	testutil.WaitFor(t, "one exec handled", func() bool { return ts.handler.execCount() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ts.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := <-done; got.stdout != "finished\n" {
		t.Errorf("running command after graceful shutdown: %+v; want it to finish", got)
	}
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(ts.key.Signer)); err == nil {
		t.Error("dial after Shutdown succeeded")
	}
}

// TestMaxSessionsPerConnection: idle session channels beyond max_sessions on one connection
// are refused with a reason; other connections, and the same one after a session closed, go
// on.
func TestMaxSessionsPerConnection(t *testing.T) {
	const limit = 10
	ts := startServer(t, func(c *hostagent.Config) { c.MaxSessions = limit })
	conn := ts.client(t)
	var open []gossh.Channel
	for i := range limit {
		ch, _, err := conn.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("session %d of %d: %v", i+1, limit, err)
		}
		open = append(open, ch)
	}
	_, _, err := conn.OpenChannel("session", nil)
	var refused *gossh.OpenChannelError
	if !errors.As(err, &refused) || refused.Reason != gossh.ResourceShortage || !strings.Contains(refused.Message, "too many sessions") {
		t.Fatalf("session %d = %v; want resource-shortage: too many sessions", limit+1, err)
	}
	if got := run(t, ts.client(t), withID(), "echo other"); got.stdout != "other\n" {
		t.Errorf("exec on another connection = %+v; want it served", got)
	}
	open[0].Close()
	testutil.WaitFor(t, "a session slot freed by the closed one", func() bool {
		ch, _, err := conn.OpenChannel("session", nil)
		if err != nil {
			return false
		}
		open = append(open, ch)
		return true
	})
	for _, ch := range open {
		ch.Close()
	}
}

// TestEnvRequestSetsAllAtOnce: the bastion's one-round-trip environment (hostproto.EnvRequest)
// is taken variable by variable as env requests are: true only if every one was accepted,
// and a dropped one never reaches the command.
func TestEnvRequestSetsAllAtOnce(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.client(t)
	tests := []struct {
		name    string
		vars    []hostproto.EnvVar
		wantOK  bool
		wantEnv []string
	}{
		{
			name:    "all accepted",
			vars:    []hostproto.EnvVar{{Name: "POSTERN_EXECUTION_ID", Value: validID}, {Name: "APP_MODE", Value: "prod"}, {Name: "LANG", Value: "C"}},
			wantOK:  true,
			wantEnv: []string{"APP_MODE=prod", "LANG=C", "POSTERN_EXECUTION_ID=" + validID},
		},
		{
			name:    "one dropped",
			vars:    []hostproto.EnvVar{{Name: "POSTERN_EXECUTION_ID", Value: validID}, {Name: "LD_PRELOAD", Value: "/evil.so"}, {Name: "APP_MODE", Value: "prod"}},
			wantOK:  false,
			wantEnv: []string{"APP_MODE=prod", "POSTERN_EXECUTION_ID=" + validID},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sess, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			payload, err := json.Marshal(tt.vars)
			if err != nil {
				t.Fatal(err)
			}
			ok, err := sess.SendRequest(hostproto.EnvRequest, true, gossh.Marshal(&struct{ Env string }{string(payload)}))
			if err != nil || ok != tt.wantOK {
				t.Fatalf("%s = %v, %v; want %v", hostproto.EnvRequest, ok, err, tt.wantOK)
			}
			if err := sess.Run("env"); err != nil {
				t.Fatalf("run: %v", err)
			}
			if req := ts.handler.lastExec(t); strings.Join(req.Env, " ") != strings.Join(tt.wantEnv, " ") {
				t.Errorf("ExecRequest.Env = %q; want %q", req.Env, tt.wantEnv)
			}
		})
	}
}

// TestEnvWithoutReplyGuardsTheExec: protocol 3's environment sent without waiting for its
// reply (hostproto.EnvRequest, want-reply false) and the exec right behind it: the command
// runs with the environment when every variable was taken, and never starts when one was
// not — the exec is refused, and the variables sent one by one then name it.
func TestEnvWithoutReplyGuardsTheExec(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.client(t)
	execs := func() int {
		ts.handler.mu.Lock()
		defer ts.handler.mu.Unlock()
		return len(ts.handler.execs)
	}
	for _, tt := range []struct {
		name    string
		vars    []hostproto.EnvVar
		wantRun bool
	}{
		{"all taken", []hostproto.EnvVar{{Name: "POSTERN_EXECUTION_ID", Value: validID}, {Name: "APP_MODE", Value: "prod"}}, true},
		{"one dropped", []hostproto.EnvVar{{Name: "POSTERN_EXECUTION_ID", Value: validID}, {Name: "LD_PRELOAD", Value: "/evil.so"}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sess, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			payload, err := json.Marshal(tt.vars)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sess.SendRequest(hostproto.EnvRequest, false, gossh.Marshal(&struct{ Env string }{string(payload)})); err != nil {
				t.Fatal(err)
			}
			before := execs()
			err = sess.Run("env")
			if tt.wantRun {
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				if req := ts.handler.lastExec(t); strings.Join(req.Env, " ") != "APP_MODE=prod POSTERN_EXECUTION_ID="+validID {
					t.Errorf("ExecRequest.Env = %q; want both variables", req.Env)
				}
				return
			}
			if err == nil || execs() != before {
				t.Fatalf("run = %v with %d new execs; want the exec refused and nothing run", err, execs()-before)
			}
			ok, err := sess.SendRequest("env", true, gossh.Marshal(&struct{ Name, Value string }{"LD_PRELOAD", "/evil.so"}))
			if err != nil || ok {
				t.Errorf("env LD_PRELOAD after the refused exec = %v, %v; want false (named as the one refused)", ok, err)
			}
		})
	}
}

// TestRunOfProtocol3: hostproto.Run on a connection of protocol 3 sends the environment and
// the exec in one round trip; a variable the hostagent does not take refuses the exec,
// nothing runs, and the error names the variable, as with the earlier protocols.
func TestRunOfProtocol3(t *testing.T) {
	ts := startServer(t, nil)
	c := ts.client(t)
	ctx := context.Background()
	res, err := hostproto.Run(ctx, c, hostproto.Exec{ExecutionID: validID, Command: "echo $APP_MODE", Env: map[string]string{"APP_MODE": "prod"}, Protocol: 3})
	if err != nil || res.ExitStatus != 0 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	if req := ts.handler.lastExec(t); !slices.Contains(req.Env, "APP_MODE=prod") {
		t.Errorf("ExecRequest.Env = %q; want APP_MODE=prod", req.Env)
	}
	ts.handler.mu.Lock()
	before := len(ts.handler.execs)
	ts.handler.mu.Unlock()
	_, err = hostproto.Run(ctx, c, hostproto.Exec{ExecutionID: validID, Command: "true", Env: map[string]string{"LD_PRELOAD": "/evil.so"}, Protocol: 3})
	if !errors.Is(err, hostproto.ErrRefused) || !strings.Contains(err.Error(), "env LD_PRELOAD") {
		t.Errorf("Run with a variable the host drops = %v; want ErrRefused naming LD_PRELOAD", err)
	}
	ts.handler.mu.Lock()
	defer ts.handler.mu.Unlock()
	if n := len(ts.handler.execs) - before; n != 0 {
		t.Errorf("%d commands ran after the refused environment", n)
	}
}
