package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TestHostsEnroll enrolls real hostagents into a state dir with no daemon: each step runs
// on the inventory the steps before it left.
func TestHostsEnroll(t *testing.T) {
	first, second := harness.StartHostagent(t), harness.StartHostagent(t)
	stateDir := filepath.Join(sockdir.New(t), "state")
	inventory := config.DefaultConfig(stateDir).InventoryPath()
	fp := gossh.FingerprintSHA256
	enroll := func(args ...string) []string {
		return append(append([]string{"hosts", "enroll"}, args...), "--state-dir", stateDir)
	}

	steps := []struct {
		name  string
		args  []string
		stdin string
		// wantErr is the error the command must return (nil: success).
		wantErr error
		// wantOut and wantErrText must appear in stdout and in the error.
		wantOut, wantErrText []string
		// wantKey is the key the inventory holds for "web" afterwards (nil: not enrolled).
		wantKey gossh.PublicKey
	}{
		{
			name: "answer n refuses", args: enroll("web", first.Addr), stdin: "n\n",
			wantErr: errNotConfirmed,
			wantOut: []string{"host web at " + first.Addr + " presents ssh-ed25519 " + fp(first.HostKey), "Record this key? [y/N] "},
		},
		{
			name: "no answer refuses", args: enroll("web", first.Addr), stdin: "",
			wantErr: errNotConfirmed,
		},
		{
			name: "answer yes records", args: enroll("web", first.Addr), stdin: "YES\n",
			wantOut: []string{"Record this key? [y/N] ", "enrolled host web (" + first.Addr},
			wantKey: first.HostKey,
		},
		{
			name: "the same key again asks nothing", args: enroll("web", first.Addr), stdin: "",
			wantOut: []string{"the key is the one already enrolled for web"},
			wantKey: first.HostKey,
		},
		{
			name: "a changed key is refused, even with --yes", args: enroll("web", second.Addr, "--yes"),
			wantErrText: []string{"refusing", fp(first.HostKey), fp(second.HostKey), "--replace"},
			wantKey:     first.HostKey,
		},
		{
			name: "--replace still asks", args: enroll("web", second.Addr, "--replace"), stdin: "n\n",
			wantErr: errNotConfirmed,
			wantOut: []string{"replaces host web's enrolled key " + fp(first.HostKey)},
			wantKey: first.HostKey,
		},
		{
			name: "--replace --yes records the new key", args: enroll("--replace", "web", second.Addr, "--yes"),
			wantOut: []string{"enrolled host web (" + second.Addr},
			wantKey: second.HostKey,
		},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			res := runCLI(t, step.stdin, step.args...)
			switch {
			case step.wantErr != nil && !errors.Is(res.err, step.wantErr):
				t.Fatalf("err = %v; want %v", res.err, step.wantErr)
			case step.wantErr == nil && step.wantErrText == nil && res.err != nil:
				t.Fatalf("err = %v; want success\n%s", res.err, res.stdout)
			case step.wantErrText != nil && res.err == nil:
				t.Fatalf("succeeded; want an error naming %q", step.wantErrText)
			}
			for _, want := range step.wantErrText {
				if !strings.Contains(res.err.Error(), want) {
					t.Errorf("error %q lacks %q", res.err, want)
				}
			}
			for _, want := range step.wantOut {
				if !strings.Contains(res.stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, res.stdout)
				}
			}
			got := enrolledKey(t, inventory, "web")
			switch {
			case step.wantKey == nil && got != nil:
				t.Fatalf("web is enrolled with %s; want it not enrolled", fp(got))
			case step.wantKey != nil && (got == nil || !bytes.Equal(got.Marshal(), step.wantKey.Marshal())):
				t.Fatalf("web's key = %v; want %s", got, fp(step.wantKey))
			}
		})
	}

	t.Run("prints the bastion's key for authorized_keys", func(t *testing.T) {
		res := mustRun(t, enroll("db", first.Addr, "--yes", "--account", "deploy", "--cwd", "/srv", "--group", "a", "--group", "b")...)
		data, err := os.ReadFile(config.DefaultConfig(stateDir).ClientKeyPath())
		if err != nil {
			t.Fatal(err)
		}
		signer, err := gossh.ParsePrivateKey(data)
		if err != nil {
			t.Fatal(err)
		}
		if line := string(gossh.MarshalAuthorizedKey(signer.PublicKey())); !strings.HasSuffix(res.stdout, "authorized_keys_file setting):\n\n"+line) {
			t.Fatalf("stdout does not end with the bastion's key %q:\n%s", line, res.stdout)
		}
		inv, err := fleet.OpenInventory(inventory)
		if err != nil {
			t.Fatal(err)
		}
		h, err := inv.Host("db")
		if err != nil {
			t.Fatal(err)
		}
		if h.Account != "deploy" || h.Cwd != "/srv" || !slices.Equal(h.Groups, []string{"a", "b"}) {
			t.Fatalf("db = %+v; want account deploy, cwd /srv, groups a and b", h)
		}
	})

	t.Run("says a host that accepts the bastion's key is ready, without the line", func(t *testing.T) {
		// The state dir has its key now (the steps above made it): the host authorizes it.
		pub, err := os.ReadFile(config.DefaultConfig(stateDir).ClientPublicKeyPath())
		if err != nil {
			t.Fatal(err)
		}
		testutil.WriteAuthorizedKeys(t, second.AuthorizedKeysPath(), second.ClientKey.AuthorizedLine(), strings.TrimSpace(string(pub)))
		res := mustRun(t, enroll("app", second.Addr, "--yes")...)
		if !strings.Contains(res.stdout, "app accepts the bastion's key as "+second.Account+": ready") || strings.Contains(res.stdout, string(pub)) {
			t.Fatalf("stdout = %q; want it ready, without the key to add", res.stdout)
		}
	})

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{enroll("web"), enroll("web", first.Addr, "extra"), enroll(),
			enroll("bad name", first.Addr, "--yes"), enroll("web", first.Addr, "--cwd", "relative", "--yes")} {
			if res := runCLI(t, "", args...); !errors.Is(res.err, cli.ErrUsage) {
				t.Errorf("%v: err = %v; want a usage error", args, res.err)
			}
		}
	})
}

// enrolledKey is the key the inventory at path holds for name (nil: not enrolled).
func enrolledKey(t *testing.T, path, name string) gossh.PublicKey {
	t.Helper()
	inv, err := fleet.OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := inv.Host(name)
	if errors.Is(err, fleet.ErrUnknownHost) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return h.HostKey
}
