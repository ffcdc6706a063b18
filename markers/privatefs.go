package markers

import (
	"fmt"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// privateFS is Pebble's disk file system with the store's files made 0600 and its
// directories 0700 as they are created, instead of 0666/0755 less the umask: a store holds
// commands, output tails and response bodies, which other local users must not read even if
// a directory above it is opened up later.
type privateFS struct{ vfs.FS }

var _ vfs.FS = privateFS{}

func (fs privateFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	return private(fs.FS.Create(name, category))
}

func (fs privateFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return private(fs.FS.OpenReadWrite(name, category, opts...))
}

func (fs privateFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	return private(fs.FS.ReuseForWrite(oldname, newname, category))
}

func (fs privateFS) MkdirAll(dir string, perm os.FileMode) error {
	return fs.FS.MkdirAll(dir, perm&0o700)
}

func (fs privateFS) Lock(name string) (io.Closer, error) {
	c, err := fs.FS.Lock(name)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(name, 0o600); err != nil {
		c.Close()
		return nil, fmt.Errorf("markers: make %s private: %w", name, err)
	}
	return c, nil
}

// private takes away group and other permissions from a file just opened for writing.
func private(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	if err := unix.Fchmod(int(f.Fd()), 0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("markers: make a store file private: %w", err)
	}
	return f, nil
}
