// Package unixpath checks a unix socket path against the kernel's limit before it is bound or
// dialed, so that an over-long path (a deep state_dir or data_dir) fails with an error that
// says what to do, instead of the kernel's bare "invalid argument".
package unixpath

import (
	"errors"
	"fmt"
)

// Max is the longest path a unix socket can be bound or connected to on Linux: sun_path holds
// 108 bytes, the last of them the terminating NUL.
const Max = 107

// ErrTooLong: the path does not fit in sun_path.
var ErrTooLong = errors.New("unix socket path too long")

// Check returns ErrTooLong, naming the path, its length and the remedy, when path does not
// fit; what names the directory setting the path comes from (e.g. "state_dir").
func Check(path, what string) error {
	if len(path) <= Max {
		return nil
	}
	return fmt.Errorf("%w: %s is %d bytes, the kernel's limit is %d: use a shorter %s", ErrTooLong, path, len(path), Max, what)
}
