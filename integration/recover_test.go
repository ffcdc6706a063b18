package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// The recovery drill (docs/operations.md, "Recovering from the hosts"): agents send commands
// to two hosts; a backup is taken; the calls go on; then the bastion dies and its journal is
// deleted, with commands in flight. The backup is restored, the hosts' markers recovered, the
// bastion started again, and every agent retries the call it lost. Every command's side
// effect (a line in a file) is there once — no duplicates — and is accounted for by an
// execution in the journal; what ran after the backup is recovered for review and never run
// again, retries included; the journal verifies.
func TestRecoverFromHostsAfterLosingTheJournal(t *testing.T) {
	h1 := harness.NewHostagent(t)
	b := harness.NewBastion(t, h1.ClientKey)
	h2 := harness.NewHostagent(t)
	h2.ClientKey = b.ClientKey // the bastion has one key: every host authorizes it
	testutil.WriteAuthorizedKeys(t, h2.AuthorizedKeysPath(), h2.ClientKey.AuthorizedLine())
	h1.Start(t)
	h2.Start(t)
	b.Enroll(t, "h1", h1)
	b.Enroll(t, "h2", h2)
	b.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s", tail(b.Logs(), 8000))
		}
	})
	ctx := testContext(t)
	effects := filepath.Join(t.TempDir(), "effects")

	// Each client sends distinct commands, one at a time, until a call fails (the bastion
	// died); that call is the one it retries later.
	const clients = 4
	lost := make([]map[string]any, clients)
	var done atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		cs := b.Connect(t, "agent", runHeader(fmt.Sprint("drill-", c)))
		wg.Go(func() {
			for i := 0; ; i++ {
				pause := "0.1"
				if i%3 == 2 {
					pause = "1.5" // in flight when the journal goes
				}
				tag := fmt.Sprintf("c%d-%03d", c, i)
				args := map[string]any{"host": fmt.Sprint("h", 1+(c+i)%2), "command": fmt.Sprintf("echo %s >> %s; sleep %s; echo %s", tag, effects, pause, tag), "wait_s": 30}
				if _, err := callExecution(ctx, cs, "ssh_exec", args); err != nil {
					lost[c] = args
					return
				}
				done.Add(1)
			}
		})
	}
	testutil.WaitFor(t, "calls before the backup", func() bool { return done.Load() >= 12 })
	backup := filepath.Join(t.TempDir(), "backup")
	postern(t, b, "journal", "backup", backup)
	atBackup := done.Load()
	testutil.WaitFor(t, "calls after the backup", func() bool { return done.Load() >= atBackup+12 })
	b.Kill(t)
	if err := os.RemoveAll(config.DefaultConfig(b.StateDir()).JournalDir()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("%d calls answered, %d before the backup; the journal deleted", done.Load(), atBackup)

	out := string(postern(t, b, "journal", "restore", backup))
	if !strings.Contains(out, "restored the journal into") || !strings.Contains(out, "postern recover --from-hosts") {
		t.Fatalf("restore: %s", out)
	}
	var listed api.Recovery
	if err := json.Unmarshal(postern(t, b, "recover", "--from-hosts", "--json"), &listed); err != nil {
		t.Fatal(err)
	}
	if listed.Confirmed || listed.Counts["journal"] == 0 {
		t.Fatalf("recover without --confirm: %+v; want executions to journal, nothing journaled", listed.Counts)
	}
	out = string(postern(t, b, "recover", "--from-hosts", "--confirm"))
	t.Logf("recover --confirm:\n%s", out)
	if !strings.Contains(out, "Journaled.") || strings.Contains(out, "FAILED") {
		t.Fatalf("recover --confirm: %s", out)
	}
	var again api.Recovery
	if err := json.Unmarshal(postern(t, b, "recover", "--from-hosts", "--confirm", "--json"), &again); err != nil {
		t.Fatal(err)
	}
	if again.Counts["journal"]+again.Counts["review"] != 0 {
		t.Fatalf("a second recovery journaled more: %+v", again.Counts)
	}

	b.Start(t)
	recoveredRetries := 0
	for c, args := range lost {
		if args == nil {
			continue
		}
		cs := b.Connect(t, "agent", runHeader(fmt.Sprint("drill-", c)))
		x := mustCall(t, ctx, cs, "ssh_exec", args)
		if rec := journaled(t, b, x.ExecutionID); rec.RecoveredFrom != "" {
			recoveredRetries++
			if !x.Replayed || x.State != "unknown" || !x.ReviewRequired {
				t.Errorf("a retry of a recovered call: %+v; want the recovered execution, replayed, awaiting review", x)
			}
		}
	}

	// Every command ran once, and every one that ran is an execution of the journal.
	var lines []string
	testutil.WaitFor(t, "the hosts' commands to end", func() bool {
		before := effectsLines(t, effects)
		time.Sleep(2 * time.Second) // longer than any command
		lines = effectsLines(t, effects)
		return len(lines) == len(before)
	})
	journalTags := map[string]string{}
	var page api.ExecutionPage
	if err := json.Unmarshal(postern(t, b, "executions", "list", "--limit", "10000", "--json"), &page); err != nil {
		t.Fatal(err)
	}
	tagOf := regexp.MustCompile(`echo (c\d-\d{3}) >>`)
	recovered := 0
	for _, rec := range page.Executions {
		if m := tagOf.FindStringSubmatch(strings.Join(rec.Command, " ")); m != nil {
			if other, dup := journalTags[m[1]]; dup && ranBoth(t, b, other, rec.ID) {
				t.Errorf("%s has two executions that ran: %s and %s", m[1], other, rec.ID)
			}
			journalTags[m[1]] = rec.ID
		}
		if rec.RecoveredFrom != "" {
			recovered++
			if rec.State != markers.Unknown || !rec.ReviewRequired || rec.Actor != "" {
				t.Errorf("recovered %s: %s, review %v, actor %q; want unknown awaiting review, no actor", rec.ID, rec.State, rec.ReviewRequired, rec.Actor)
			}
		}
	}
	seen := map[string]int{}
	for _, tag := range lines {
		seen[tag]++
		if seen[tag] == 2 {
			t.Errorf("%s ran twice", tag)
		}
		if journalTags[tag] == "" {
			t.Errorf("%s ran on a host and no execution of the journal accounts for it", tag)
		}
	}
	t.Logf("%d effects, each once; %d executions in the journal, %d recovered from the hosts, %d retries answered by a recovered execution",
		len(lines), len(page.Executions), recovered, recoveredRetries)
	if recovered == 0 {
		t.Fatal("nothing was recovered from the hosts; want the commands that ran after the backup")
	}
	if out := string(postern(t, b, "audit", "verify")); !strings.Contains(out, "PASS") {
		t.Fatalf("verify: %s", out)
	}
}

// effectsLines are the tags the commands wrote, in order.
func effectsLines(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

// ranBoth reports whether both executions ran (neither ended failed: never started).
func ranBoth(t *testing.T, b *harness.Bastion, a, c string) bool {
	return journaled(t, b, a).State != markers.Failed && journaled(t, b, c).State != markers.Failed
}
