// Package privdir makes a daemon's state directory private to the user the daemon runs as,
// and refuses a directory that another user could read around or tamper with.
//
// # Rules (decided like OpenSSH's StrictModes, plus the sticky exception below)
//
//   - The directory and everything in it must be owned by the daemon's effective user.
//     Anything else is refused: a file another user owns was planted or left by a run as
//     someone else, and the daemon would trust it.
//   - Every ancestor directory (of the path as given and of its resolved real path) must be
//     owned by root or the daemon's user, and must not be writable by group or others —
//     whoever can write a parent can rename the state directory away and put their own in
//     its place. Unlike OpenSSH, a group- or world-writable ancestor is accepted when it has
//     the sticky bit and is owned by root or the daemon's user (/tmp): the sticky bit stops
//     others from renaming or deleting what they do not own.
//   - Modes that are too wide are fixed, not refused, and each fix is logged: directories
//     lose every group/other and setuid/setgid/sticky bit (0755 → 0700), regular files
//     likewise (0644 → 0600). Symlinks, sockets and other special files keep their mode
//     (a symlink has none; a socket inside a 0700 directory is out of others' reach).
//
// Fixing happens top-down and the directory itself is fixed first, so once it is 0700
// nobody else can traverse into it; a directory below it is fixed before it is listed, so
// nothing another user created through a directory handle opened earlier escapes the
// ownership check. Between looking at an entry and changing its mode only the daemon's own
// user can swap it.
package privdir

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// Errors callers and tests branch on.
var (
	// ErrForeignOwner: the directory, or something in it, belongs to another user.
	ErrForeignOwner = errors.New("owned by another user")
	// ErrUnsafeParent: an ancestor directory lets another user replace the directory.
	ErrUnsafeParent = errors.New("inside a directory others can write")
)

// wideBits are the mode bits a private directory or file must not have.
const wideBits = fs.ModePerm&0o077 | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// Ensure creates dir (mode 0700, with any missing parents) if it does not exist, checks it
// and its ancestors against the package rules, and tightens every wider mode inside it. what
// names the directory in errors and logs ("state dir", "data dir"). dir must be absolute.
func Ensure(dir, what string, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%s %q: must be an absolute path", what, dir)
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	euid := uint32(os.Geteuid())
	for _, p := range uniq(dir, real) {
		if err := checkAncestors(p, what, euid); err != nil {
			return err
		}
	}
	return tighten(real, what, euid, logger)
}

// checkAncestors applies parentVerdict to every ancestor of path (following symlinks, so a
// symlinked component is judged by what it points to; its own directory is an ancestor too).
func checkAncestors(path, what string, euid uint32) error {
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		info, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, path, err)
		}
		if err := parentVerdict(p, metaOf(info), euid); err != nil {
			return fmt.Errorf("%s %s: %w", what, path, err)
		}
		if p == "/" {
			return nil
		}
	}
}

// tighten walks root top-down, refusing foreign-owned entries and fixing wide modes.
func tighten(root, what string, euid uint32, logger *slog.Logger) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path != root {
			return nil // removed while we walked (a temporary file renamed into place)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, root, err)
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) && path != root {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, root, err)
		}
		m := metaOf(info)
		if m.uid != euid {
			return fmt.Errorf("%s %s: %w: %s belongs to %s, not to %s (the user this daemon runs as); chown -R %s %s, or run the daemon as %s",
				what, root, ErrForeignOwner, path, userName(m.uid), userName(euid), userName(euid), root, userName(m.uid))
		}
		want, fix := tightened(m.mode)
		if !fix {
			return nil
		}
		// Reading the directory happens after this returns, so it is listed once closed.
		if err := os.Chmod(path, want); err != nil && !(errors.Is(err, fs.ErrNotExist) && path != root) {
			return fmt.Errorf("%s %s: tighten %s: %w", what, root, path, err)
		}
		logger.Warn("tightened permissions that let other users in", "dir", what, "path", path,
			"from", octal(m.mode), "to", octal(want))
		return nil
	})
}

// meta is what the rules look at: owner and mode (as fs.FileMode, type bits included).
type meta struct {
	uid  uint32
	mode fs.FileMode
}

func metaOf(info fs.FileInfo) meta {
	m := meta{uid: ^uint32(0), mode: info.Mode()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		m.uid = st.Uid
	}
	return m
}

// parentVerdict decides whether an ancestor directory p is safe for a directory private to
// euid: owned by root or euid, and not writable by group or others unless sticky.
func parentVerdict(p string, m meta, euid uint32) error {
	if m.uid != 0 && m.uid != euid {
		return fmt.Errorf("%w: %s belongs to %s, who could replace what is inside; chown root %s, or choose a directory elsewhere",
			ErrUnsafeParent, p, userName(m.uid), p)
	}
	if m.mode.Perm()&0o022 != 0 && m.mode&fs.ModeSticky == 0 {
		return fmt.Errorf("%w: %s has mode %s, so group or others can rename what is inside; chmod go-w %s (or chmod +t %s), or choose a directory elsewhere",
			ErrUnsafeParent, p, octal(m.mode), p, p)
	}
	return nil
}

// octal is mode as chmod(1) spells it, special bits included.
func octal(mode fs.FileMode) string {
	m := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return fmt.Sprintf("%04o", m)
}

// tightened returns the mode an entry must have and whether it differs from mode. Only
// directories and regular files are changed.
func tightened(mode fs.FileMode) (fs.FileMode, bool) {
	if !mode.IsDir() && !mode.IsRegular() {
		return mode, false
	}
	if mode&wideBits == 0 {
		return mode, false
	}
	return mode.Perm() &^ 0o077, true
}

func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return "uid " + id
}

func uniq(a, b string) []string {
	if a == b {
		return []string{a}
	}
	return []string{a, b}
}
