package hostagent

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
)

// TestAuthorizePerAccount: a key in authorized_keys_dir/<account> logs in as that account
// only; a key in the global file as every allowed account; a key file others can write, or
// another user owns, lets nobody in.
func TestAuthorizePerAccount(t *testing.T) {
	dir := t.TempDir()
	global, alice, bob := testutil.NewSSHKey(t), testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	keysDir := filepath.Join(dir, "keys")
	os.Mkdir(keysDir, 0o700)
	testutil.WriteAuthorizedKeys(t, filepath.Join(dir, "authorized_keys"), global.AuthorizedLine())
	testutil.WriteAuthorizedKeys(t, filepath.Join(keysDir, "alice"), alice.AuthorizedLine())
	testutil.WriteAuthorizedKeys(t, filepath.Join(keysDir, "bob"), bob.AuthorizedLine())
	// A file for an account that is not allowed: never consulted.
	testutil.WriteAuthorizedKeys(t, filepath.Join(keysDir, "mallory"), alice.AuthorizedLine())
	cfg := DefaultConfig()
	cfg.AuthorizedKeysFile = filepath.Join(dir, "authorized_keys")
	cfg.AuthorizedKeysDir = keysDir
	cfg.AllowedAccounts = []string{"alice", "bob"}
	a := newAuthenticator(cfg, slog.New(slog.DiscardHandler))
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}

	tests := []struct {
		name   string
		user   string
		key    gossh.PublicKey
		wantIn bool
	}{
		{"alice's key as alice", "alice", alice.Public(), true},
		{"alice's key as bob", "bob", alice.Public(), false},
		{"bob's key as bob", "bob", bob.Public(), true},
		{"bob's key as alice", "alice", bob.Public(), false},
		{"global key as alice", "alice", global.Public(), true},
		{"global key as bob", "bob", global.Public(), true},
		{"alice's key as an account not allowed", "mallory", alice.Public(), false},
		{"a path as the user", "../keys/alice", alice.Public(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.authorize(tt.user, remote, tt.key)
			if (err == nil) != tt.wantIn || err != nil && !errors.Is(err, ErrNotAuthorized) {
				t.Errorf("authorize = %v; want in = %v", err, tt.wantIn)
			}
		})
	}

	t.Run("group-writable account file", func(t *testing.T) {
		os.Chmod(filepath.Join(keysDir, "alice"), 0o620)
		defer os.Chmod(filepath.Join(keysDir, "alice"), 0o600)
		if _, err := a.authorize("alice", remote, alice.Public()); err == nil {
			t.Error("a key from a group-writable file was accepted")
		}
	})
	t.Run("account file owned by another user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chown needs root")
		}
		os.Chown(filepath.Join(keysDir, "bob"), 4242, 4242)
		if _, err := a.authorize("bob", remote, bob.Public()); err == nil {
			t.Error("a key from a file another user owns was accepted")
		}
	})
	if _, err := a.authorize("alice", remote, alice.Public()); err != nil {
		t.Errorf("after the mode was fixed: %v; want alice's key accepted again", err)
	}
}
