package tasks

import (
	"encoding/json"
	"testing"
)

// TestStatusOf is the README's table of journal states → task statuses, row by row, for
// both dialects.
func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		facts Facts
		spec  Status // 2025-11-25
		ext   Status // io.modelcontextprotocol/tasks
	}{
		{Facts{State: "accepted"}, Working, Working},
		{Facts{State: "authorized"}, Working, Working},
		{Facts{State: "authorized", Queued: true}, Working, Working},
		{Facts{State: "dispatched"}, Working, Working},
		{Facts{State: "running"}, Working, Working},
		{Facts{State: "awaiting_approval"}, InputRequired, InputRequired},
		{Facts{State: "unknown"}, Working, Working},
		{Facts{State: "unknown", ReviewRequired: true}, InputRequired, InputRequired},
		{Facts{State: "completed"}, Completed, Completed},
		{Facts{State: "completed", IsError: true}, Failed, Completed},
		{Facts{State: "failed", IsError: true}, Failed, Completed},
		{Facts{State: "timed_out", IsError: true}, Failed, Completed},
		{Facts{State: "rejected"}, Failed, Completed},
		{Facts{State: "cancelled"}, Cancelled, Cancelled},
		{Facts{State: "from_a_newer_build"}, Working, Working},
	} {
		for _, d := range []struct {
			dialect Dialect
			want    Status
		}{{Spec20251125, tc.spec}, {Extension, tc.ext}} {
			got, msg := StatusOf(tc.facts, d.dialect)
			if got != d.want || msg == "" {
				t.Errorf("StatusOf(%+v, %d) = %q, %q; want %q with a message", tc.facts, d.dialect, got, msg, d.want)
			}
		}
	}
}

// TestTerminalStatesAreJournalTerminal: a terminal task status comes only from a terminal
// journal state, so it can never change (the spec forbids it).
func TestTerminalStatesAreJournalTerminal(t *testing.T) {
	journalTerminal := map[string]bool{"completed": true, "failed": true, "rejected": true, "cancelled": true, "timed_out": true}
	for _, st := range []string{"accepted", "authorized", "awaiting_approval", "rejected", "dispatched", "running", "unknown", "completed", "failed", "cancelled", "timed_out"} {
		for _, review := range []bool{false, true} {
			for _, d := range []Dialect{Spec20251125, Extension} {
				got, _ := StatusOf(Facts{State: st, ReviewRequired: review}, d)
				if got.Terminal() != journalTerminal[st] {
					t.Errorf("%s (review %v, dialect %d) → %s: terminal %v, journal terminal %v", st, review, d, got, got.Terminal(), journalTerminal[st])
				}
			}
		}
	}
}

func TestDialectFor(t *testing.T) {
	for v, want := range map[string]Dialect{"2024-11-05": None, "2025-06-18": None, "2025-11-25": Spec20251125, "2026-07-28": Extension} {
		if got := DialectFor(v); got != want {
			t.Errorf("DialectFor(%s) = %d, want %d", v, got, want)
		}
	}
}

func TestMoveTask(t *testing.T) {
	for _, tc := range []struct {
		in     string
		moved  bool
		params string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ssh_exec","arguments":{},"task":{"ttl":5}}}`, true,
			`{"_meta":{"dev.postern/task":{"ttl":5}},"arguments":{},"name":"ssh_exec"}`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":7},"task":{}}}`, true,
			`{"_meta":{"dev.postern/task":{},"progressToken":7},"name":"x"}`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"task":"not this"}}}`, false, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"x","task":{}}}`, false, ""},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"task":{}}}]`, false, ""},
		{`{"method":"tools/call","params":{"task":{}},"broken"`, false, ""},
	} {
		out, ok := moveTask([]byte(tc.in))
		if ok != tc.moved {
			t.Errorf("moveTask(%s) moved %v, want %v", tc.in, ok, tc.moved)
			continue
		}
		if !ok {
			continue
		}
		var msg struct {
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(out, &msg); err != nil || string(msg.Params) != tc.params {
			t.Errorf("moveTask(%s) params = %s (%v), want %s", tc.in, msg.Params, err, tc.params)
		}
	}
}

// FuzzMoveTask: whatever a client POSTs, the rewrite never panics, and what it makes is one
// JSON object whose params have no "task" member any more but carry it under _meta.
func FuzzMoveTask(f *testing.F) {
	f.Add(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ssh_exec","task":{"ttl":5}}}`)
	f.Add(`{"method":"tools/call","params":{"_meta":null,"task":1}}`)
	f.Add(`{"method":"tools/call","params":{"_meta":[],"task":{}}}`)
	f.Fuzz(func(t *testing.T, body string) {
		out, ok := moveTask([]byte(body))
		if !ok {
			return
		}
		var msg struct {
			Params map[string]json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(out, &msg); err != nil {
			t.Fatalf("moveTask(%q) made invalid JSON %q: %v", body, out, err)
		}
		var meta map[string]json.RawMessage
		if _, has := msg.Params["task"]; has || json.Unmarshal(msg.Params["_meta"], &meta) != nil || meta[metaTask] == nil {
			t.Fatalf("moveTask(%q) = %s: the task member was not moved under _meta", body, out)
		}
	})
}
