package hostproto

import (
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// MarkerState is the lifecycle state of a host marker, as it travels.
type MarkerState string

// Marker states (the hostagent's marker lifecycle): started → running → exited | timed_out |
// cancelled | interrupted; started → not_started | start_failed; not_started → started.
const (
	// MarkerStarted: the marker is written and nothing runs yet.
	MarkerStarted MarkerState = "started"
	// MarkerRunning: the supervisor started the process (pid and start time recorded).
	MarkerRunning MarkerState = "running"
	// MarkerExited: the process ended and its exit code or signal was observed.
	MarkerExited MarkerState = "exited"
	// MarkerTimedOut: the process outlived its timeout and was terminated.
	MarkerTimedOut MarkerState = "timed_out"
	// MarkerCancelled: the process was cancelled and terminated.
	MarkerCancelled MarkerState = "cancelled"
	// MarkerInterrupted: the process vanished with no exit record, or may have started before
	// a machine crash: an unknown outcome, never run again.
	MarkerInterrupted MarkerState = "interrupted"
	// MarkerNotStarted: the command provably never ran; the same execution id may start it.
	MarkerNotStarted MarkerState = "not_started"
	// MarkerStartFailed: the command could not be started and provably did not run
	// (Marker.StartError says why); final.
	MarkerStartFailed MarkerState = "start_failed"
)

// MarkerStates lists every marker state, in lifecycle order.
func MarkerStates() []MarkerState {
	return []MarkerState{MarkerStarted, MarkerRunning, MarkerExited, MarkerInterrupted, MarkerNotStarted,
		MarkerStartFailed, MarkerCancelled, MarkerTimedOut}
}

// Known reports whether s is a marker state.
func (s MarkerState) Known() bool {
	for _, k := range MarkerStates() {
		if s == k {
			return true
		}
	}
	return false
}

// Live reports whether a marker in s may still have a command starting or running.
func (s MarkerState) Live() bool { return s == MarkerStarted || s == MarkerRunning }

// Ended reports whether a marker in s is final: its execution is over on the host and will
// not start again (not_started is not: the same id may still start it).
func (s MarkerState) Ended() bool { return s.Known() && !s.Live() && s != MarkerNotStarted }

// Marker is a host's marker for one execution, as the hostagent sends it (MarkerMessage, the
// control replies). Its JSON field names are those the previous release sent, which were its
// store's: a marker of either release decodes as the other's (see "Compatibility").
type Marker struct {
	ID    string      `json:"id"`
	State MarkerState `json:"state"`
	// Actor is the identity the execution belongs to, as the hostagent names it (account and
	// key fingerprint, or certificate key id).
	Actor string `json:"actor,omitempty"`
	// Fingerprint is the intent fingerprint the bastion gave (POSTERN_FINGERPRINT).
	Fingerprint  string `json:"fingerprint,omitempty"`
	OperationKey string `json:"operation_key,omitempty"`

	Account string `json:"account,omitempty"`
	// Command is the argv the host runs: [shell, "-c", line].
	Command []string `json:"command,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`

	CreatedAt  time.Time                 `json:"created_at"`
	UpdatedAt  time.Time                 `json:"updated_at"`
	StateTimes map[MarkerState]time.Time `json:"state_times,omitempty"`

	// Outcome: ExitCode or Signal once the process ended.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	IsError  bool   `json:"is_error,omitempty"`
	Output   Output `json:"output,omitzero"`
	// Evidence are human-readable notes on how the state is known.
	Evidence []string `json:"evidence,omitempty"`
	// StartError says why the command provably did not start (start_failed).
	StartError string `json:"start_error,omitempty"`

	// The process, and where its output is spooled.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	SpoolDir string `json:"spool_dir,omitempty"`
	// BootID is the host boot the marker was created in.
	BootID      string       `json:"boot_id,omitempty"`
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
	Validated   bool         `json:"validated,omitempty"`
}

// Output describes the captured stdout and stderr of an execution.
type Output struct {
	StdoutBytes  int64  `json:"stdout_bytes,omitempty"`
	StderrBytes  int64  `json:"stderr_bytes,omitempty"`
	StdoutSHA256 string `json:"stdout_sha256,omitempty"`
	StderrSHA256 string `json:"stderr_sha256,omitempty"`
	Truncated    bool   `json:"truncated,omitempty"`
}

// Checkpoint is a progress point an executing command reported about itself.
type Checkpoint struct {
	At   time.Time `json:"at"`
	Note string    `json:"note"`
}

// ValidExecutionID reports whether id is an execution id as the protocol carries it: "ex_" +
// a canonical ULID (26 upper-case Crockford base32 characters), the only spelling, so one
// execution cannot be named two ways.
func ValidExecutionID(id string) bool {
	text, ok := strings.CutPrefix(id, "ex_")
	if !ok || len(text) != ulid.EncodedSize {
		return false
	}
	u, err := ulid.ParseStrict(text)
	return err == nil && u.String() == text
}
