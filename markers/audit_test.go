package markers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// exportLog writes n executions (create + two transitions each) with a checkpoint every 10
// events and returns the export and the verifier key.
func exportLog(t testing.TB, n int) ([]byte, string) {
	t.Helper()
	s := testutil.OpenStore(t, markers.HostGraph, func(o *markers.Options) { o.CheckpointEvery = 10 })
	ctx := context.Background()
	for i := range n {
		id := fmt.Sprintf("ex_%03d", i)
		s.Create(ctx, &markers.Record{ID: id, Command: []string{"sh", "-c", "echo " + id}})
		s.Transition(ctx, id, markers.Started, markers.Running, "", nil)
		s.Transition(ctx, id, markers.Running, markers.Exited, "", func(r *markers.Record) error {
			code := i % 3
			r.ExitCode = &code
			return nil
		})
	}
	var buf bytes.Buffer
	if err := s.Export(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), s.VerifierKey
}

func TestVerifyDetectsTampering(t *testing.T) {
	export, vkey := exportLog(t, 10)
	lines := strings.SplitAfter(string(export), "\n")
	lines = lines[:len(lines)-1] // the empty string after the final newline
	rep, err := markers.VerifyJSONL(bytes.NewReader(export), vkey, markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.Events != 30 || rep.Checkpoints != 3 || rep.UnsealedTail != 0 {
		t.Fatalf("untouched export: %v, %v; want PASS, 30 events, 3 checkpoints", rep, err)
	}

	// Line 5 is an event (seq 5); line 11 is the first checkpoint (after seq 10).
	if !strings.Contains(lines[4], `"seq":5,`) || !strings.Contains(lines[10], `"checkpoint"`) {
		t.Fatalf("unexpected export layout:\n%s", export)
	}
	join := func(ls []string) string { return strings.Join(ls, "") }
	with := func(i int, line string) string {
		c := append([]string(nil), lines...)
		c[i] = line
		return join(c)
	}
	without := func(i int) string {
		return join(append(append([]string(nil), lines[:i]...), lines[i+1:]...))
	}
	swapped := func(i, j int) string {
		c := append([]string(nil), lines...)
		c[i], c[j] = c[j], c[i]
		return join(c)
	}
	otherKey, _ := exportLog(t, 4)

	tests := []struct {
		name     string
		input    string
		opts     markers.VerifyOptions
		wantLine int
		wantWhy  string
	}{
		{"flip a byte in a record", with(4, strings.Replace(lines[4], "echo", "echO", 1)), markers.VerifyOptions{}, 5, "this_hash"},
		{"flip a byte in a hash", with(4, strings.Replace(lines[4], `"this_hash":"`, `"this_hash":"0`, 1)[:len(lines[4])]+"\n"), markers.VerifyOptions{}, 5, ""},
		{"add a field", with(4, strings.Replace(lines[4], `{"type":"event",`, `{"type":"event","x":1,`, 1)), markers.VerifyOptions{}, 5, "this_hash"},
		{"drop an event", without(4), markers.VerifyOptions{}, 5, "gap"},
		{"reorder two events", swapped(4, 5), markers.VerifyOptions{}, 5, "reordered"},
		{"move an event back", swapped(3, 5), markers.VerifyOptions{}, 4, "reordered"},
		{"drop a checkpoint line keeps chain", without(10), markers.VerifyOptions{}, 0, ""},
		{"truncate mid-line", join(lines)[:len(export)-7], markers.VerifyOptions{}, len(lines), "truncated"},
		{"truncate at a line boundary", join(lines[:25]), markers.VerifyOptions{RequireSealed: true}, 25, "unsealed"},
		{"checkpoint signed by another key", with(10, firstCheckpoint(t, otherKey)), markers.VerifyOptions{}, 11, "not signed by the audit key"},
		{"garbage line", with(2, "{nope\n"), markers.VerifyOptions{}, 3, "JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := markers.VerifyJSONL(strings.NewReader(tt.input), vkey, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantLine == 0 {
				if !rep.OK {
					t.Fatalf("report = %v; want PASS", rep)
				}
				return
			}
			if rep.OK {
				t.Fatalf("report = PASS; want FAIL at line %d", tt.wantLine)
			}
			if rep.BadLine != tt.wantLine || !strings.Contains(rep.Reason, tt.wantWhy) {
				t.Errorf("report = %v; want FAIL at line %d mentioning %q", rep, tt.wantLine, tt.wantWhy)
			}
		})
	}
}

func firstCheckpoint(t testing.TB, export []byte) string {
	t.Helper()
	for _, l := range strings.SplitAfter(string(export), "\n") {
		if strings.Contains(l, `"type":"checkpoint"`) {
			return l
		}
	}
	t.Fatal("no checkpoint in export")
	return ""
}

func TestVerifyRejectsWrongVerifierKey(t *testing.T) {
	export, _ := exportLog(t, 4)
	_, otherVkey := testutil.AuditKey(t)
	rep, err := markers.VerifyJSONL(bytes.NewReader(export), otherVkey, markers.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !strings.Contains(rep.Reason, "not signed by the audit key") {
		t.Errorf("report = %v; want FAIL: not signed by the audit key", rep)
	}
}

func TestGCKeepsNonTerminalAndChain(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) {
		o.Now = func() time.Time { return clock }
		o.CheckpointEvery = 5
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
		o.DefaultRetention = 48 * time.Hour
		o.EventRetention = 72 * time.Hour
	})
	ctx := context.Background()
	finish := func(id string) {
		t.Helper()
		for _, step := range [][2]markers.State{{markers.Accepted, markers.Authorized}, {markers.Authorized, markers.Dispatched}, {markers.Dispatched, markers.Completed}} {
			if _, err := s.Transition(ctx, id, step[0], step[1], "", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Create(ctx, &markers.Record{ID: "ex_old_ro", Class: "read_only", Actor: "a", Fingerprint: "fp1"})
	finish("ex_old_ro")
	s.Create(ctx, &markers.Record{ID: "ex_old_cmd", Class: "remote_command", OperationKey: "op:x"})
	finish("ex_old_cmd")
	s.Create(ctx, &markers.Record{ID: "ex_old_pending", Class: "read_only"})
	s.Transition(ctx, "ex_old_pending", markers.Accepted, markers.Authorized, "", nil)
	s.Transition(ctx, "ex_old_pending", markers.Authorized, markers.Dispatched, "", nil)
	s.Transition(ctx, "ex_old_pending", markers.Dispatched, markers.Unknown, "", nil)

	clock = clock.Add(2 * time.Hour)
	res, err := s.GC(ctx, markers.GCOptions{})
	if err != nil || res.Records != 1 {
		t.Fatalf("gc after 2h = %+v, %v; want the read_only record removed", res, err)
	}
	if _, err := s.FindByFingerprint("a", "", "fp1"); !errors.Is(err, markers.ErrNotFound) {
		t.Errorf("fingerprint of a removed record still found: %v", err)
	}
	clock = clock.Add(100 * time.Hour)
	s.Create(ctx, &markers.Record{ID: "ex_new", OperationKey: "op:x"})
	res, err = s.GC(ctx, markers.GCOptions{})
	if err != nil || res.Records != 1 || res.Events == 0 {
		t.Fatalf("gc after 102h = %+v, %v; want remote_command record and old events removed", res, err)
	}
	for id, want := range map[string]bool{"ex_old_ro": false, "ex_old_cmd": false, "ex_old_pending": true, "ex_new": true} {
		_, err := s.Get(id)
		if (err == nil) != want {
			t.Errorf("%s present = %v; want %v", id, err == nil, want)
		}
	}
	if rec, err := s.FindByOperationKey("op:x"); err != nil || rec.ID != "ex_new" {
		t.Errorf("operation key after removing the older execution = %v, %v; want ex_new", rec, err)
	}
	var buf bytes.Buffer
	if err := s.Export(&buf); err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(buf.String(), "\n"); !strings.Contains(first, `"type":"base"`) {
		t.Errorf("export after pruning starts with %s; want a base line", first)
	}
	rep, err := markers.VerifyJSONL(&buf, s.VerifierKey, markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.FirstSeq != res.BaseSeq+1 {
		t.Fatalf("verify after gc = %v, %v; want PASS from seq %d", rep, err, res.BaseSeq+1)
	}
	s.Close()
	if rep, err := markers.VerifyDir(s.Dir, s.VerifierKey, markers.VerifyOptions{}); err != nil || !rep.OK {
		t.Fatalf("verify dir after gc = %v, %v", rep, err)
	}
}

func TestExportLinesAreStable(t *testing.T) {
	export, _ := exportLog(t, 1)
	first, _, _ := strings.Cut(string(export), "\n")
	var keys []string
	dec := json.NewDecoder(strings.NewReader(first))
	dec.Token()
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		var skip json.RawMessage
		dec.Decode(&skip)
	}
	want := "[type seq at execution_id kind to record prev_hash this_hash]"
	if fmt.Sprint(keys) != want {
		t.Errorf("field order = %v; want %s", keys, want)
	}
}

// TestVerifyEmptyLogIsNotSealed: an empty export passes as a chain (there is nothing to
// contradict) but never as a sealed one: an export cut before its first line is not a log.
func TestVerifyEmptyLogIsNotSealed(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	if rep, err := markers.VerifyJSONL(strings.NewReader(""), s.VerifierKey, markers.VerifyOptions{}); err != nil || !rep.OK {
		t.Fatalf("empty, not required sealed = %v, %v; want PASS", rep, err)
	}
	rep, err := markers.VerifyJSONL(strings.NewReader(""), s.VerifierKey, markers.VerifyOptions{RequireSealed: true})
	if err != nil || rep.OK || !strings.Contains(rep.String(), "empty") {
		t.Fatalf("empty, required sealed = %v, %v; want FAIL saying it is empty", rep, err)
	}
}
