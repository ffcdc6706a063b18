package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte(`{"execution_id":"ex_1","outcome":"exited","exit_code":0,"ended_at":"2026-01-02T03:04:05Z","stdout":{"bytes":3,"stored":3,"truncated":false,"sha256":"ab"},"stderr":{"bytes":0,"stored":0,"truncated":false,"sha256":""}}`))
	f.Add([]byte(`{"outcome":"start_failed","exit_code":-1,"error":"chdir: no such file"}`))
	f.Add([]byte(`{"outcome":"timed_out","signal":"SIGKILL","stdout":{"bytes":10,"stored":5,"truncated":true}}`))
	f.Add([]byte(`{"outcome":"bogus"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := parseStatus(data)
		if err != nil {
			return
		}
		// A parsed status re-encodes to a fixed point (times may only marshal within
		// RFC 3339's range, so an unencodable one is not a parser bug).
		out, err := json.Marshal(st)
		if err != nil {
			return
		}
		again, err := parseStatus(out)
		if err != nil {
			t.Fatalf("reparse %s: %v", out, err)
		}
		out2, err := json.Marshal(again)
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed status: %s -> %s (%v)", out, out2, err)
		}
	})
}

func FuzzParseSupervisorRecord(f *testing.F) {
	f.Add([]byte(`{"pid":123,"start":456}`))
	f.Add([]byte(`{"pid":-1,"start":1}`))
	f.Add([]byte(`{"pid":1}`))
	f.Add([]byte(`{"fenced":true}`))
	f.Add([]byte(`{"fenced":true,"pid":3}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := parseSupervisorRecord(data)
		if err == nil && !rec.Fenced && (rec.PID <= 0 || rec.Start == 0) {
			t.Fatalf("accepted out-of-range record %+v", rec)
		}
		if err == nil && rec.Fenced && (rec.PID != 0 || rec.Start != 0) {
			t.Fatalf("accepted a fenced record naming a process %+v", rec)
		}
		prec, err := parseProcessRecord(data)
		if err == nil && prec.Error == "" && (prec.PID <= 0 || prec.Start == 0) {
			t.Fatalf("accepted out-of-range process record %+v", prec)
		}
	})
}

// FuzzReadMessage: what a peer sends the supervisor is read a line at a time, bounded; a
// line parses or fails, never more than maxRequestBytes are held, and the rest of the stream
// stays readable.
func FuzzReadMessage(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"start","dir":"/x","spec":{"execution_id":"ex_1","command":"true"}}` + "\n" + `{"v":1,"op":"cancel"}` + "\n"))
	f.Add([]byte(`{"v":1,"op":"wait","dir":"/x"}`))
	f.Add([]byte("\n\n"))
	f.Add([]byte(`{"v":1,"op":"lease"`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(data), 16)
		for range 4 {
			req, err := readMessage[request](r)
			if err != nil {
				return
			}
			if req.Spec != nil {
				req.Spec.withDefaults().validate() // must not panic
			}
		}
	})
}

func TestReadMessageBound(t *testing.T) {
	long := append(bytes.Repeat([]byte("x"), maxRequestBytes+1), '\n')
	if _, err := readMessage[request](bufio.NewReader(bytes.NewReader(long))); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("readMessage of a %d-byte line = %v; want the bound", len(long), err)
	}
}
