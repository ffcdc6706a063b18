// Package durable writes files that are complete and survive a crash once a call returns:
// the data is written to a temporary file and synced, then put in place by rename (replace)
// or link (create only), and the directory entry is synced. Readers see the old file, or
// none, or the whole new one — never a part.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// WriteFile replaces path with data.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("durable: install %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// CreateFile creates path with data, or fails with an error wrapping fs.ErrExist and leaves
// an existing file alone.
func CreateFile(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("durable: create %s: %w", path, fs.ErrExist)
		}
		return fmt.Errorf("durable: install %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// writeTemp writes data to a synced temporary file next to path and returns its name.
func writeTemp(path string, data []byte, perm fs.FileMode) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("durable: temporary for %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("durable: write temporary for %s: %w", path, err)
	}
	return f.Name(), nil
}

// SyncDir makes the entries created or renamed in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("durable: open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("durable: sync %s: %w", dir, err)
	}
	return nil
}

// AppendFile appends data to the log file at path (0600, created if need be, never through a
// symlink) and syncs it; a file it creates has its directory entry synced too, so the
// appended record survives a crash once AppendFile returns.
func AppendFile(path string, data []byte) error {
	_, statErr := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && errors.Is(statErr, fs.ErrNotExist) {
		err = SyncDir(filepath.Dir(path))
	}
	return err
}
