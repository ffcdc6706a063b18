package journaltest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

// Capacity figures come from executions journaled as the bastion journals `ssh_exec true`
// (the fields, evidence and events of a real one, taken from an export of
// integration's fleet): a record of about 1.1 KB, six events (create, authorized,
// dispatched, running, completed with its result, delivered) of 1.3–1.9 KB each.

const fingerprintHex = "2663c134fa57d41f94f27195eeb60cc0a1f448ac2bc85e5428c8fc60fcec58e3"

// bastionEvidence is what the policy ladder writes for an authorized ssh_exec.
var bastionEvidence = []string{"actor resolved: agent", "actor agent: tool ssh_exec allowed", "actor agent: host h1 allowed",
	"command: 1 simple command(s) of plain literal words", "class: remote_command (default for ssh_exec)",
	"deny rules: none matched", "approval: none required", "authorized", "policy: authorized (default for ssh_exec)"}

// Execution journals execution i of agent run run as the bastion journals `ssh_exec true`,
// its create event's call naming the run as new when newRun.
func Execution(ctx context.Context, j markers.JournalStore, i int, run string, newRun bool) error {
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		return err
	}
	rec := &markers.Record{
		ID: id, Actor: "token:agent", PolicyActor: "agent", IntentScope: run,
		Fingerprint: fmt.Sprintf("hmac-sha256:%s%08d", fingerprintHex[:56], i), Tool: "ssh_exec", Channel: "ssh",
		Target:  "host:h1 ssh-ed25519 SHA256:IZemqlx26Y6z6/xOev1QihSHl4hFRCZ3UmCX3PBB5XQ",
		Account: "root", Command: []string{"sh", "-c", "true"}, Class: "remote_command", Decision: "authorized", Host: "h1",
		Evidence: bastionEvidence,
	}
	call := &markers.Call{Transport: "http", RequestID: fmt.Sprint(2 * i), Run: run, Match: "new"}
	runID := run[len("run:"):]
	identity := &markers.Run{Actor: "token:agent", Scope: run, FirstSeen: time.Now().UTC(), Transport: "http", RunID: runID, Token: "agent"}
	if newRun {
		call.NewRun = identity
	} else {
		call.RunIdentity = identity
	}
	if _, err := j.CreateAdvancedFor(ctx, rec, []markers.State{markers.Authorized, markers.Dispatched}, "dispatching to h1", call); err != nil {
		return err
	}
	if _, err := j.TransitionWith(ctx, id, markers.Dispatched, markers.Running, "host marker started", markers.NoSync, nil); err != nil {
		return err
	}
	result := []byte(`{"stdout":null,"stdout_offset":0,"stderr":null,"stderr_offset":0}`)
	if _, err := j.AdvanceWithResult(ctx, id, markers.Running, []markers.State{markers.Completed}, "exit status 0", result, func(r *markers.Record) error {
		zero := 0
		r.ExitCode, r.ResultRef = &zero, "journal:"+id
		r.Output = markers.Output{StdoutSHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", StderrSHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}
		r.Evidence = append(r.Evidence, "exit status 0")
		return nil
	}); err != nil {
		return err
	}
	delivered := &markers.Call{Transport: "http", RequestID: fmt.Sprint(2 * i), Run: run, Match: "delivered"}
	_, err = j.UpdateFor(ctx, id, "result delivered", delivered, markers.NoSync, func(r *markers.Record) error {
		at := time.Now().UTC()
		r.ResultDeliveredAt = &at
		return nil
	})
	return err
}

// Executions journals n such executions from writers concurrent writers, ten to an agent
// run.
func Executions(tb testing.TB, j markers.JournalStore, n, writers int) {
	tb.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := Execution(ctx, j, i, fmt.Sprintf("run:cap-%d", i/10), i%10 == 0); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
}

// Joined journals a call that replayed execution id (a keyed retry): one joined event.
func Joined(ctx context.Context, j markers.JournalStore, id string, i int) error {
	return j.Joined(ctx, id, &markers.Call{Transport: "http", RequestID: fmt.Sprint(i), Run: "run:cap-retry", Match: "replay", Replayed: true,
		RunIdentity: &markers.Run{Actor: "token:agent", Scope: "run:cap-retry", Transport: "http", RunID: "cap-retry", Token: "agent"}})
}

// Logical is the bytes of every key and value a journal holds (what both backends store,
// before Pebble's compression or etcd's per-revision overhead), by key family (the first
// byte of the key: 'e' events, 'r' records, …), and its event count.
func Logical(tb testing.TB, j markers.JournalStore) (total int64, byFamily map[byte]int64, events int) {
	tb.Helper()
	byFamily = map[byte]int64{}
	for kv, err := range j.(markers.RawJournal).Raw() {
		if err != nil {
			tb.Fatal(err)
		}
		n := int64(len(kv.Key) + len(kv.Value))
		total += n
		byFamily[kv.Key[0]] += n
		if kv.Key[0] == 'e' {
			events++
		}
	}
	return total, byFamily, events
}
