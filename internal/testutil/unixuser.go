package testutil

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"testing"
)

// UnixUser is a throwaway local account with a home directory, for tests where accounts
// matter (what one account may see of another's work).
type UnixUser struct {
	Name     string
	UID, GID uint32
	Home     string
}

// NewUnixUser creates the account name (useradd -m, shell /bin/sh) and removes it with its
// home at cleanup; an account of that name left by an earlier, killed run is removed first.
// Names should say which tests own them. It skips the test unless run as root.
func NewUnixUser(t testing.TB, name string) UnixUser {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("creating the account %s needs root; running as uid %d", name, os.Geteuid())
	}
	if _, err := user.Lookup(name); err == nil {
		removeUnixUser(t, name)
	}
	if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { removeUnixUser(t, name) })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return UnixUser{Name: name, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
}

func removeUnixUser(t testing.TB, name string) {
	t.Helper()
	if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
		t.Errorf("userdel %s: %v\n%s", name, err, out)
	}
}
