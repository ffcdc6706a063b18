package markers_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

// checkEncoding fails t unless EncodeRecord writes r as the version byte and json.Marshal's
// encoding, or fails where json.Marshal fails.
func checkEncoding(t testing.TB, r *markers.Record) {
	t.Helper()
	want, werr := json.Marshal(r)
	got, gerr := markers.EncodeRecord(r)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("json.Marshal error %v, EncodeRecord's %v", werr, gerr)
	}
	if werr != nil {
		return
	}
	if len(got) == 0 || got[0] != 1 || !bytes.Equal(got[1:], want) {
		t.Fatalf("EncodeRecord\n%q\njson.Marshal\n%q", got, want)
	}
}

// fillAll sets every field of v (a struct) to a non-zero value, recursively, with strings that
// need escaping, so every field the encoder writes by hand is compared.
func fillAll(t *testing.T, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString("x <&> \"q\" \\ é \u2028 \x01")
	case reflect.Int, reflect.Int64:
		v.SetInt(-7)
	case reflect.Uint64:
		v.SetUint(1 << 63)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(t, v.Elem())
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(` {"a" : [1, 2], "b":"<x>"} `))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fillAll(t, v.Index(0))
		fillAll(t, v.Index(1))
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for _, k := range []string{"b<", "a", "\u00e9"} {
			kv, ev := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			kv.SetString(k)
			fillAll(t, ev)
			v.SetMapIndex(kv, ev)
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 12, 2, 13, 4, 5, 120000, time.UTC)))
			return
		}
		for i := range v.NumField() {
			fillAll(t, v.Field(i))
		}
	default:
		t.Fatalf("fill: no value for a %s: teach fill (and check appendRecord writes it)", v.Type())
	}
}

// TestEncodeRecordCoversEveryField checks the hand-written encoding of a record with every
// field set, and of each field set alone: a field added to Record and not to appendRecord
// fails here.
func TestEncodeRecordCoversEveryField(t *testing.T) {
	var full markers.Record
	fillAll(t, reflect.ValueOf(&full).Elem())
	checkEncoding(t, &full)
	rt := reflect.TypeFor[markers.Record]()
	for i := range rt.NumField() {
		var one markers.Record
		fillAll(t, reflect.ValueOf(&one).Elem().Field(i))
		checkEncoding(t, &one)
	}
	checkEncoding(t, &markers.Record{})
	// Times outside UTC or years 0–9999, and a request that is not JSON.
	paris := time.FixedZone("CET", 3600)
	checkEncoding(t, &markers.Record{ID: "ex_1", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, paris),
		StateTimes: map[markers.State]time.Time{markers.Running: time.Date(2026, 1, 2, 3, 4, 5, 0, paris)}})
	checkEncoding(t, &markers.Record{ID: "ex_1", CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	checkEncoding(t, &markers.Record{ID: "ex_1", Request: json.RawMessage(`{`)})
}

// FuzzEncodeRecord checks the hand-written record encoding against json.Marshal, byte for
// byte, whatever the strings, numbers and times.
func FuzzEncodeRecord(f *testing.F) {
	f.Add("ex_1", "sh -c 'a <b> && c\n'", int64(1767225600123456789), int64(0), uint8(0xff))
	f.Add("ex_\x00\"\\", "ünïcode <&> \u2028 \b\f\t \xff", int64(-62135596800), int64(-1), uint8(0x0f))
	f.Add("", "", int64(9e18), int64(1<<40), uint8(0xf0))
	f.Fuzz(func(t *testing.T, s, u string, unixNano, n int64, set uint8) {
		at := time.Unix(0, unixNano).UTC()
		code := int(n)
		r := &markers.Record{ID: s, Graph: markers.Graph(u), State: markers.State(s), Actor: u, Fingerprint: s,
			Command: []string{s, u}, Host: u, CreatedAt: at, UpdatedAt: at.Add(time.Duration(n)),
			StateTimes: map[markers.State]time.Time{markers.State(s): at, markers.State(u): at.Add(time.Duration(n))}}
		if set&1 != 0 {
			r.ExitCode, r.Evidence, r.Signal = &code, []string{u, s, ""}, s
		}
		if set&2 != 0 {
			r.Output = markers.Output{StdoutBytes: n, StderrSHA256: u, Truncated: n%2 == 0}
		}
		if set&4 != 0 {
			r.Env = map[string]string{s: u, u: s}
			r.TimeoutSeconds, r.HTTPStatus, r.PID, r.PIDStart = code, code, code, uint64(n)
		}
		if set&8 != 0 {
			r.ResultDeliveredAt = &at
			r.Checkpoints = []markers.Checkpoint{{At: at, Note: u}}
		}
		if set&16 != 0 {
			r.Request = json.RawMessage(u)
			r.Fleet = &markers.Rollout{Targets: []string{s}, MaxErrors: u}
		}
		if set&32 != 0 {
			r.IsError, r.ReviewRequired, r.Validated = true, true, true
		}
		checkEncoding(t, r)
	})
}

// BenchmarkEncodeRecord is the encoding of a completed journal record of `true`, by the
// store and, as the same run's baseline, by json.Marshal.
func BenchmarkEncodeRecord(b *testing.B) {
	at := time.Date(2026, 12, 2, 13, 4, 5, 123456789, time.UTC)
	code := 0
	r := &markers.Record{ID: "ex_01KBFZ7Q9M3V7J8R2W6T4X5Y6Z", Graph: markers.JournalGraph, State: markers.Completed,
		Actor: "token:bench", PolicyActor: "bench", IntentScope: "run:p1-42", Fingerprint: "hmac-sha256:3f1c0a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a",
		Principal: "token:bench", Tool: "ssh_exec", Channel: "ssh", Target: "host:h1", Account: "deploy", Command: []string{"sh", "-c", "true"},
		Class: "remote_command", Decision: "authorized", Rule: "default", Host: "h1", CreatedAt: at, UpdatedAt: at,
		StateTimes: map[markers.State]time.Time{markers.Accepted: at, markers.Authorized: at, markers.Dispatched: at, markers.Running: at, markers.Completed: at},
		ExitCode:   &code, Output: markers.Output{StdoutSHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		Evidence: []string{"hostagent marker ex_01KBFZ7Q9M3V7J8R2W6T4X5Y6Z created", "exit status 0"}}
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := markers.EncodeRecord(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
