package markers_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

func FuzzDecodeRecord(f *testing.F) {
	good, _ := markers.EncodeRecord(&markers.Record{ID: "ex_1", Graph: markers.HostGraph, State: markers.Running, Command: []string{"true"}})
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

// FuzzEventBody checks the store's hand-written event encoding against json.Marshal: byte
// for byte the same, whatever the note, ids and time.
func FuzzEventBody(f *testing.F) {
	rec, _ := markers.EncodeRecord(&markers.Record{ID: "ex_1", Graph: markers.JournalGraph, State: markers.Dispatched, Command: []string{"sh", "-c", "a <b> && c\n"}})
	f.Add("ex_1", "dispatching to h1", int64(1767225600123456789), rec[1:])
	f.Add("ex_\x00\"\\", "ünïcode <&> \u2028 \b\f\t \xff", int64(-62135596800), []byte(nil))
	f.Add("", "", int64(253402300800), []byte(`{"a":1}`))
	f.Fuzz(func(t *testing.T, id, note string, unixNano int64, record []byte) {
		if len(record) == 0 {
			record = nil // the store never writes an empty record
		} else if !json.Valid(record) {
			return
		}
		if len(record) > 0 {
			var compact, escaped bytes.Buffer
			json.HTMLEscape(&escaped, record)
			if err := json.Compact(&compact, record); err != nil || !bytes.Equal(compact.Bytes(), record) || !bytes.Equal(escaped.Bytes(), record) {
				return // the store's records are json.Marshal's: compact, HTML-escaped
			}
		}
		uid := 0
		call := &markers.Call{Transport: note, RequestID: id, Run: note, Match: id, Replayed: unixNano%2 == 0,
			NewRun: &markers.Run{Actor: id, Scope: note, Exe: note, Cmdline: []string{id, note}, UID: &uid, FirstSeen: time.Unix(0, unixNano).UTC()}}
		for i, at := range []time.Time{time.Unix(0, unixNano).UTC(), time.Unix(0, unixNano).In(time.FixedZone("x", 3600)), time.Unix(0, unixNano).UTC()} {
			ev := &markers.Event{Type: "event", Seq: uint64(unixNano), At: at, ExecutionID: id, Kind: markers.KindTransition,
				From: markers.State(id), To: markers.State(note), Note: note, Record: record, PrevHash: note}
			if i == 2 {
				ev.Call = call // the tool call behind a create, joined or update event
			}
			want, werr := json.Marshal(ev)
			got, gerr := markers.EventBody(ev)
			if (werr != nil) != (gerr != nil) {
				t.Fatalf("json.Marshal error %v, store's %v", werr, gerr)
			}
			if werr == nil && !bytes.Equal(got, want) {
				t.Fatalf("store's encoding\n%s\njson.Marshal\n%s", got, want)
			}
		}
	})
}
