package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/markers"
)

func TestStateLabel(t *testing.T) {
	delivered := time.Now()
	tests := []struct {
		name string
		rec  markers.Record
		want string
	}{
		{"completed and delivered", markers.Record{State: markers.Completed, ResultDeliveredAt: &delivered}, "completed"},
		{"completed, not delivered", markers.Record{State: markers.Completed}, "completed (not delivered)"},
		{"running", markers.Record{State: markers.Running}, "running"},
		{"unknown", markers.Record{State: markers.Unknown}, "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stateLabel(&tt.rec); got != tt.want {
				t.Fatalf("stateLabel = %q; want %q", got, tt.want)
			}
		})
	}
}

func TestLastLineWriter(t *testing.T) {
	const event, checkpoint = `{"type":"event","seq":1}`, `{"type":"checkpoint","note":"postern\n1\nabc\n"}`
	tests := []struct {
		name   string
		writes []string
		want   bool
	}{
		{"empty", nil, true},
		{"ends with a checkpoint", []string{event + "\n" + checkpoint + "\n"}, true},
		{"split anywhere", []string{event + "\n{\"ty", "pe\":\"checkp", "oint\",\"note\":\"x\"}", "\n"}, true},
		{"ends with an event", []string{checkpoint + "\n" + event + "\n"}, false},
		{"cut inside the checkpoint", []string{event + "\n" + checkpoint[:30]}, false},
		{"no final newline", []string{event + "\n" + checkpoint}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			w := &lastLineWriter{w: &out}
			for _, s := range tt.writes {
				if _, err := w.Write([]byte(s)); err != nil {
					t.Fatal(err)
				}
			}
			if got := w.endsSealed(); got != tt.want {
				t.Fatalf("endsSealed = %v; want %v", got, tt.want)
			}
			if out.String() != strings.Join(tt.writes, "") {
				t.Fatal("the writes were not passed through")
			}
		})
	}
}

// TestShowNamesThePreviousAttempt: `executions show` of a new attempt links it to the failed
// execution it retries, and a refused execution to the holder of its operation key.
func TestShowNamesThePreviousAttempt(t *testing.T) {
	r := &markers.Record{
		ID: "ex_01K0000000000000000000000B", State: markers.Failed, IdempotencyKey: "deploy-1",
		PreviousAttempt: "ex_01K0000000000000000000000A", OperationKey: "migration:7",
		OperationTakenBy: "ex_01K0000000000000000000000H",
	}
	var out strings.Builder
	if err := writeExecution(&out, &api.ExecutionDetail{Record: r}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"previous attempt    ex_01K0000000000000000000000A", "operation taken by  ex_01K0000000000000000000000H"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("show does not print %q:\n%s", want, out.String())
		}
	}
}

func TestEventStep(t *testing.T) {
	tests := []struct {
		ev   markers.Event
		want string
	}{
		{markers.Event{Kind: markers.KindCreate, To: markers.Accepted}, "→ accepted"},
		{markers.Event{Kind: markers.KindTransition, From: markers.Accepted, To: markers.Authorized}, "accepted → authorized"},
		{markers.Event{Kind: markers.KindUpdate, From: markers.Completed, To: markers.Completed}, "completed (update)"},
		{markers.Event{Kind: markers.KindDeliveryRevoked, From: markers.Completed, To: markers.Completed}, "completed (delivery revoked)"},
	}
	for _, tt := range tests {
		if got := eventStep(tt.ev); got != tt.want {
			t.Errorf("eventStep(%s) = %q; want %q", tt.ev.Kind, got, tt.want)
		}
	}
}

// TestShowSaysWhyNotDelivered: `executions show` of a completed result no response delivered
// says why the last one did not (its journaled event), and nothing once it is delivered.
func TestShowSaysWhyNotDelivered(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	d := &api.ExecutionDetail{
		Record: &markers.Record{ID: "ex_01K0000000000000000000000B", State: markers.Completed},
		Events: []markers.Event{{Seq: 5, Kind: markers.KindUpdate, From: markers.Completed, To: markers.Completed, At: at,
			Note: api.NotDeliveredNote + ": the client cancelled the request or went away",
			Call: &markers.Call{Transport: "http", RequestID: "3", Match: "not delivered"}}},
	}
	var out strings.Builder
	if err := writeExecution(&out, d); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"completed (not delivered)", "not delivered  the client cancelled the request or went away", "a retry replays it", "(call 3 via http: not delivered)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("show does not print %q:\n%s", want, out.String())
		}
	}
	d.Record.ResultDeliveredAt = &at
	out.Reset()
	if err := writeExecution(&out, d); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "not delivered  ") {
		t.Errorf("show of a delivered result still says why it was not:\n%s", out.String())
	}
}

// TestDoctorKeepsTheLinesOfAConfigProblem: a config with several problems is printed one
// problem a line, not with a literal \n.
func TestDoctorKeepsTheLinesOfAConfigProblem(t *testing.T) {
	path := t.TempDir() + "/postern.toml"
	if err := os.WriteFile(path, []byte("state_dir = \"relative\"\nno_such_key = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runCLI(t, "", "doctor", "--config", path)
	if res.err == nil || strings.Contains(res.stdout, `\n`) {
		t.Fatalf("doctor: %v\n%s\nwant a problem, without a literal \\n", res.err, res.stdout)
	}
	for _, want := range []string{"problem config ", "no_such_key: unknown key\n", "\n                   config: state_dir must be an absolute path"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("doctor lacks %q:\n%s", want, res.stdout)
		}
	}
}
