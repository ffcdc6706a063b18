package durable_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/postern-dev/postern/internal/durable"
)

func TestWriteAndCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := durable.CreateFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := durable.CreateFile(path, []byte("two"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v; want fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "one" {
		t.Fatalf("after a refused create: %q; want one", got)
	}
	if err := durable.WriteFile(path, []byte("three"), 0o640); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	info, _ := os.Stat(path)
	if string(got) != "three" || info.Mode().Perm() != 0o640 {
		t.Errorf("after write: %q %v; want three 0640", got, info.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d entries; want no temporary files left", len(entries))
	}
}

// TestAppendFile: appends accumulate in a 0600 file, and a symlink is never followed.
func TestAppendFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log.jsonl")
	for _, line := range []string{"a\n", "b\n"} {
		if err := durable.AppendFile(path, []byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "a\nb\n" {
		t.Fatalf("log = %q, %v; want both lines", got, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v; want 0600", fi.Mode(), err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if err := durable.AppendFile(link, []byte("c\n")); err == nil {
		t.Fatal("appended through a symlink")
	}
}
