package markers_test

import (
	"bytes"
	"testing"

	"github.com/postern-dev/postern/markers"
)

func FuzzDecodeRecord(f *testing.F) {
	good, _ := markers.EncodeRecord(&markers.Record{ID: "ex_1", Graph: markers.Host, State: markers.Running, Command: []string{"true"}})
	f.Add(good)
	f.Add([]byte{1, '{', '}'})
	f.Add([]byte{2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := markers.DecodeRecord(b)
		if err != nil {
			return
		}
		again, err := markers.EncodeRecord(rec)
		if err != nil {
			t.Fatalf("decoded record does not encode: %v", err)
		}
		if _, err := markers.DecodeRecord(again); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
	})
}

// FuzzVerifyJSONL feeds mutated exports to the verifier: it must never fail to answer, and a
// PASS must describe a consistent range.
func FuzzVerifyJSONL(f *testing.F) {
	export, vkey := exportLog(f, 3)
	f.Add(export)
	f.Add([]byte(`{"type":"base","seq":3,"hash":"00"}` + "\n"))
	f.Add([]byte(`{"type":"event","seq":1}` + "\n"))
	f.Add([]byte(`{"type":"checkpoint","note":"x\n\n— a b\n"}` + "\n"))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rep, err := markers.VerifyJSONL(bytes.NewReader(b), vkey, markers.VerifyOptions{})
		if err != nil {
			t.Fatalf("verify returned an error on in-memory input: %v", err)
		}
		if rep.OK && rep.Events > 0 && rep.LastSeq-rep.FirstSeq+1 != rep.Events {
			t.Fatalf("PASS with inconsistent range: %v", rep)
		}
		if rep.OK && rep.SealedSeq > rep.LastSeq {
			t.Fatalf("PASS sealed beyond the log: %v", rep)
		}
	})
}
