// Package unixuser makes throwaway local accounts for tests that need a peer of another uid
// (tests run as root), and places to put what those accounts must reach. It imports nothing
// of Postern, so the bastion's own packages can use it.
package unixuser

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// User is a throwaway local account made for one test.
type User struct {
	Name     string
	UID, GID int
	// Home is the account's home directory ("" for accounts made by New).
	Home string
}

// Credential runs a child process as the user (exec.Cmd.SysProcAttr.Credential).
func (u User) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), NoSetGroups: true}
}

// New creates a system account without a home or a login shell, named prefix plus
// this process's id (prefix should name the branch or test, for whoever finds it left over),
// and deletes it at cleanup. It skips the test unless it runs as root.
func New(t testing.TB, prefix string) User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a throwaway user needs root")
	}
	name := fmt.Sprintf("%s%d", prefix, os.Getpid())
	if len(name) > 32 {
		t.Fatalf("user name %q is longer than 32 characters", name)
	}
	if out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return User{Name: name, UID: uid, GID: gid}
}

// NewLogin creates the account name exactly, with a home directory and /bin/sh as its shell
// (commands run as it), and removes it with its home at cleanup; an account of that name
// left by an earlier, killed run is removed first. Names should say which tests own them.
// It skips the test unless it runs as root.
func NewLogin(t testing.TB, name string) User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("creating the account %s needs root; running as uid %d", name, os.Geteuid())
	}
	remove := func() error {
		if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
			return fmt.Errorf("userdel %s: %v\n%s", name, err, out)
		}
		return nil
	}
	if _, err := user.Lookup(name); err == nil {
		remove()
	}
	if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Error(err)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return User{Name: name, UID: uid, GID: gid, Home: u.HomeDir}
}

// SharedDir returns a new directory every local user may search (0755), removed at cleanup:
// t.TempDir's directories are 0700, out of other users' reach.
func SharedDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// SharedBinary makes the binary at path runnable by every local user: a hard link (the same
// inode, so a daemon still recognizes its own executable) or else a copy, in a SharedDir.
func SharedBinary(t testing.TB, path string) string {
	t.Helper()
	dst := filepath.Join(SharedDir(t, "postern-shared-bin-"), filepath.Base(path))
	if err := os.Link(path, dst); err != nil {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}
