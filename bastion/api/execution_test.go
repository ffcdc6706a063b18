package api_test

import (
	"slices"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
)

func intPtr(v int) *int { return &v }

// TestSummary: the text content of every tool result says what happened, why, what to do
// next and then the output, for each family of states.
func TestSummary(t *testing.T) {
	tests := []struct {
		name string
		x    api.Execution
		want string
	}{
		{
			name: "completed with its exit code and stdout",
			x: api.Execution{ExecutionID: "ex_1", Host: "h1", State: "completed", ExitCode: intPtr(0),
				Stdout: "hello\n", StdoutBytes: 6, Next: "Done: the result is delivered."},
			want: "ex_1 on h1: completed (exit 0).\nNext: Done: the result is delivered.\n--- stdout (from byte 0 of 6) ---\nhello\n",
		},
		{
			name: "a non-zero exit with stderr only",
			x: api.Execution{ExecutionID: "ex_2", Host: "h1", State: "completed", ExitCode: intPtr(2), IsError: true,
				Stderr: "no such file\n", StderrBytes: 13, Next: "Fix the command."},
			want: "ex_2 on h1: completed (exit 2).\nNext: Fix the command.\n--- stderr (from byte 0 of 13) ---\nno such file\n",
		},
		{
			name: "killed by a signal, with its cause",
			x: api.Execution{ExecutionID: "ex_3", Host: "h2", State: "failed", Signal: "SIGKILL",
				Cause: "the host killed the command (out of memory)", Next: "Do not retry blindly."},
			want: "ex_3 on h2: failed (SIGKILL).\nCause: the host killed the command (out of memory)\nNext: Do not retry blindly.",
		},
		{
			name: "an HTTP response, truncated",
			x: api.Execution{ExecutionID: "ex_4", Host: "billing", State: "completed", HTTPStatus: 503, IsError: true,
				ResponseBody: `{"error":"busy"`, ResponseBytes: 9000, ResponseTruncated: true, Next: "Retry later."},
			want: "ex_4 on billing: completed (HTTP 503).\nNext: Retry later.\n--- response body, truncated from 9000 bytes ---\n{\"error\":\"busy\"",
		},
		{
			name: "an HTTP response, whole",
			x: api.Execution{ExecutionID: "ex_5", Host: "billing", State: "completed", HTTPStatus: 200,
				ResponseBody: `{}`, ResponseBytes: 2, Next: "Done."},
			want: "ex_5 on billing: completed (HTTP 200).\nNext: Done.\n--- response body ---\n{}",
		},
		{
			name: "an unknown outcome that needs review",
			x: api.Execution{ExecutionID: "ex_6", Host: "h3", State: "unknown", ReviewRequired: true,
				Cause: "the connection broke and the host keeps no markers", Next: "An operator must review it."},
			want: "ex_6 on h3: unknown [review required].\nCause: the connection broke and the host keeps no markers\nNext: An operator must review it.",
		},
		{
			name: "a replay of a running execution",
			x:    api.Execution{ExecutionID: "ex_7", Host: "h1", State: "running", Replayed: true, Next: "Follow it."},
			want: "ex_7 on h1: running [replayed: no new dispatch].\nNext: Follow it.",
		},
		{
			name: "a new attempt after one that failed without effect",
			x:    api.Execution{ExecutionID: "ex_9", Host: "h1", State: "running", PreviousAttempt: "ex_8", Next: "Follow it."},
			want: "ex_9 on h1: running. New attempt after ex_8, which failed without effect.\nNext: Follow it.",
		},
		{
			name: "output windows past the start of each stream",
			x: api.Execution{ExecutionID: "ex_10", Host: "h1", State: "running", Next: "Read on.",
				Stdout: "b", StdoutOffset: 100, StdoutBytes: 250, Stderr: "e", StderrOffset: 5, StderrBytes: 10},
			want: "ex_10 on h1: running.\nNext: Read on.\n--- stdout (from byte 100 of 250) ---\nb\n--- stderr (from byte 5 of 10) ---\ne",
		},
		{
			name: "every mark, in order",
			x: api.Execution{ExecutionID: "ex_11", Host: "h1", State: "unknown", ExitCode: intPtr(1), Signal: "SIGTERM",
				HTTPStatus: 500, ReviewRequired: true, Replayed: true, PreviousAttempt: "ex_0", Cause: "c", Next: "n"},
			want: "ex_11 on h1: unknown (exit 1) (SIGTERM) (HTTP 500) [review required] [replayed: no new dispatch]. New attempt after ex_0, which failed without effect.\nCause: c\nNext: n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.x.Summary(); got != tt.want {
				t.Errorf("Summary() = %q; want %q", got, tt.want)
			}
		})
	}
}

// TestCallFailed: a call that started or joined an execution failed when the execution
// failed, was refused, did not take effect or cannot be proven; never while it is under way.
func TestCallFailed(t *testing.T) {
	tests := []struct {
		name string
		x    api.Execution
		want bool
	}{
		{"completed with exit 0", api.Execution{State: "completed", ExitCode: intPtr(0)}, false},
		{"completed with a non-zero exit", api.Execution{State: "completed", ExitCode: intPtr(1), IsError: true}, true},
		{"completed with an HTTP error status", api.Execution{State: "completed", HTTPStatus: 500, IsError: true}, true},
		{"failed", api.Execution{State: "failed"}, true},
		{"rejected", api.Execution{State: "rejected"}, true},
		{"unknown", api.Execution{State: "unknown"}, true},
		{"timed out", api.Execution{State: "timed_out"}, true},
		{"cancelled", api.Execution{State: "cancelled"}, true},
		{"accepted", api.Execution{State: "accepted"}, false},
		{"authorized", api.Execution{State: "authorized"}, false},
		{"awaiting approval", api.Execution{State: "awaiting_approval"}, false},
		{"dispatched", api.Execution{State: "dispatched"}, false},
		{"running", api.Execution{State: "running"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.x.CallFailed(); got != tt.want {
				t.Errorf("CallFailed() = %v; want %v", got, tt.want)
			}
		})
	}
}

// TestApprovalRequestMessage: the user is told who asks, where, what, under which class,
// and that an operator can decide too.
func TestApprovalRequestMessage(t *testing.T) {
	r := &api.ApprovalRequest{ExecutionID: "ex_1", Actor: "local:alice", Host: "db1", Class: "irreversible",
		What: "rm -rf /srv/old", Expires: time.Date(2026, 7, 28, 10, 0, 0, 0, time.UTC)}
	want := "Postern: local:alice asks to run on db1 (class irreversible):\n\nrm -rf /srv/old\n\n" +
		"Policy requires an approval before it runs (execution ex_1). Approve or deny; an operator can also decide with `postern approve`."
	if got := r.Message(); got != want {
		t.Errorf("Message() = %q; want %q", got, want)
	}
}

// TestCompactEvidence: by default an agent reads the policy's decision as one line with its
// class, not the ladder's steps; what was journaled after the decision follows unchanged.
func TestCompactEvidence(t *testing.T) {
	steps := []string{"actor resolved: agent", "actor agent: tool ssh_exec allowed", "class: read_only (rules[0] \"reads\")", "deny rules: none matched", "authorized"}
	full := append(append([]string(nil), steps...), api.DecisionEvidence("authorized", `rules[0] "reads"`), "host marker: exited 0")
	got := api.CompactEvidence(full, "read_only")
	want := []string{`policy: authorized (rules[0] "reads"), class read_only`, "host marker: exited 0"}
	if !slices.Equal(got, want) {
		t.Errorf("CompactEvidence = %q; want %q", got, want)
	}
	if rule, ok := api.RuleOf(full[len(steps)]); !ok || rule != `rules[0] "reads"` {
		t.Errorf("RuleOf = %q, %v; want the deciding rule", rule, ok)
	}
	noDecision := []string{"host marker: exited 0"}
	if got := api.CompactEvidence(noDecision, "x"); !slices.Equal(got, noDecision) {
		t.Errorf("CompactEvidence without a decision = %q; want it unchanged", got)
	}
	if got := api.CompactEvidence(full, ""); got[0] != `policy: authorized (rules[0] "reads")` {
		t.Errorf("CompactEvidence without a class = %q", got)
	}
}

// TestReadOn: execution_output's last line says whether more output is there, still
// arriving, unknown or over, with the byte offsets to read on from.
func TestReadOn(t *testing.T) {
	tests := []struct {
		name string
		x    api.Execution
		want string
	}{
		{"more stored", api.Execution{ExecutionID: "ex_1", State: "completed", Stdout: "abc", StdoutOffset: 10, StdoutBytes: 20, StderrBytes: 0},
			`More output is there (stdout 20 bytes, stderr 0 bytes in all): read on with execution_output {"execution_id": "ex_1", "stdout_offset": 13, "stderr_offset": 0}.`},
		{"more stderr", api.Execution{ExecutionID: "ex_1", State: "running", Stdout: "abc", StdoutBytes: 3, Stderr: "e", StderrBytes: 5},
			`More output is there (stdout 3 bytes, stderr 5 bytes in all): read on with execution_output {"execution_id": "ex_1", "stdout_offset": 3, "stderr_offset": 1}.`},
		{"arriving", api.Execution{ExecutionID: "ex_1", State: "running", Stdout: "abc", StdoutBytes: 3},
			`Output is still arriving: the execution is running, and this is all of its output so far (stdout 3 bytes, stderr 0 bytes). Read on with execution_output {"execution_id": "ex_1", "stdout_offset": 3, "stderr_offset": 0}; it waits for new output or the end.`},
		{"unknown", api.Execution{ExecutionID: "ex_1", State: "unknown", StdoutBytes: 0},
			`Whether more output comes is not known: the outcome is unknown, and this is all of the output Postern has (stdout 0 bytes, stderr 0 bytes). Read on with execution_output {"execution_id": "ex_1", "stdout_offset": 0, "stderr_offset": 0}.`},
		{"not started", api.Execution{ExecutionID: "ex_1", State: "awaiting_approval"},
			`No output yet: the execution is awaiting_approval and has not started. Read on with execution_output {"execution_id": "ex_1", "stdout_offset": 0, "stderr_offset": 0} once it runs.`},
		{"the end", api.Execution{ExecutionID: "ex_1", State: "completed", Stdout: "abc", StdoutBytes: 3, Stderr: "e", StderrBytes: 1},
			`End of output: the execution is completed, and this is all of it (stdout 3 bytes, stderr 1 bytes).`},
	}
	for _, tt := range tests {
		if got := tt.x.ReadOn(); got != tt.want {
			t.Errorf("%s: ReadOn = %q;\n want %q", tt.name, got, tt.want)
		}
	}
}
