package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// Execution ids in creation order: idN sorts after idN-1.
const (
	id1 = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1V1"
	id2 = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1V2"
	id3 = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1V3"
	id4 = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1V4"
)

// scriptList is `run list` output: one line per "ID STATE…" spec (glob order: oldest first).
func scriptList(specs ...string) string {
	var b strings.Builder
	for _, s := range specs {
		id, state, _ := strings.Cut(s, " ")
		fmt.Fprintf(&b, "%sstatus id=%s state=%s retention_days=30\n", agentless.Prefix, id, state)
	}
	return b.String()
}

func TestParseScriptList(t *testing.T) {
	tests := []struct {
		name, out string
		want      []string // ID STATE
		wantErr   bool
	}{
		{name: "no markers", out: "", want: nil},
		{name: "the shell's noise is skipped", out: "welcome\n" + scriptList(id1+" running", id2+" exited exit=3"), want: []string{id1 + " running", id2 + " exited"}},
		{name: "a malformed answer", out: agentless.Prefix + "status id=" + id1 + " state=odd retention_days=30\n", wantErr: true},
		{name: "not a status", out: agentless.Prefix + "refused reason=usage\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list, err := parseScriptList("s1", []byte(tt.out))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v; want error %v", err, tt.wantErr)
			}
			var got []string
			for _, a := range list {
				got = append(got, a.ID+" "+string(a.State))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v; want %v", got, tt.want)
			}
		})
	}
}

// TestScriptMarkerPage: the wrapper's states as host markers, newest first, filtered by
// state and paged by the last id — the answers of `postern markers list` for a host with the
// marker script.
func TestScriptMarkerPage(t *testing.T) {
	host := fleet.Host{Name: "s1", Account: "deploy", Guarantee: fleet.GuaranteeMarkerScript}
	list, err := parseScriptList("s1", []byte(scriptList(id1+" claimed old=1", id2+" exited exit=3", id3+" interrupted", id4+" running")))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		q        scriptMarkerQuery
		want     []string // ID STATE
		wantNext string
		// wantInvalid: refused as an invalid argument.
		wantInvalid bool
	}{
		{name: "all, newest first", want: []string{id4 + " running", id3 + " interrupted", id2 + " exited", id1 + " started"}},
		{name: "a claim is started", q: scriptMarkerQuery{State: hostproto.MarkerStarted}, want: []string{id1 + " started"}},
		{name: "by state", q: scriptMarkerQuery{State: hostproto.MarkerExited}, want: []string{id2 + " exited"}},
		{name: "first page", q: scriptMarkerQuery{Limit: 2}, want: []string{id4 + " running", id3 + " interrupted"}, wantNext: id3},
		{name: "next page", q: scriptMarkerQuery{Limit: 2, Cursor: id3}, want: []string{id2 + " exited", id1 + " started"}},
		{name: "a full last page has no next", q: scriptMarkerQuery{Limit: 4}, want: []string{id4 + " running", id3 + " interrupted", id2 + " exited", id1 + " started"}},
		{name: "limit counts matches only", q: scriptMarkerQuery{Limit: 1, State: hostproto.MarkerInterrupted}, want: []string{id3 + " interrupted"}},
		{name: "a journal state", q: scriptMarkerQuery{State: hostproto.MarkerState(markers.Completed)}, wantInvalid: true},
		{name: "a cursor no list gave", q: scriptMarkerQuery{Cursor: "x"}, wantInvalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, next, err := scriptMarkerPage(host, list, tt.q)
			var te *api.ToolError
			if invalid := errors.As(err, &te) && te.Code == api.CodeInvalidArgument; invalid != tt.wantInvalid || (err != nil && !invalid) {
				t.Fatalf("err = %v; want invalid argument %v", err, tt.wantInvalid)
			}
			var got []string
			for _, r := range page {
				got = append(got, r.ID+" "+string(r.State))
				if r.Account != "deploy" || len(r.Evidence) == 0 {
					t.Errorf("marker %+v; want a host marker as deploy, with evidence", r)
				}
			}
			if !slices.Equal(got, tt.want) || next != tt.wantNext {
				t.Errorf("got %v next %q; want %v next %q", got, next, tt.want, tt.wantNext)
			}
		})
	}
}

func TestScriptMarker(t *testing.T) {
	host := fleet.Host{Name: "s1", Guarantee: fleet.GuaranteeMarkerScript}
	three := 3
	tests := []struct {
		answer   agentless.Answer
		want     hostproto.MarkerState
		exit     *int
		evidence string
	}{
		{answer: agentless.Answer{State: agentless.Claimed}, want: hostproto.MarkerStarted, evidence: "has not started"},
		{answer: agentless.Answer{State: agentless.Claimed, Old: true}, want: hostproto.MarkerStarted, evidence: "did not run"},
		{answer: agentless.Answer{State: agentless.Running}, want: hostproto.MarkerRunning, evidence: "state and the exit code only"},
		{answer: agentless.Answer{State: agentless.Interrupted}, want: hostproto.MarkerInterrupted, evidence: "without an exit record"},
		{answer: agentless.Answer{State: agentless.Exited, Exit: &three, RetentionDays: 30}, want: hostproto.MarkerExited, exit: &three, evidence: "for 30 days"},
	}
	for _, tt := range tests {
		name := string(tt.answer.State)
		if tt.answer.Old {
			name += " old"
		}
		t.Run(name, func(t *testing.T) {
			r := scriptMarker(host, tt.answer)
			if r.State != tt.want || (tt.exit == nil) != (r.ExitCode == nil) || (tt.exit != nil && *r.ExitCode != *tt.exit) {
				t.Errorf("marker %s exit %v; want %s exit %v", r.State, r.ExitCode, tt.want, tt.exit)
			}
			if !strings.Contains(strings.Join(r.Evidence, "\n"), tt.evidence) {
				t.Errorf("evidence %q; want %q", r.Evidence, tt.evidence)
			}
		})
	}
}
