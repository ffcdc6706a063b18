package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{name: "no command", args: nil, wantCode: 2},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2},
		{name: "bad flag", args: []string{"serve", "--nope"}, wantCode: 2},
		{name: "stray argument", args: []string{"install", "extra"}, wantCode: 2},
		{name: "help", args: []string{"serve", "-h"}, wantCode: 0},
		{name: "missing config", args: []string{"serve", "--config", "/nonexistent/config.toml"}, wantCode: 1},
		{name: "reload stray argument", args: []string{"reload", "now"}, wantCode: 2},
		{name: "reload help", args: []string{"reload", "-h"}, wantCode: 0},
		{name: "reload with no agent", args: []string{"reload", "--config", "/nonexistent/config.toml"}, wantCode: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			if got := prog.ExitCode(err, &stderr); got != tt.wantCode {
				t.Errorf("exit code = %d (err %v); want %d", got, err, tt.wantCode)
			}
		})
	}
}

// TestMain lets the test binary stand in for postern-hostagent when the executor re-executes
// it as the supervisor.
func TestMain(m *testing.M) {
	if supervisor.Invoked(os.Args) {
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func TestInstallThenServe(t *testing.T) {
	root := sockdir.New(t) // the installed data dir holds the control socket
	var out bytes.Buffer
	if err := run(context.Background(), []string{"install", "--root", root}, &out, &out); err != nil {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	configPath := filepath.Join(root, hostagent.DefaultConfigPath)
	key := testutil.NewSSHKey(t)
	testutil.WriteAuthorizedKeys(t, filepath.Join(root, hostagent.DefaultAuthorizedKeysPath), key.AuthorizedLine())
	// Point the installed config at the test root.
	cfgText := strings.ReplaceAll(mustRead(t, configPath), `"/`, `"`+root+`/`)
	if err := os.WriteFile(configPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // serve listens itself; the port is reused at once on 127.0.0.1

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stdout, stderr testutil.LockedBuffer
	go func() {
		done <- run(ctx, []string{"serve", "--config", configPath, "--listen", addr}, &stdout, &stderr)
	}()

	hostKey, err := hostagent.LoadOrCreateHostKey(filepath.Join(root, "var/lib/postern-hostagent/host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := user.Current()
	var client *gossh.Client
	deadline := time.Now().Add(60 * time.Second)
	for client == nil {
		select {
		case err := <-done:
			t.Fatalf("serve returned %v before it served\n%s", err, stderr.String())
		default:
		}
		client, err = testutil.DialSSH(t, addr, u.Username, hostKey.PublicKey(), gossh.PublicKeys(key.Signer))
		if err != nil && time.Now().After(deadline) {
			t.Fatalf("dial: %v\n%s", err, stderr.String())
		}
		if err != nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	sess.Setenv("POSTERN_EXECUTION_ID", "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW")
	var serr bytes.Buffer
	sess.Stderr = &serr
	got, err := sess.Output("echo ran under a marker")
	if err != nil || string(got) != "ran under a marker\n" {
		t.Errorf("run: %q, %v, stderr %q; want the command's output", got, err, serr.String())
	}
	// A second agent on the same data dir is refused, naming the first (this process: the
	// lock belongs to an open file, so it holds within one process too).
	var second bytes.Buffer
	err = run(context.Background(), []string{"serve", "--config", configPath, "--listen", "127.0.0.1:0"}, &second, &second)
	if want := fmt.Sprintf("in use by another process (pid %d)", os.Getpid()); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--data-dir") {
		t.Errorf("second serve: %v; want an error naming %q and --data-dir", err, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve returned %v\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "no authorized keys") {
		t.Errorf("serve with a key warned that it has none:\n%s", stderr.String())
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestServeReportsEveryConfigProblemAtOnce: an unknown key and invalid values come in one
// error, before anything is opened.
func TestServeReportsEveryConfigProblemAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("listen = \"nonsense\"\ndata_dir = \"relative\"\nno_such_key = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := run(context.Background(), []string{"serve", "--config", path}, &out, &out)
	if err == nil {
		t.Fatal("serve accepted a config with three problems")
	}
	for _, want := range []string{"no_such_key: unknown key", "listen: want host:port", "data_dir: must be an absolute path"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("serve error:\n%v\nwant it to include %q", err, want)
		}
	}
}

// TestInstallUnderARootThenServeWithoutKeys: install under --root says that it wrote for the
// machine that root becomes, and names every file where it really is; a hostagent started
// with no authorized key at all says that nobody can log in, and where the key goes.
func TestInstallUnderARootThenServeWithoutKeys(t *testing.T) {
	root := sockdir.New(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"install", "--root", root}, &out, &out); err != nil {
		t.Fatalf("install: %v\n%s", err, out.String())
	}
	configPath := filepath.Join(root, hostagent.DefaultConfigPath)
	keysPath := filepath.Join(root, hostagent.DefaultAuthorizedKeysPath)
	for _, want := range []string{
		"installed under " + root + " for the machine whose / it becomes",
		"data_dir /var/lib/postern-hostagent, not " + filepath.Join(root, "var/lib/postern-hostagent"),
		"wrote config          " + configPath,
		"wrote authorized keys " + keysPath + " (empty",
		"data dir              " + filepath.Join(root, "var/lib/postern-hostagent"),
		"wrote unit            " + filepath.Join(root, hostagent.DefaultUnitPath),
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("install printed no %q:\n%s", want, out.String())
		}
	}

	// Run it here after all: its paths moved under the root.
	cfgText := strings.ReplaceAll(mustRead(t, configPath), `"/`, `"`+root+`/`)
	if err := os.WriteFile(configPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stdout, stderr testutil.LockedBuffer
	go func() {
		done <- run(ctx, []string{"serve", "--config", configPath, "--listen", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	testutil.WaitFor(t, "serve to listen", func() bool { return strings.Contains(stdout.String(), "listening on") })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve returned %v\n%s", err, stderr.String())
	}
	if log := stderr.String(); !strings.Contains(log, "no authorized keys: nobody can log in") || !strings.Contains(log, keysPath) {
		t.Errorf("serve with no key said:\n%s\nwant a warning naming %s", log, keysPath)
	}
}
