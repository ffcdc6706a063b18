package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil/harness"
)

// TestInvalidTextIsRefusedBeforeAnythingIsJournaled: a tool call whose JSON holds invalid
// UTF-8 or an unpaired surrogate escape, in any field, is refused with a JSON-RPC error
// (-32602, invalid_argument, naming the field) over HTTP, over the MCP unix socket and
// through the stdio bridge; nothing is journaled and nothing runs. (go-sdk's client sends
// only valid UTF-8, so the calls are raw bytes.)
func TestInvalidTextIsRefusedBeforeAnythingIsJournaled(t *testing.T) {
	f := startFleet(t)
	cmd, file := appendCommand(t, "mangled")
	call := func(tool, args string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`)
	}
	cases := []struct {
		name, field string
		body        []byte
	}{
		{name: "invalid byte in command", field: "params.arguments.command", body: call("ssh_exec", `{"host":"h1","command":"`+cmd+" # \xff\xfe"+`"}`)},
		{name: "lone high surrogate in command", field: "params.arguments.command", body: call("ssh_exec", `{"host":"h1","command":"`+cmd+` # \ud800"}`)},
		{name: "lone low surrogate in an env value", field: "params.arguments.env.LANG", body: call("ssh_exec", `{"host":"h1","command":"`+cmd+`","env":{"LANG":"C.\udc00"}}`)},
		{name: "encoded surrogate in cwd", field: "params.arguments.cwd", body: call("ssh_exec", `{"host":"h1","command":"`+cmd+`","cwd":"/tmp/`+"\xed\xa0\x80"+`"}`)},
		{name: "surrogate in an env name", field: "the name of params.arguments.env.LC_\ufffd", body: call("ssh_exec", `{"host":"h1","command":"`+cmd+`","env":{"LC_\ud800":"x"}}`)},
		{name: "invalid byte in another tool", field: "params.arguments.execution_id", body: call("execution_status", `{"execution_id":"ex_`+"\xff"+`"}`)},
	}
	transports := []struct {
		name string
		post func(t *testing.T, body []byte) (int, []byte)
	}{
		{name: "HTTP", post: func(t *testing.T, body []byte) (int, []byte) {
			status, out := rawPost(t, f.bastion, f.bastion.Tokens["agent"], body)
			return status, []byte(out)
		}},
		{name: "unix socket", post: func(t *testing.T, body []byte) (int, []byte) {
			status, out, err := postMCP(context.Background(), unixClient(f.bastion.Socket), "http://local/mcp", "", body)
			if err != nil {
				t.Fatal(err)
			}
			return status, out
		}},
	}
	for _, tr := range transports {
		for _, tc := range cases {
			t.Run(tr.name+"/"+tc.name, func(t *testing.T) {
				status, out := tr.post(t, tc.body)
				checkInvalidText(t, out, "42", tc.field)
				if status != http.StatusOK {
					t.Errorf("HTTP status %d; want 200 with the JSON-RPC error", status)
				}
			})
		}
	}
	t.Run("stdio bridge", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		bridge := startHelper(t, exec.CommandContext(ctx, harness.Binary(t, "postern"), "mcp", "--socket", f.bastion.Socket))
		defer bridge.stop()
		for i, tc := range cases {
			// An id of its own: the bridge may not have forgotten the last one yet.
			id := strconv.Itoa(100 + i)
			bridge.stdin.Write(append(bytes.Replace(tc.body, []byte(`"id":42`), []byte(`"id":`+id), 1), '\n'))
			line, err := bridge.out.ReadBytes('\n')
			if err != nil {
				t.Fatalf("%s: the bridge answered nothing: %v", tc.name, err)
			}
			checkInvalidText(t, line, id, tc.field)
		}
	})

	if n := effects(t, file); n != 0 {
		t.Errorf("a refused command ran %d times", n)
	}
	if n := metric(t, f.bastion, "postern_executions_accepted_total"); n != 0 {
		t.Errorf("the bastion accepted %v executions; want none", n)
	}
	if list := operatorExecutions(t, f); len(list) != 0 {
		t.Errorf("the journal holds %d executions; want none: %s", len(list), list)
	}
	if n := refusals(t, f.bastion, "http", "invalid_text"); n != float64(len(cases)) {
		t.Errorf("postern_refusals_total{where=http,reason=invalid_text} = %v; want %d", n, len(cases))
	}
}

// checkInvalidText checks a JSON-RPC answer: error -32602 for id, invalid_argument, naming
// field.
func checkInvalidText(t *testing.T, out []byte, id, field string) {
	t.Helper()
	var reply struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &reply); err != nil || reply.Error == nil {
		t.Fatalf("answer %q; want a JSON-RPC error", out)
	}
	if string(reply.ID) != id || reply.Error.Code != -32602 || !strings.HasPrefix(reply.Error.Message, "invalid_argument: ") || !strings.Contains(reply.Error.Message, field) {
		t.Fatalf("answer %q; want error -32602 for id %s, invalid_argument naming %s", out, id, field)
	}
}

// operatorExecutions lists the journal's executions through the operator API.
func operatorExecutions(t *testing.T, f *testbed) []json.RawMessage {
	t.Helper()
	hc := operatorClient(f.bastion)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://operator/v1/executions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct {
		Executions []json.RawMessage `json:"executions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("operator executions: %s, %v", resp.Status, err)
	}
	return page.Executions
}
