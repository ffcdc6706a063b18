package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/internal/procfs"
)

// Files in a spool directory. Their names are an on-disk contract with the previous release,
// which reads (and, in the per-command mode, writes) the same directories during an upgrade:
// the supervisor record's file is still called shim.json.
const (
	// SpecFile holds the Spec as JSON, for a per-command supervisor.
	SpecFile = "spec.json"
	// SupervisorFile is the supervisor record (its pid and start time, and the long-lived
	// supervisor's socket), created by the supervisor before it starts the command.
	SupervisorFile = "shim.json"
	// ProcessFile records the command's pid + start time once it runs (per-command supervisors
	// only: the long-lived supervisor tells it to whoever asks).
	ProcessFile = "process.json"
	// StdoutFile and StderrFile hold the spooled streams, up to the output cap each.
	StdoutFile = "stdout"
	StderrFile = "stderr"
	// StatusFile is the final Status, written atomically when the command has ended.
	StatusFile = "status.json"
	// CancelFile asks for the execution to be cancelled: the hostagent creates it before it
	// asks the supervisor, and a keeper that took the execution over looks for it
	// (keeper.go), so a cancel reaches the command whichever of them supervises it.
	CancelFile = "cancel"
	// KeptFile says a keeper took the execution over from its dead supervisor and will
	// write the status file (keeper.go); it holds the command's process record.
	KeptFile = "kept"
	// LogFile receives a per-command supervisor's own diagnostics (never command output).
	LogFile = "shim.log"
)

// Stream names accepted by Follow.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// maxRecordBytes bounds every JSON record read back from a spool directory.
const maxRecordBytes = 1 << 20

// Follow polling bounds: fast while output flows, backing off while idle.
const (
	followMinPoll = 10 * time.Millisecond
	followMaxPoll = 250 * time.Millisecond
)

// supervisorRecord identifies the supervisor process of a spool directory.
type supervisorRecord struct {
	PID   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// Socket is set by the long-lived supervisor (daemon.go): it supervises many executions
	// and answers for them there. Empty for a per-command supervisor, whose process is the answer.
	Socket string `json:"socket,omitempty"`
	// Keeper and KeeperStart name the supervisor's keeper (keeper.go), which finishes the
	// executions of a supervisor that died; zero for a supervisor without one (the previous
	// release's, a per-command one).
	Keeper      int    `json:"keeper,omitempty"`
	KeeperStart uint64 `json:"keeper_start,omitempty"`
	// Fenced marks a record written by Fence instead of a supervisor: no supervisor ran
	// here, and none ever will.
	Fenced bool `json:"fenced,omitempty"`
}

// processRecord identifies the command's process; it is also the supervisor's readiness
// message to Start (with Error set instead when the command could not start).
type processRecord struct {
	PID       int       `json:"pid,omitempty"`
	Start     uint64    `json:"start,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	Error     string    `json:"error,omitempty"`
}

func parseSupervisorRecord(data []byte) (supervisorRecord, error) {
	var r supervisorRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return supervisorRecord{}, fmt.Errorf("supervisor: parse supervisor record: %w", err)
	}
	if r.Fenced && (r.PID != 0 || r.Start != 0) || !r.Fenced && (r.PID <= 0 || r.Start == 0) {
		return supervisorRecord{}, fmt.Errorf("supervisor: parse supervisor record: pid %d start %d fenced %v is inconsistent", r.PID, r.Start, r.Fenced)
	}
	return r, nil
}

func parseProcessRecord(data []byte) (processRecord, error) {
	var r processRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return processRecord{}, fmt.Errorf("supervisor: parse process record: %w", err)
	}
	if r.Error == "" && (r.PID <= 0 || r.Start == 0) {
		return processRecord{}, fmt.Errorf("supervisor: parse process record: pid %d start %d out of range", r.PID, r.Start)
	}
	return r, nil
}

func parseStatus(data []byte) (Status, error) {
	var s Status
	if err := json.Unmarshal(data, &s); err != nil {
		return Status{}, fmt.Errorf("supervisor: parse status: %w", err)
	}
	switch s.Outcome {
	case OutcomeExited, OutcomeTimedOut, OutcomeCancelled, OutcomeStartFailed:
	default:
		return Status{}, fmt.Errorf("supervisor: parse status: unknown outcome %q", s.Outcome)
	}
	for name, st := range map[string]StreamInfo{StreamStdout: s.Stdout, StreamStderr: s.Stderr} {
		if st.Bytes < 0 || st.Stored < 0 || st.Stored > st.Bytes || st.Truncated != (st.Stored < st.Bytes) {
			return Status{}, fmt.Errorf("supervisor: parse status: inconsistent %s sizes %d/%d", name, st.Stored, st.Bytes)
		}
	}
	return s, nil
}

func parseSpec(data []byte) (Spec, error) {
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return Spec{}, fmt.Errorf("supervisor: parse spec: %w", err)
	}
	s = s.withDefaults()
	if err := s.validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// readRecord reads a JSON record of at most maxRecordBytes.
func readRecord(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRecordBytes+1))
	if err != nil {
		return nil, fmt.Errorf("supervisor: read %s: %w", path, err)
	}
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("supervisor: read %s: larger than %d bytes", path, maxRecordBytes)
	}
	return data, nil
}

// ReadStatus returns the final status of the execution in dir, or ErrNoStatus if it has not
// finished (or never ran).
func ReadStatus(dir string) (Status, error) {
	data, err := readRecord(filepath.Join(dir, StatusFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Status{}, ErrNoStatus
	}
	if err != nil {
		return Status{}, err
	}
	return parseStatus(data)
}

func readSupervisorRecord(dir string) (supervisorRecord, error) {
	data, err := readRecord(filepath.Join(dir, SupervisorFile))
	if errors.Is(err, fs.ErrNotExist) {
		return supervisorRecord{}, ErrNeverStarted
	}
	if err != nil {
		return supervisorRecord{}, err
	}
	rec, err := parseSupervisorRecord(data)
	if err == nil && rec.Fenced {
		return supervisorRecord{}, ErrNeverStarted
	}
	return rec, err
}

// Fence makes "never started" final for dir: it takes the supervisor record's place with a
// fenced record, so a supervisor still on its way (its parent died while starting it) can
// no longer create its record and will not run the command. It returns nil if dir is
// fenced now (the command never ran and never will), or ErrAlreadyUsed if a supervisor
// recorded itself first (adopt it instead). Without a fence, "no supervisor record" only means
// "not yet".
func Fence(dir string) error {
	data, err := json.Marshal(supervisorRecord{Fenced: true})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("supervisor: fence %s: %w", dir, err)
	}
	err = createFileExclusive(dir, SupervisorFile, data)
	if !errors.Is(err, ErrAlreadyUsed) {
		return err
	}
	if _, rerr := readSupervisorRecord(dir); errors.Is(rerr, ErrNeverStarted) {
		return nil // fenced already
	}
	return err
}

// readProcessRecord returns the command's process record, or the zero record if the command
// has not started (or never will).
func readProcessRecord(dir string) (processRecord, error) {
	data, err := readRecord(filepath.Join(dir, ProcessFile))
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(data) == 0 {
		return processRecord{}, nil // not written (yet)
	}
	if err != nil {
		return processRecord{}, err
	}
	return parseProcessRecord(data)
}

// writeFileAtomic replaces dir/name with data so that readers see either the old file or the
// complete new one, and the new one survives a crash once this returns.
func writeFileAtomic(dir, name string, data []byte) error {
	if err := durable.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	return nil
}

// writeFileVolatile replaces dir/name with data atomically but without syncing: for records
// that only this boot's processes read (a machine crash kills the supervisor with them).
func writeFileVolatile(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("supervisor: create temporary %s: %w", name, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("supervisor: write %s: %w", name, err)
	}
	return nil
}

// createFileVolatile creates dir/name with data, without syncing, or fails with
// ErrAlreadyUsed if it exists.
func createFileVolatile(dir, name string, data []byte) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %s exists in %s", ErrAlreadyUsed, name, dir)
	}
	if err != nil {
		return fmt.Errorf("supervisor: create %s: %w", name, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("supervisor: write %s: %w", name, err)
	}
	return nil
}

// createFileExclusive is writeFileAtomic that fails with ErrAlreadyUsed if dir/name exists.
func createFileExclusive(dir, name string, data []byte) error {
	err := durable.CreateFile(filepath.Join(dir, name), data, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %s exists in %s", ErrAlreadyUsed, name, dir)
	}
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	return nil
}

func streamFile(stream string) (string, error) {
	switch stream {
	case StreamStdout:
		return StdoutFile, nil
	case StreamStderr:
		return StderrFile, nil
	}
	return "", fmt.Errorf("supervisor: unknown stream %q", stream)
}

// Follow copies the spooled stream ("stdout" or "stderr") of the execution in dir to w,
// starting at offset, and keeps following it until the execution has finished and everything
// stored is copied. It returns the offset after the last byte copied, so a caller can resume
// from there. It returns ErrVanished if the supervisor died without a status record, and
// ErrNeverStarted for a directory without a supervisor record. Only stored bytes are copied: a
// truncated stream ends at the output cap.
//
// Follow polls while the execution runs. A caller that learns of the end another way (its
// supervisor's answer) closes ended: Follow then looks once more at once, and returns
// ErrVanished if there is still no status. nil means no such signal: Follow then checks at
// each idle poll that the supervisor still lives.
func Follow(ctx context.Context, dir, stream string, offset int64, w io.Writer, ended <-chan struct{}) (int64, error) {
	name, err := streamFile(stream)
	if err != nil {
		return offset, err
	}
	if offset < 0 {
		return offset, fmt.Errorf("supervisor: follow %s: negative offset %d", stream, offset)
	}
	path := filepath.Join(dir, name)
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	delay := followMinPoll
	// A caller that will close ended tells of the end itself; until it does, asking whether
	// the supervisor lives (a record read and a /proc read per poll) adds nothing — the
	// long-lived supervisor outlives every execution anyway.
	askAlive, endedSeen := ended == nil, false
	for {
		// The status file is written only after the spool files are complete, so once it
		// exists, one more copy to EOF gets everything.
		_, statErr := os.Stat(filepath.Join(dir, StatusFile))
		finished := statErr == nil
		if f == nil {
			f, err = os.Open(path)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return offset, fmt.Errorf("supervisor: follow %s: %w", stream, err)
			}
			if err != nil {
				f = nil
			}
		}
		var copied int64
		if f != nil {
			copied, err = io.Copy(w, io.NewSectionReader(f, offset, math.MaxInt64-offset))
			offset += copied
			if err != nil {
				return offset, fmt.Errorf("supervisor: follow %s: %w", stream, err)
			}
		}
		if finished {
			return offset, nil
		}
		if endedSeen {
			// The caller saw the execution end, and it left no status: its supervisor
			// vanished (or could not record it). What was stored is all there is.
			return offset, ErrVanished
		}
		if copied > 0 {
			delay = followMinPoll
		} else {
			if askAlive {
				if err := checkSupervisorAlive(dir); err != nil {
					return offset, err
				}
			}
			delay = min(2*delay, followMaxPoll)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return offset, fmt.Errorf("supervisor: follow %s: %w", stream, context.Cause(ctx))
		case <-ended:
			t.Stop()
			ended = nil // one more look, the last
			endedSeen = true
		case <-t.C:
		}
	}
}

// checkSupervisorAlive returns nil if the supervisor of dir is running or has finished with a
// status record, ErrVanished if it is gone without one, and ErrNeverStarted if it never ran.
func checkSupervisorAlive(dir string) error {
	rec, err := readSupervisorRecord(dir)
	if err != nil {
		return err
	}
	if procfs.Running(rec.PID, rec.Start) {
		return nil
	}
	if rec.Keeper > 0 && procfs.Running(rec.Keeper, rec.KeeperStart) {
		// Its keeper may have taken the execution over: it lives as long as it has work.
		if _, err := os.Stat(filepath.Join(dir, KeptFile)); err == nil {
			return nil
		}
	}
	// It may have written its status just before exiting.
	if _, err := ReadStatus(dir); errors.Is(err, ErrNoStatus) {
		return ErrVanished
	} else if err != nil {
		return err
	}
	return nil
}
