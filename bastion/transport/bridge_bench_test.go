package transport

import (
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkBridgeInspect is the bridge's reading of the daemon's answer to a tools/call (an
// ssh_exec result of about 2 KB without an approval offer), which it does for every answer
// before relaying it.
func BenchmarkBridgeInspect(b *testing.B) {
	x := map[string]any{"execution_id": "ex_01KBFZ7Q9M3V7J8R2W6T4X5Y6Z", "state": "completed", "result_delivered": false, "replayed": false,
		"host": "h1", "command": "true", "class": "remote_command", "exit_code": 0, "is_error": false, "stdout": strings.Repeat("line of output\n", 40),
		"stdout_offset": 0, "stdout_bytes": 600, "stderr": "", "stderr_offset": 0, "stderr_bytes": 0,
		"evidence": []string{"hostagent marker ex_01KBFZ7Q9M3V7J8R2W6T4X5Y6Z created", "exit status 0"}}
	sc, _ := json.Marshal(x)
	msg, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "result": map[string]any{
		"content": []any{map[string]any{"type": "text", "text": "ex_01KBFZ7Q9M3V7J8R2W6T4X5Y6Z completed, exit code 0"}}, "structuredContent": json.RawMessage(sc)}})
	if err != nil {
		b.Fatal(err)
	}
	br := &bridge{}
	env := &envelope{ID: json.RawMessage("7"), Method: "tools/call"}
	id := idKey(env.ID)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if answers, _, _, hasOffer := br.inspect(env, id, msg); !answers || hasOffer {
			b.Fatal("not read as the call's answer without an offer")
		}
	}
}
