// Package supervisor owns the per-host supervisor: the long-lived process, apart from the
// SSH-facing hostagent, that forks and supervises every command (daemon.go) exactly once per
// spool directory; the hostagent's client of it (Client, Handle); and the spool directory's
// on-disk contract. It also still serves, deprecated, the previous release's per-command
// mode (percommand.go), for a hostagent of that release while its package is upgraded.
//
// # Invariants
//
//   - A spool directory runs at most once: Start creates the spec only if absent, and the
//     supervisor creates its supervisor record only if absent before it starts anything.
//   - The supervisor record is written before the command starts, so on this boot a spool
//     directory without one provably never ran its command (ErrNeverStarted). The long-lived
//     supervisor does not sync it (the host marker is what outlives a machine crash, see
//     daemon.go); a per-command supervisor does.
//   - The status file is written atomically after the command's output is fully spooled
//     (non-empty output synced); its presence means the outcome and the spooled output are
//     final.
//   - The supervisor runs in its own session, so losing the SSH channel or the hostagent does
//     not stop it. Its parent, the keeper (keeper.go), holds the read ends of every command's
//     output pipes from before the fork: a supervisor that dies kills no command (no
//     Pdeathsig, no reader gone) and loses no outcome, as the keeper — the commands' new
//     parent, a subreaper — finishes each one and writes its status. A command the keeper
//     cannot hold (it is gone) gets SIGKILL when the supervisor dies (Pdeathsig), as before.
//     Whatever is left in the command's process group when the command ends is terminated,
//     by whichever of them supervises it, so no work outlives its status record
//     unsupervised. Processes that leave the group (setsid, setpgid) are out of reach.
//   - Stored output moves from the pipe into the spool file by splice(2): every byte is in
//     the file or still in the pipe whenever a supervisor dies.
//   - A cancel is a file (CancelFile) before it is a request, so it reaches the command
//     whichever of the supervisor and the keeper supervises it.
//   - Unknowable: the host crashing (spool records are page-cache writes); a supervisor and
//     its keeper both gone (a command then ends without a status: ErrVanished); see
//     docs/design.md, "What is unknowable".
//
// The command runs as `Shell -c Command` with stdin from /dev/null, in its own session and
// process group, with exactly the environment in its Spec and no descriptor but stdin,
// stdout and stderr (CloseInheritedOnExec). This package knows nothing of markers, SSH or
// MCP.
package supervisor

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"
)

// Defaults applied by Spec.withDefaults.
const (
	DefaultShell     = "/bin/sh"
	DefaultKillGrace = 5 * time.Second
	DefaultOutputCap = 64 << 20
)

// Bounds on what a spec may ask for; the spec file is read back by the supervisor, so it is
// bounded like any other input.
const (
	maxCommandBytes = 256 << 10
	maxEnvBytes     = 256 << 10
	maxIDBytes      = 256
)

// Outcomes recorded in Status.Outcome.
const (
	// OutcomeExited: the command ended on its own; ExitCode or Signal says how.
	OutcomeExited = "exited"
	// OutcomeTimedOut: the command outlived Spec.Timeout and was terminated.
	OutcomeTimedOut = "timed_out"
	// OutcomeCancelled: the supervisor was asked to cancel (SIGTERM) and terminated the command.
	OutcomeCancelled = "cancelled"
	// OutcomeStartFailed: the command could not be started; it provably did not run.
	OutcomeStartFailed = "start_failed"
)

// Errors callers branch on.
var (
	// ErrNeverStarted: the spool directory has no supervisor record, so the command provably never ran.
	ErrNeverStarted = errors.New("supervisor: execution never started")
	// ErrVanished: the supervisor started (there is a supervisor record) but is gone without a
	// status file; the outcome is unknown.
	ErrVanished = errors.New("supervisor: supervisor vanished without a status record")
	// ErrNoStatus: the status file does not exist (yet).
	ErrNoStatus = errors.New("supervisor: no status record")
	// ErrStartFailed: the command could not be started and provably did not run; the status
	// file records the reason (or, when Quota.Admit refused it, nothing was created).
	ErrStartFailed = errors.New("supervisor: command could not be started")
	// ErrNotRunning: the execution has already finished (or its supervisor is gone).
	ErrNotRunning = errors.New("supervisor: execution is not running")
	// ErrAlreadyUsed: the spool directory already holds an execution; a directory runs once.
	ErrAlreadyUsed = errors.New("supervisor: spool directory already used")
)

// Spec is what one execution runs. It is stored as JSON in the spool directory.
type Spec struct {
	// ExecutionID is copied into the status record; required.
	ExecutionID string `json:"execution_id"`
	// Command is passed verbatim as the argument of `Shell -c`; required.
	Command string `json:"command"`
	// Shell is an absolute path; default DefaultShell.
	Shell string `json:"shell,omitempty"`
	// Dir is the working directory; empty means the supervisor's (the hostagent's) directory.
	Dir string `json:"dir,omitempty"`
	// Env is the command's complete environment; nil means an empty environment, never the
	// hostagent's own.
	Env []string `json:"env,omitempty"`
	// Credential, when set, runs the command as that uid/gid/groups.
	Credential *syscall.Credential `json:"credential,omitempty"`
	// Timeout after which the command's process group is terminated; zero means none.
	Timeout time.Duration `json:"timeout,omitempty"`
	// KillGrace between SIGTERM and SIGKILL; default DefaultKillGrace.
	KillGrace time.Duration `json:"kill_grace,omitempty"`
	// OutputCap is the most bytes stored per stream; default DefaultOutputCap. Bytes beyond
	// it are still read (so the command never blocks) and hashed, but not stored.
	OutputCap int64 `json:"output_cap,omitempty"`
}

// withDefaults returns s with zero fields set to their defaults.
func (s Spec) withDefaults() Spec {
	if s.Shell == "" {
		s.Shell = DefaultShell
	}
	if s.KillGrace == 0 {
		s.KillGrace = DefaultKillGrace
	}
	if s.OutputCap == 0 {
		s.OutputCap = DefaultOutputCap
	}
	return s
}

// validate reports every problem of a defaulted spec at once.
func (s Spec) validate() error {
	var errs []error
	if s.ExecutionID == "" {
		errs = append(errs, errors.New("execution id is empty"))
	}
	if len(s.ExecutionID) > maxIDBytes {
		errs = append(errs, fmt.Errorf("execution id is longer than %d bytes", maxIDBytes))
	}
	if s.Command == "" {
		errs = append(errs, errors.New("command is empty"))
	}
	if len(s.Command) > maxCommandBytes {
		errs = append(errs, fmt.Errorf("command is longer than %d bytes", maxCommandBytes))
	}
	if !filepath.IsAbs(s.Shell) {
		errs = append(errs, fmt.Errorf("shell %q is not an absolute path", s.Shell))
	}
	envBytes := 0
	for _, kv := range s.Env {
		envBytes += len(kv)
	}
	if envBytes > maxEnvBytes {
		errs = append(errs, fmt.Errorf("environment is larger than %d bytes", maxEnvBytes))
	}
	if s.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout %v is negative", s.Timeout))
	}
	if s.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("kill grace %v is negative", s.KillGrace))
	}
	if s.OutputCap < 0 {
		errs = append(errs, fmt.Errorf("output cap %d is negative", s.OutputCap))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("supervisor: invalid spec: %w", err)
	}
	return nil
}

// StreamInfo describes one spooled output stream.
type StreamInfo struct {
	// Bytes is everything the command wrote to the stream.
	Bytes int64 `json:"bytes"`
	// Stored is how many of those bytes are in the spool file (at most the output cap).
	Stored int64 `json:"stored"`
	// Truncated is set when Stored < Bytes.
	Truncated bool `json:"truncated"`
	// SHA256 is the hex digest of all Bytes, stored or not.
	SHA256 string `json:"sha256"`
}

// Status is the final record of an execution, written once by the supervisor.
type Status struct {
	ExecutionID string `json:"execution_id"`
	// Outcome is one of the Outcome constants.
	Outcome string `json:"outcome"`
	// ExitCode of the command; -1 when it was killed by a signal or never ran.
	ExitCode int `json:"exit_code"`
	// Signal that killed the command, e.g. "SIGKILL"; empty otherwise.
	Signal string `json:"signal,omitempty"`
	// Error explains start_failed, or a supervisor problem that did not prevent the record.
	Error string `json:"error,omitempty"`
	// PID and PIDStart identify the command's process (zero for start_failed).
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// StartedAt is when the command started (zero for start_failed); EndedAt is when it
	// ended or failed to start.
	StartedAt time.Time  `json:"started_at,omitzero"`
	EndedAt   time.Time  `json:"ended_at"`
	Stdout    StreamInfo `json:"stdout"`
	Stderr    StreamInfo `json:"stderr"`
}

// Process identifies the supervisor and the command's process. Start times are
// /proc/<pid>/stat field 22 (clock ticks since boot), which tell a process from a later one
// reusing its pid.
type Process struct {
	SupervisorPID   int       `json:"supervisor_pid"`
	SupervisorStart uint64    `json:"supervisor_start"`
	PID             int       `json:"pid"`
	PIDStart        uint64    `json:"pid_start"`
	StartedAt       time.Time `json:"started_at"`
}
