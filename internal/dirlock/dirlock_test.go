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
