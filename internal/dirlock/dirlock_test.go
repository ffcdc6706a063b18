package dirlock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestAcquireNamesTheHolder(t *testing.T) {
	dir := t.TempDir()
	held, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to an open file, so a second open in this process is refused too.
	_, err = Acquire(dir)
	var he *HeldError
	if !errors.As(err, &he) || he.PID != os.Getpid() || he.Dir != dir {
		t.Fatalf("second Acquire: err = %v; want a HeldError naming pid %d", err, os.Getpid())
	}
	if info, err := os.Stat(filepath.Join(dir, FileName)); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v, %v; want mode 0600", err, info)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	again.Release()
}

func TestHeldErrorWithoutAPID(t *testing.T) {
	dir := t.TempDir()
	// The holder has locked but not yet written its pid (or wrote garbage).
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := flockNB(f); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir)
	var he *HeldError
	if !errors.As(err, &he) || he.PID != 0 || he.Error() != dir+" is in use by another process" {
		t.Fatalf("err = %v; want a HeldError without a pid", err)
	}
}

func TestLastHolder(t *testing.T) {
	dir := t.TempDir()
	if pid, held, err := LastHolder(dir); pid != 0 || held || err != nil {
		t.Fatalf("no lock file: %d, %v, %v; want 0, false, nil", pid, held, err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if pid, held, err := LastHolder(dir); pid != os.Getpid() || !held || err != nil {
		t.Fatalf("held: %d, %v, %v; want %d, true, nil", pid, held, err, os.Getpid())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if pid, held, err := LastHolder(dir); pid != 0 || held || err != nil {
		t.Fatalf("released: %d, %v, %v; want 0, false, nil", pid, held, err)
	}
	// A holder that dies drops the lock without clearing its pid: the kernel closes the file.
	l, err = Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	l.f.Close()
	if pid, held, err := LastHolder(dir); pid != os.Getpid() || held || err != nil {
		t.Fatalf("holder died: %d, %v, %v; want %d, false, nil", pid, held, err, os.Getpid())
	}
	// LastHolder reads without changing anything: a daemon can take the lock after it.
	again, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after LastHolder: %v", err)
	}
	again.Release()
}
