// Package agentless is what the bastion sends to a host without the hostagent — a stock
// OpenSSH server — and how it reads the answers: the marker-script wrapper installed as
// ~/.postern/run (run.sh), the command lines that run a command with or without it, the line
// that installs it, and the parser of the one-line answers they print.
//
// Invariants: every value that reaches a remote shell is validated (execution ids) or passed
// as one single-quoted word (Quote), never spliced into shell syntax; a command line never
// exceeds MaxLineBytes (the remote shell gets it as one argument); the wrapper runs only when
// its SHA-256 is the one recorded at enrollment. It holds no connection and imports nothing of
// Postern but markers' execution id check.
package agentless

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/postern-dev/postern/markers"
)

// Script is the marker-script wrapper, installed as ~/.postern/run.
//
//go:embed run.sh
var Script string

// ScriptSHA256 is the hex SHA-256 of Script, recorded in the inventory at enrollment.
func ScriptSHA256() string {
	sum := sha256.Sum256([]byte(Script))
	return hex.EncodeToString(sum[:])
}

// Prefix starts every answer line (protocol 1).
const Prefix = "postern-run:1:"

// MaxLineBytes bounds a command line: sshd runs it as `$SHELL -c LINE`, one argument, and
// Linux caps one argument at 128 KiB (MAX_ARG_STRLEN).
const MaxLineBytes = 120 << 10

// ErrTooLong: the command, quoted for the remote shell, exceeds MaxLineBytes.
var ErrTooLong = errors.New("agentless: command too long for a host without the hostagent")

// ErrBadID: the execution id is not canonical; nothing is sent.
var ErrBadID = errors.New("agentless: invalid execution id")

// Quote returns s as one POSIX sh word: single-quoted, each quote in s closing the quoted
// part, escaped with a backslash, and opening the next. Inside single
// quotes nothing is special ($, `, \, newlines), so the word is s, byte for byte.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Command is one command for a stock sshd.
type Command struct {
	// ID is the execution id (validated again here; it reaches a shell).
	ID string
	// Cwd is the absolute working directory; "" is the account's home.
	Cwd string
	// TimeoutS kills the command after this many seconds (coreutils timeout); 0: none.
	TimeoutS int
	// Line is the command line, run by /bin/sh -c.
	Line string
	// Export are variables the server's AcceptEnv refused: exported at the head of the line.
	Export map[string]string
}

// plainProgram runs a command without a marker (guarantee level none): $1 cwd, $2 timeout,
// $3 the command. It refuses before anything starts, and answers "started" just before the
// command runs, so a lost connection after that answer is an unknown outcome and before it
// one the command may or may not have reached.
const plainProgram = `if [ -n "$1" ]; then cd -- "$1" 2>/dev/null || { printf '%s\n' '` + Prefix + `refused reason=cwd' >&2; exit 255; }; fi
if [ "$2" != 0 ] && ! command -v timeout >/dev/null 2>&1; then printf '%s\n' '` + Prefix + `refused reason=timeout_unsupported' >&2; exit 255; fi
trap '' PIPE; printf '%sstarted id=%s\n' '` + Prefix + `' "$POSTERN_EXECUTION_ID" >&2; trap - PIPE
if [ "$2" != 0 ]; then exec timeout -k 10 "$2" /bin/sh -c "$3" </dev/null; fi
exec /bin/sh -c "$3" </dev/null`

// wrapperProgram checks the wrapper's digest ($1) and runs it with the other arguments.
const wrapperProgram = `f=$HOME/.postern/run
[ -f "$f" ] || { printf '%s\n' '` + Prefix + `refused reason=script_missing' >&2; exit 255; }
case $(sha256sum <"$f" 2>/dev/null) in "$1  -") ;; *) printf '%s\n' '` + Prefix + `refused reason=script_changed' >&2; exit 255 ;; esac
shift
exec /bin/sh "$f" "$@"`

// installProgram writes the wrapper read from stdin to ~/.postern/run atomically (a temporary
// file, checked against the digest $1, synced, renamed, the directory synced) in a 0700
// ~/.postern, and prints the installed file's digest.
const installProgram = `umask 077
d=$HOME/.postern
[ ! -L "$d" ] || { echo "postern: $d is a symbolic link; refusing to install through it" >&2; exit 1; }
mkdir -p "$d/markers" && chmod 700 "$d" "$d/markers" || exit 1
command -v sha256sum >/dev/null 2>&1 || { echo 'postern: the marker script needs sha256sum (coreutils) on the host' >&2; exit 1; }
t=$d/run.tmp.$$
cat >"$t" || { rm -f "$t"; exit 1; }
case $(sha256sum <"$t") in "$1  -") ;; *) rm -f "$t"; echo 'postern: the script arrived incomplete' >&2; exit 1 ;; esac
chmod 700 "$t" && { sync -- "$t" 2>/dev/null || sync; } && mv -f "$t" "$d/run" && { sync -- "$d" 2>/dev/null || sync; } || { rm -f "$t"; exit 1; }
sha256sum <"$d/run"`

// PlainLine is the command line that runs c without a marker.
func PlainLine(c Command) (string, error) {
	if !markers.ValidExecutionID(c.ID) {
		return "", fmt.Errorf("%w: %q", ErrBadID, c.ID)
	}
	return line(c.Export, plainProgram, "postern-run", c.Cwd, strconv.Itoa(c.TimeoutS), c.Line)
}

// WrappedLine is the command line that runs c under the wrapper, once its digest is digest.
func WrappedLine(c Command, digest string) (string, error) {
	if !markers.ValidExecutionID(c.ID) {
		return "", fmt.Errorf("%w: %q", ErrBadID, c.ID)
	}
	return line(c.Export, wrapperProgram, "postern-run", digest, "exec", c.ID, c.Cwd, strconv.Itoa(c.TimeoutS), c.Line)
}

// StatusLine is the command line that prints the wrapper's marker of id on stdout.
func StatusLine(id, digest string) (string, error) {
	if !markers.ValidExecutionID(id) {
		return "", fmt.Errorf("%w: %q", ErrBadID, id)
	}
	return line(nil, wrapperProgram, "postern-run", digest, "status", id)
}

// ListLine is the command line that prints every marker the wrapper keeps, one line each.
func ListLine(digest string) string {
	l, _ := line(nil, wrapperProgram, "postern-run", digest, "list")
	return l
}

// InstallLine is the command line that installs Script, sent on its stdin; it prints
// ScriptSHA256() + "  -" once the file is in place.
func InstallLine() string {
	l, _ := line(nil, installProgram, "postern-install", ScriptSHA256())
	return l
}

// line builds `K='v'; export K; … exec /bin/sh -c 'PROGRAM' 'ARG0' 'ARG'…`, which any POSIX
// login shell runs the same way.
func line(export map[string]string, program string, args ...string) (string, error) {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(export)) {
		if !validName(k) {
			return "", fmt.Errorf("agentless: variable name %q", k)
		}
		fmt.Fprintf(&b, "%s=%s; export %s; ", k, Quote(export[k]), k)
	}
	b.WriteString("exec /bin/sh -c " + Quote(program))
	for _, a := range args {
		b.WriteString(" " + Quote(a))
	}
	if b.Len() > MaxLineBytes {
		return "", fmt.Errorf("%w: %d bytes quoted, at most %d", ErrTooLong, b.Len(), MaxLineBytes)
	}
	return b.String(), nil
}

func validName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
