package bastion_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/privdir"
)

func stateDirConfig(dir string) config.Config {
	cfg := config.DefaultConfig(dir)
	cfg.Listen = ""
	cfg.Actors = []policy.Actor{{Name: "t", TokenSHA256: transport.HashToken("t")}}
	return cfg
}

// TestOpenMakesPremadeStateDirPrivate: a state dir made beforehand with mkdir (0755) and a
// file in it (0644) become 0700 and 0600, each fix logged.
func TestOpenMakesPremadeStateDirPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	os.Mkdir(dir, 0o755)
	os.Chmod(dir, 0o755)
	hosts := filepath.Join(dir, "hosts.toml")
	os.WriteFile(hosts, nil, 0o644)
	os.Chmod(hosts, 0o644)
	var logs bytes.Buffer
	b, err := bastion.Open(bastion.Options{Config: stateDirConfig(dir), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for path, want := range map[string]os.FileMode{dir: 0o700, hosts: 0o600} {
		info, err := os.Stat(path)
		if err != nil || info.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want mode %v", path, info.Mode(), err, want)
		}
	}
	if n := strings.Count(logs.String(), "tightened permissions"); n != 2 {
		t.Errorf("%d fixes logged; want 2:\n%s", n, logs.String())
	}
}

// TestOpenRefusesForeignStateDir: a state dir that belongs to another user is refused and
// left alone.
func TestOpenRefusesForeignStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another user needs root")
	}
	dir := filepath.Join(t.TempDir(), "state")
	os.Mkdir(dir, 0o700)
	if err := os.Chown(dir, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	_, err := bastion.Open(bastion.Options{Config: stateDirConfig(dir), Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, privdir.ErrForeignOwner) {
		t.Fatalf("Open = %v; want ErrForeignOwner", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the refused state dir got %d entries", len(entries))
	}
}
