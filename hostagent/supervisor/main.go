package supervisor

import (
	"log/slog"
	"os"
)

// readyFD is where the supervisor finds the readiness pipe its starter passes as
// ExtraFiles[0].
const readyFD = 3

// Subcommand is the argument a binary is started with to serve as the supervisor: `exe
// supervise`, exe being postern-supervisor next to the agent (or the agent itself).
const Subcommand = "supervise"

// legacySubcommand is the previous release's name for Subcommand, which its hostagent still
// uses while its package is upgraded (`postern-shim shim`, `postern-hostagent shim`).
//
// Deprecated: remove together with the per-command mode (percommand.go).
const legacySubcommand = "shim"

// Invoked reports whether args (a process's os.Args) start it as the supervisor. Every
// binary that may be started so (postern-supervisor and postern-shim, postern-hostagent, and
// postern for `postern up`) asks this first thing in main, and then runs Main.
func Invoked(args []string) bool {
	return len(args) > 1 && (args[1] == Subcommand || args[1] == legacySubcommand)
}

// EnvSpoolDir carries the spool directory from a hostagent of the previous release to a
// per-command supervisor. Not an argument: a process's arguments are visible to every local
// user (ps, /proc/PID/cmdline), its environment only to its own user and root, and the
// directory is named after the execution id.
const EnvSpoolDir = "POSTERN_SHIM_SPOOL_DIR"

// Main serves as the supervisor (see Invoked); args are the arguments after the subcommand.
// With $POSTERN_SUPERVISOR_DIR set it is the long-lived per-host supervisor the hostagent
// hands its commands to (daemon.go). Otherwise it is the deprecated per-command mode
// (percommand.go): it supervises the one execution described by spec.json in the spool
// directory named by $POSTERN_SHIM_SPOOL_DIR (or, from an even older hostagent, by the one
// argument) — how a hostagent of the previous release, still running while its package is
// upgraded, starts each command. It returns the process exit code (0 once a status record is
// written, 1 if the supervisor failed, 2 on misuse).
func Main(args []string) int {
	if dir := os.Getenv(EnvSupervisorDir); dir != "" && len(args) == 0 {
		// Warnings only: the supervisor's log lives as long as the host's data dir.
		return startDaemon(dir, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}
	return mainPerCommand(args)
}
