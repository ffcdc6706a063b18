package engine

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// Markers of hosts without the hostagent, for operators (`postern markers`): a marker
// script's are read with its own status and list commands over the pooled connection and
// shown as host markers; a host at level none keeps none, which is said as such.

// maxScriptListBytes bounds what `~/.postern/run list` may print (about 100 bytes a marker,
// so some 40000 markers: a month of retention at more than one command a minute).
const maxScriptListBytes = 4 << 20

// noMarkersError is the answer for a host at level none.
func noMarkersError(host fleet.Host) error {
	return fmt.Errorf("%w: %s runs no hostagent and no marker script (guarantee level none), so nothing on it records executions and it has no markers to list; what the bastion observed is in the journal: postern executions list --host %s", api.ErrNoMarkers, host.Name, host.Name)
}

// scriptReply is what a marker-script query printed.
type scriptReply struct {
	Stdout, Stderr []byte
	// Exit is the query's exit status (nil: killed by a signal).
	Exit *int
	// Truncated: stdout was longer than the query's bound and is cut.
	Truncated bool
}

// parseScriptList parses the lines of `run list`; lines without the answer prefix (the
// account's shell start-up files may print) are skipped.
func parseScriptList(host string, out []byte) ([]agentless.Answer, error) {
	var list []agentless.Answer
	for line := range bytes.SplitSeq(out, []byte("\n")) {
		if !bytes.HasPrefix(line, []byte(agentless.Prefix)) {
			continue
		}
		a, err := agentless.ParseAnswer(string(line))
		if err == nil && (a.Kind != agentless.Status || a.ID == "") {
			err = fmt.Errorf("%w: %q in a list", agentless.ErrAnswer, a.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("the marker script on %s listed: %w", host, err)
		}
		list = append(list, a)
	}
	return list, nil
}

// scriptMarker is a marker script's marker as a host marker. The script keeps the state and
// the exit code only (no times, no output); its states map onto the host's: claimed is
// started (the id is taken, the command not started yet), the others are the same.
func scriptMarker(host fleet.Host, a agentless.Answer) *hostproto.Marker {
	r := &hostproto.Marker{ID: a.ID, Account: host.Account}
	var note string
	switch a.State {
	case agentless.Claimed:
		r.State = hostproto.MarkerStarted
		note = "claimed: the id is taken and the command has not started"
		if a.Old {
			note = "claimed more than five minutes ago and never started: the wrapper stopped before the command started, so it did not run"
		}
	case agentless.Running:
		r.State = hostproto.MarkerRunning
	case agentless.Interrupted:
		r.State = hostproto.MarkerInterrupted
		note = "interrupted: the command started and its wrapper is gone without an exit record"
	case agentless.Exited:
		r.State, r.ExitCode = hostproto.MarkerExited, a.Exit
	}
	r.Evidence = []string{fmt.Sprintf("read now from the marker script on %s (~/.postern/run), which records the state and the exit code only; it keeps finished markers for %d days", host.Name, a.RetentionDays)}
	if note != "" {
		r.Evidence = append(r.Evidence, note)
	}
	return r
}

// scriptMarkerQuery selects a page of a marker script's markers, newest first.
type scriptMarkerQuery struct {
	State hostproto.MarkerState
	// Cursor is the last id of the previous page: this page starts below it.
	Cursor string
	Limit  int
}

// scriptMarkerPage is the page of list that q selects, and the cursor of the next (""
// when none). Execution ids sort by creation time, so newest first is by id, descending.
func scriptMarkerPage(host fleet.Host, list []agentless.Answer, q scriptMarkerQuery) ([]*hostproto.Marker, string, error) {
	if q.State != "" && !q.State.Known() {
		return nil, "", api.Invalid("state %q is not a marker state", q.State)
	}
	if q.Cursor != "" && !markers.ValidExecutionID(q.Cursor) {
		return nil, "", api.Invalid("cursor %q is not one this list gave", q.Cursor)
	}
	limit := q.Limit
	if limit == 0 {
		limit = 100
	}
	list = slices.SortedFunc(slices.Values(list), func(a, b agentless.Answer) int { return strings.Compare(b.ID, a.ID) })
	page := []*hostproto.Marker{}
	for _, a := range list {
		if q.Cursor != "" && a.ID >= q.Cursor {
			continue
		}
		r := scriptMarker(host, a)
		if q.State != "" && r.State != q.State {
			continue
		}
		if len(page) == limit {
			return page, page[len(page)-1].ID, nil
		}
		page = append(page, r)
	}
	return page, "", nil
}
