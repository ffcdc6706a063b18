package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// StartError is the error of a command that could not be started: it provably did not run.
// It wraps ErrStartFailed.
type StartError struct {
	// Cause names the real cause in one line, e.g. "cwd /srv/app does not exist".
	Cause string
}

func (e *StartError) Error() string { return "supervisor: command could not be started: " + e.Cause }

// Is makes errors.Is(err, ErrStartFailed) hold.
func (e *StartError) Is(target error) bool { return target == ErrStartFailed }

// startCause names why spec's command could not be started, from the failed start's error and
// the file system as the command's user sees it. The start error alone cannot say: the child
// reports whichever of chdir, setuid and execve failed as "fork/exec <shell>: <errno>", so a
// missing cwd would read as a missing shell. Only a failed start pays for these checks.
func startCause(spec Spec, startErr error) string {
	uid, gids := identity(spec.Credential)
	if spec.Dir != "" {
		if cause := checkPath("cwd", spec.Dir, uid, gids, true); cause != "" {
			return cause
		}
	}
	if cause := checkPath("shell", spec.Shell, uid, gids, false); cause != "" {
		return cause
	}
	var errno syscall.Errno
	if errors.As(startErr, &errno) && errno == syscall.EPERM && spec.Credential != nil {
		return fmt.Sprintf("cannot switch to uid %d (gid %d): %v", spec.Credential.Uid, spec.Credential.Gid, errno)
	}
	if errno != 0 {
		return fmt.Sprintf("could not start %s: %v", spec.Shell, errno)
	}
	return fmt.Sprintf("could not start %s: %v", spec.Shell, startErr)
}

// identity is who the command runs as: the spec's credential, or this process.
func identity(cred *syscall.Credential) (uid uint32, gids []uint32) {
	if cred != nil {
		return cred.Uid, append([]uint32{cred.Gid}, cred.Groups...)
	}
	gids = []uint32{uint32(os.Getegid())}
	if groups, err := os.Getgroups(); err == nil {
		for _, g := range groups {
			gids = append(gids, uint32(g))
		}
	}
	return uint32(os.Geteuid()), gids
}

// checkPath returns why uid cannot use path — as the working directory (dir) or as the
// program to execute — or "" if nothing is visibly wrong. Permission bits are read as the
// kernel would for uid and gids (ACLs and security modules aside: the start error still
// stands when they deny it).
func checkPath(what, path string, uid uint32, gids []uint32, dir bool) string {
	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("%s %s does not exist", what, path)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Sprintf("%s %s does not exist (a parent is not a directory)", what, path)
	case err != nil:
		return fmt.Sprintf("%s %s cannot be examined: %v", what, path, errors.Unwrap(err))
	case dir && !info.IsDir():
		return fmt.Sprintf("%s %s is not a directory", what, path)
	case !dir && !info.Mode().IsRegular():
		return fmt.Sprintf("%s %s is not a regular file", what, path)
	}
	// Every directory on the way needs search permission; the target needs search (a
	// directory) or execute (a program).
	clean := filepath.Clean(path)
	for p := "/"; ; {
		st, err := stat(p)
		if err != nil {
			return fmt.Sprintf("%s %s cannot be examined: %v", what, path, err)
		}
		if !mayExecute(st, uid, gids) {
			if p == clean && !dir {
				return fmt.Sprintf("%s %s is not executable by uid %d", what, path, uid)
			}
			return fmt.Sprintf("%s %s is not accessible to uid %d (no search permission on %s)", what, path, uid, p)
		}
		if p == clean {
			return ""
		}
		next, _, _ := strings.Cut(strings.TrimPrefix(clean, strings.TrimSuffix(p, "/")+"/"), "/")
		p = filepath.Join(p, next)
	}
}

func stat(path string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// mayExecute reports whether uid (in gids) may search the directory or execute the file st.
// Root may search any directory and execute any file with an execute bit.
func mayExecute(st *syscall.Stat_t, uid uint32, gids []uint32) bool {
	const x = 0o1
	mode := st.Mode
	switch {
	case uid == 0:
		return mode&syscall.S_IFMT == syscall.S_IFDIR || mode&0o111 != 0
	case st.Uid == uid:
		return mode&(x<<6) != 0
	case slices.Contains(gids, st.Gid):
		return mode&(x<<3) != 0
	}
	return mode&x != 0
}
