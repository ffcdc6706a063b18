package hostagent

import (
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// WireMarker is the stored marker rec as the host protocol carries it: the one place where a
// store record becomes a hostproto.Marker, so a change to the store is not a protocol change.
func WireMarker(rec *markers.Record) *hostproto.Marker {
	m := &hostproto.Marker{
		ID: rec.ID, State: hostproto.MarkerState(rec.State),
		Actor: rec.Actor, Fingerprint: rec.Fingerprint, OperationKey: rec.OperationKey,
		Account: rec.Account, Command: append([]string(nil), rec.Command...), Cwd: rec.Cwd,
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt,
		Signal: rec.Signal, IsError: rec.IsError,
		Output: hostproto.Output{
			StdoutBytes: rec.Output.StdoutBytes, StderrBytes: rec.Output.StderrBytes,
			StdoutSHA256: rec.Output.StdoutSHA256, StderrSHA256: rec.Output.StderrSHA256,
			Truncated: rec.Output.Truncated,
		},
		Evidence: append([]string(nil), rec.Evidence...), StartError: rec.StartError,
		PID: rec.PID, PIDStart: rec.PIDStart, SpoolDir: rec.SpoolDir, BootID: rec.BootID,
		Validated: rec.Validated,
	}
	if rec.StateTimes != nil {
		m.StateTimes = make(map[hostproto.MarkerState]time.Time, len(rec.StateTimes))
		for s, at := range rec.StateTimes {
			m.StateTimes[hostproto.MarkerState(s)] = at
		}
	}
	if rec.ExitCode != nil {
		code := *rec.ExitCode
		m.ExitCode = &code
	}
	for _, cp := range rec.Checkpoints {
		m.Checkpoints = append(m.Checkpoints, hostproto.Checkpoint{At: cp.At, Note: cp.Note})
	}
	return m
}

// WireMarkers is WireMarker of each of recs.
func WireMarkers(recs []*markers.Record) []*hostproto.Marker {
	out := make([]*hostproto.Marker, len(recs))
	for i, r := range recs {
		out[i] = WireMarker(r)
	}
	return out
}
