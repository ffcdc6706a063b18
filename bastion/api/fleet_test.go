package api

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestLimitJSON: max_concurrency and max_errors come as a whole number or as text.
func TestLimitJSON(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{`5`, "5", ""},
		{`"25%"`, "25%", ""},
		{`"0"`, "0", ""},
		{`2.5`, "", "whole count"},
		{`true`, "", "a count"},
		{`null`, "", ""},
	} {
		var l Limit
		err := json.Unmarshal([]byte(tc.in), &l)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: %q, %v; want an error saying %q", tc.in, l, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || string(l) != tc.want):
			t.Errorf("%s: %q, %v; want %q", tc.in, l, err, tc.want)
		}
	}
}

func FuzzLimitJSON(f *testing.F) {
	for _, s := range []string{`5`, `"25%"`, `1e3`, `-0`, `"x"`, `[]`, `99999999999999999999`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var l Limit
		_ = json.Unmarshal(b, &l) // never panics; what it makes, rollout.ParseLimit checks
	})
}

// TestFleetSummary: a fleet run's text is its counts, its failed hosts with their cause,
// and what to do next.
func TestFleetSummary(t *testing.T) {
	exit := 3
	x := &Execution{ExecutionID: "fr_1", State: "completed", IsError: true, Next: "Stopped: …", Fleet: &FleetRun{
		Total: 4, MaxConcurrency: "2", MaxErrors: "0", Outcome: "stopped", Failures: 1,
		Counts: map[string]int{"completed": 2, NotStarted: 2},
		Failed: []FleetHost{{Host: "db-2", ExecutionID: "ex_2", State: "completed", ExitCode: &exit, Cause: "stderr: boom"}},
	}}
	want := "fr_1: fleet run on 4 hosts (max_concurrency 2, max_errors 0): completed, stopped.\n" +
		"Hosts: 2 completed, 2 not_started; 1 failed (max_errors tolerates 0).\n" +
		"Failed: db-2 ex_2 completed (exit 3): stderr: boom\n" +
		"Next: Stopped: …"
	if got := x.Summary(); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
}
