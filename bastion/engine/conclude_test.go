package engine

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// TestConcludeJournalsEveryHostAnswer carries every host answer out on a real journal, from
// every state a driver asks a host in: the journal takes each verdict (no illegal transition,
// no execution left where it was), with review required exactly when the verdict says so.
// testHost names the host in every decision.
const testHost = "h1"

// driverStates are the journal states a driver asks a host about an execution in.
var driverStates = []markers.State{markers.Dispatched, markers.Running, markers.Unknown}

func TestConcludeJournalsEveryHostAnswer(t *testing.T) {
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "test")
	if err != nil {
		t.Fatal(err)
	}
	journal, err := markers.Open(filepath.Join(t.TempDir(), "journal"), markers.Options{Graph: markers.JournalGraph, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { journal.Close() })
	b := &Engine{core: testCore(&core{cfg: config.DefaultConfig(t.TempDir()), log: slog.New(slog.DiscardHandler), journal: journal, metrics: newMetrics(), ctx: t.Context()})}
	b.records = &records{journal: journal, now: time.Now, metrics: b.metrics}
	b.drivers = newDrivers(b.core)
	walk := map[markers.State][]markers.State{
		markers.Dispatched: {markers.Authorized, markers.Dispatched},
		markers.Running:    {markers.Authorized, markers.Dispatched, markers.Running},
		markers.Unknown:    {markers.Authorized, markers.Dispatched, markers.Unknown},
	}
	n := 0
	for _, from := range driverStates {
		for _, ms := range hostproto.MarkerStates() {
			for _, confirmed := range []bool{false, true} {
				n++
				id := fmt.Sprintf("ex_%04d", n)
				if _, err := journal.Create(t.Context(), &markers.Record{ID: id, Actor: "a", Channel: "ssh"}); err != nil {
					t.Fatal(err)
				}
				rec, err := journal.Advance(t.Context(), id, markers.Accepted, walk[from], "", nil)
				if err != nil {
					t.Fatal(err)
				}
				d := &driver{core: b.core, all: b.drivers, id: id, rec: rec, changed: make(chan struct{}), stdout: newTail(1024), stderr: newTail(1024)}
				if confirmed && from != markers.Running {
					d.setStarted(&hostproto.Marker{ID: id, State: hostproto.MarkerStarted, PID: 42, PIDStart: 7})
				}
				m := &hostproto.Marker{ID: id, State: ms, StartError: "cwd /x does not exist"}
				v := verdict.ExecVerdict(id, testHost, verdict.ExecAnswer{First: m, Final: m})
				if !d.conclude(v) {
					t.Errorf("from %s, marker %s, confirmed %v: the journal refused %s", from, ms, confirmed, v.To)
					continue
				}
				got, err := journal.Get(id)
				if err != nil {
					t.Fatal(err)
				}
				if got.State != v.To || got.ReviewRequired != v.Review || verdict.LastEvidence(got.Evidence) != v.Note {
					t.Errorf("from %s, marker %s, confirmed %v: journal %s (review %v, evidence %q); want %s (review %v, %q)",
						from, ms, confirmed, got.State, got.ReviewRequired, verdict.LastEvidence(got.Evidence), v.To, v.Review, v.Note)
				}
				if v.To == markers.Failed && (!got.IsError || got.StartError != v.StartError) {
					t.Errorf("from %s, marker %s: failed record %+v; want is_error and start error %q", from, ms, got, v.StartError)
				}
			}
		}
	}
}
