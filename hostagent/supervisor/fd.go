package supervisor

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInheritedOnExec marks every file descriptor above stderr close-on-exec, so that
// nothing this process inherited (a file the shell that started the hostagent had open, a
// descriptor a service manager left) reaches the commands it starts: they get stdin, stdout
// and stderr only, plus what os/exec passes explicitly. The Go runtime opens its own
// descriptors close-on-exec, so marking them again changes nothing; descriptors are not
// closed, so nothing in this process that uses one breaks.
//
// It uses close_range(CLOSE_RANGE_CLOEXEC) (Linux 5.11) and falls back to the list in
// /proc/self/fd on older kernels.
func CloseInheritedOnExec() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
		err = closeOnExecFromProc()
	}
	if err != nil {
		return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	return nil
}

// closeOnExecFromProc marks the descriptors listed in /proc/self/fd, above stderr,
// close-on-exec. The directory's own descriptor is in the list; marking it is harmless.
func closeOnExecFromProc() error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd <= 2 {
			continue
		}
		// A descriptor closed since the listing (the runtime's, or the list's own) is fine.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}
