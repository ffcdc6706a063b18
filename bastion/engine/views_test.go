package engine

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

// journalOnly is a bastion with nothing but a journal (a real store in a temp dir): enough
// to build what tools return. Its clock moves a millisecond at every reading, so consecutive
// writes never share a time.
func journalOnly(t *testing.T) *Engine {
	t.Helper()
	dir := t.TempDir()
	var mu sync.Mutex
	clock := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Millisecond)
		return clock
	}
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(dir, "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	j, err := markers.Open(filepath.Join(dir, "journal"), markers.Options{Graph: markers.JournalGraph, Signer: signer, Now: now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	b := &Engine{core: &core{journal: j, now: now}}
	b.records = &records{journal: b.journal, now: now, metrics: newMetrics()}
	b.drivers = newDrivers(b.core)
	b.views = &views{core: b.core, drivers: b.drivers}
	return b
}

// journalAs creates a record and walks it along path, the last step applying mutate.
func journalAs(t *testing.T, b *Engine, r markers.Record, path []markers.State, mutate func(*markers.Record)) *markers.Record {
	t.Helper()
	ctx := context.Background()
	rec, err := b.journal.Create(ctx, &r)
	if err != nil {
		t.Fatal(err)
	}
	if len(path) == 0 {
		return rec
	}
	rec, err = b.journal.Advance(ctx, rec.ID, rec.State, path, "test", func(r *markers.Record) error {
		if mutate != nil {
			mutate(r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func evidence(lines ...string) func(*markers.Record) {
	return func(r *markers.Record) { r.Evidence = append(r.Evidence, lines...) }
}

// TestWhatAgentsRead: the text of a result states the cause of a failed or unknown
// execution and what to do next; CallFailed says whether a call that starts work failed
// (bastion/mcpserver sets isError from it); finished_at is when the outcome was observed.
func TestWhatAgentsRead(t *testing.T) {
	b := journalOnly(t)
	const agent, other = "token:agent", "token:other"
	dispatched := []markers.State{markers.Authorized, markers.Dispatched}
	exit := func(code int) func(*markers.Record) {
		return func(r *markers.Record) { r.ExitCode = &code; r.IsError = code != 0 }
	}
	own := journalAs(t, b, markers.Record{ID: "ex_01K00000000000000000000OWN", Actor: agent, Host: "h1", OperationKey: "migration:7"},
		append(dispatched, markers.Running, markers.Completed), exit(0))
	others := journalAs(t, b, markers.Record{ID: "ex_01K000000000000000000OTHER", Actor: other, Host: "h1", OperationKey: "migration:8"},
		append(dispatched, markers.Running, markers.Completed), exit(0))
	taken := func(op string, holder *markers.Record) func(*markers.Record) {
		return func(r *markers.Record) {
			r.OperationTakenBy = holder.ID
			r.IsError = true
			r.Evidence = append(r.Evidence, "operation key "+op+" is taken by another execution on h1; this execution was not started")
		}
	}

	tests := []struct {
		name   string
		rec    markers.Record
		path   []markers.State
		mutate func(*markers.Record)
		// wantText are in the text; neverText appear nowhere in the result.
		wantText, neverText []string
		// wantFailed is isError for ssh_exec / http_request; reads and cancels are never an error.
		wantFailed bool
	}{
		{
			name: "failed: host unreachable, keyed",
			rec:  markers.Record{IdempotencyKey: "deploy-1"},
			path: []markers.State{markers.Authorized, markers.Failed},
			mutate: evidence("policy: authorized (default)",
				"could not connect to h1, nothing was sent: dial tcp 127.0.0.1:1: connect: connection refused\nsecond line"),
			wantText: []string{
				"failed.\nCause: could not connect to h1, nothing was sent: dial tcp 127.0.0.1:1: connect: connection refused\nNext: Nothing ran",
				"same idempotency_key with the same request starts a new attempt",
			},
			wantFailed: true,
		},
		{
			name:       "failed, unkeyed",
			rec:        markers.Record{},
			path:       []markers.State{markers.Authorized, markers.Failed},
			mutate:     evidence("the host refused the request, nothing was started: exec"),
			wantText:   []string{"Cause: the host refused the request", "Next: Nothing ran: it provably did not take effect. Fix the cause, then call again."},
			neverText:  []string{"idempotency_key"},
			wantFailed: true,
		},
		{
			name:       "new attempt",
			rec:        markers.Record{IdempotencyKey: "deploy-1", PreviousAttempt: "ex_01K0000000000000000000PREV"},
			path:       append(dispatched, markers.Running, markers.Completed),
			mutate:     exit(0),
			wantText:   []string{"completed (exit 0). New attempt after ex_01K0000000000000000000PREV, which failed without effect."},
			neverText:  []string{"Cause:"},
			wantFailed: false,
		},
		{
			name:       "unknown: the latest evidence is the cause",
			rec:        markers.Record{},
			path:       append(dispatched, markers.Unknown),
			mutate:     evidence("connection lost after dispatch (EOF); asking the host", "hostagent on h1 could not be asked (connection refused); the outcome stays unknown until it can be"),
			wantText:   []string{"unknown.\nCause: hostagent on h1 could not be asked", "Next: The outcome is NOT known", "execution_status"},
			wantFailed: true,
		},
		{
			name:       "operation key held by the same actor: named, not to be retried",
			rec:        markers.Record{OperationKey: "migration:7"},
			path:       append(dispatched, markers.Failed),
			mutate:     taken("migration:7", own),
			wantText:   []string{"Cause: operation key migration:7 already ran as " + own.ID + " (completed)", "The operation already ran as " + own.ID + ": do not run it again", "execution_status"},
			wantFailed: true,
		},
		{
			name:       "operation key held by another actor: never named",
			rec:        markers.Record{OperationKey: "migration:8"},
			path:       append(dispatched, markers.Failed),
			mutate:     taken("migration:8", others),
			wantText:   []string{"Cause: operation key migration:8 is taken by another execution on h1", "Do not retry"},
			neverText:  []string{others.ID},
			wantFailed: true,
		},
		{name: "completed, exit 0", path: append(dispatched, markers.Running, markers.Completed), mutate: exit(0), wantFailed: false},
		{name: "completed, exit 1", path: append(dispatched, markers.Running, markers.Completed), mutate: exit(1), wantText: []string{"(exit 1)"}, wantFailed: true},
		{name: "timed out", path: append(dispatched, markers.Running, markers.TimedOut), wantFailed: true},
		{name: "cancelled", path: append(dispatched, markers.Running, markers.Cancelled), wantFailed: true},
		{name: "rejected by policy", path: []markers.State{markers.Rejected}, wantFailed: true},
		{name: "running", path: append(dispatched, markers.Running), wantFailed: false},
		{name: "awaiting approval", path: []markers.State{markers.AwaitingApproval}, wantFailed: false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rec
			r.ID, r.Actor, r.Host = "ex_01K0000000000000000000000"+string(rune('A'+i)), agent, "h1"
			x := b.views.view(journalAs(t, b, r, tt.path, tt.mutate))
			if got := x.CallFailed(); got != tt.wantFailed {
				t.Errorf("CallFailed = %v; want %v", got, tt.wantFailed)
			}
			if strings.Contains(x.Cause, "\n") {
				t.Errorf("cause %q is more than one line", x.Cause)
			}
			text := x.Summary()
			structured, _ := json.Marshal(x)
			for _, w := range tt.wantText {
				if !strings.Contains(text, w) {
					t.Errorf("text does not say %q:\n%s", w, text)
				}
			}
			for _, n := range tt.neverText {
				if strings.Contains(text, n) || strings.Contains(string(structured), n) {
					t.Errorf("result shows %q:\n%s\n%s", n, text, structured)
				}
			}
		})
	}
}

// TestFinishedAtIgnoresTheDeliveryWrite: delivering a result updates the record but not
// when its outcome was observed.
func TestFinishedAtIgnoresTheDeliveryWrite(t *testing.T) {
	b := journalOnly(t)
	rec := journalAs(t, b, markers.Record{ID: "ex_01K00000000000000000000FIN", Actor: "token:agent"},
		[]markers.State{markers.Authorized, markers.Dispatched, markers.Completed}, nil)
	observed := rec.StateTimes[markers.Completed]
	if err := b.Delivered(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	after, err := b.journal.Get(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !after.UpdatedAt.After(observed) {
		t.Fatalf("delivery did not update the record (updated %v, completed %v)", after.UpdatedAt, observed)
	}
	x := b.views.view(after)
	if x.FinishedAt == nil || !x.FinishedAt.Equal(observed) {
		t.Errorf("finished_at = %v; want %v, when completed was journaled", x.FinishedAt, observed)
	}
}
