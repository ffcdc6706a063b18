package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// noDate is the rule the reload test takes out and puts back.
const noDate = `[[rules]]
name = "no-date"
decision = "deny"
commands = ["date **"]`

// TestReloadUnderLoad: a serving bastion's config changes without a restart — by postern
// reload and by SIGHUP — while an agent keeps calling. A good config applies to the next
// call (a new actor's token works, a removed rule no longer denies, a rule put back denies
// again); a config that does not load, or that changes what only a restart applies, changes
// nothing and says why. Each change is in the reload log; every call of the load ran exactly
// once.
func TestReloadUnderLoad(t *testing.T) {
	f := startFleet(t, noDate)
	b := f.bastion
	ctx := testContext(t)
	agent := f.session(t, "agent", "run-reload")

	if x := mustCall(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "date -u"}); x.State != "rejected" || !strings.Contains(x.Cause, "no-date") {
		t.Fatalf("before the reload: date = %+v; want rejected by no-date", x)
	}

	// The load: distinct calls, each retried once (the retry must join, never run again),
	// across every reload below.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loadMu sync.Mutex
	var files []string
	// progress waits until the load has made n more calls, so each step below happens
	// while calls come and go.
	progress := func(n int) {
		t.Helper()
		loadMu.Lock()
		target := len(files) + n
		loadMu.Unlock()
		testutil.WaitFor(t, fmt.Sprintf("%d calls of the load", target), func() bool {
			loadMu.Lock()
			defer loadMu.Unlock()
			return len(files) >= target
		})
	}
	wg.Go(func() {
		cs := f.session(t, "agent", "run-load")
		// Bounded: at most maxLoad calls, paced, until the test says stop.
		const maxLoad = 150
		for i := 0; i < maxLoad; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			cmd, file := appendCommand(t, fmt.Sprintf("load-%d", i))
			args := map[string]any{"host": "h1", "command": cmd, "idempotency_key": fmt.Sprintf("load-%d", i)}
			first, err := callExecution(ctx, cs, "ssh_exec", args)
			if err != nil {
				t.Errorf("load call %d: %v", i, err)
				return
			}
			again, err := callExecution(ctx, cs, "ssh_exec", args)
			if err != nil || again.ExecutionID != first.ExecutionID {
				t.Errorf("load call %d retried = %+v, %v; want the same execution %s", i, again, err, first.ExecutionID)
				return
			}
			loadMu.Lock()
			files = append(files, file)
			loadMu.Unlock()
		}
	})

	progress(5)
	// 1. postern reload: a new actor, the rule gone.
	withoutRule(t, b)
	b.AddActor(t, harness.ActorSpec{Name: "ci"})
	out := string(postern(t, b, "reload"))
	for _, want := range []string{"actors added: ci", "rules: 1 before, 0 now"} {
		if !strings.Contains(out, want) {
			t.Errorf("postern reload printed %q; want %q", out, want)
		}
	}
	// Another command: the same call again would be answered with its rejection.
	if x := mustCall(t, ctx, agent, "ssh_exec", map[string]any{"host": "h1", "command": "date -R"}); x.State != "completed" {
		t.Errorf("after the reload: date = %+v; want completed (the rule is gone)", x)
	}
	ci := f.session(t, "ci", "run-ci")
	if x := mustCall(t, ctx, ci, "ssh_exec", map[string]any{"host": "h1", "command": "true"}); x.State != "completed" {
		t.Errorf("the new actor's call = %+v; want completed", x)
	}

	progress(5)
	// 2. A config that does not load changes nothing.
	good, err := os.ReadFile(b.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	writeConfig(t, b, string(good)+"\nmax_wiat = \"10s\"\n")
	res := operatorCLI(t, ctx, b, "reload")
	if res.code == 0 || !strings.Contains(res.stderr, "max_wiat") || !strings.Contains(res.stderr, "keeps its config") {
		t.Errorf("reload of a bad config = exit %d, %q; want refused, naming the key", res.code, res.stderr)
	}
	progress(5)
	// 3. Neither does one that changes what only a restart applies.
	writeConfig(t, b, strings.Replace(string(good), "reconcile_interval = \"1s\"", "reconcile_interval = \"2s\"", 1))
	res = operatorCLI(t, ctx, b, "reload")
	if res.code == 0 || !strings.Contains(res.stderr, "reconcile_interval") || !strings.Contains(res.stderr, "restart") {
		t.Errorf("reload of a restart-only change = exit %d, %q; want refused, naming reconcile_interval", res.code, res.stderr)
	}
	if x := mustCall(t, ctx, ci, "ssh_exec", map[string]any{"host": "h1", "command": "date"}); x.State != "completed" {
		t.Errorf("after the refused reloads: date = %+v; want completed (the config in force is unchanged)", x)
	}

	progress(5)
	// 4. SIGHUP: the rule back.
	writeConfig(t, b, string(good)+"\n"+noDate+"\n")
	reloads := filepath.Join(b.StateDir(), "reloads.jsonl")
	if err := syscall.Kill(b.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The log line is written before the settings apply: wait for status to show them.
	testutil.WaitFor(t, "the SIGHUP reload in force", func() bool {
		log := reloadLog(t, reloads)
		if len(log) != 2 {
			return false
		}
		var st api.Overview
		return json.Unmarshal(postern(t, b, "status", "--json"), &st) == nil && st.Config != nil && st.Config.Digest == log[1].Digest
	})
	if x := mustCall(t, ctx, ci, "ssh_exec", map[string]any{"host": "h1", "command": "date +%s"}); x.State != "rejected" || !strings.Contains(x.Cause, "no-date") {
		t.Errorf("after SIGHUP: date = %+v; want rejected by no-date again", x)
	}

	progress(5)
	close(stop)
	wg.Wait()
	if len(files) == 0 {
		t.Fatal("the load made no call")
	}
	for _, file := range files {
		ranOnce(t, file)
	}

	log := reloadLog(t, reloads)
	if !strings.HasPrefix(log[0].By, "operator:") || log[1].By != "signal:SIGHUP" || log[0].Digest == log[1].Digest || log[1].Previous != log[0].Digest {
		t.Errorf("reload log = %+v; want the operator's change, then SIGHUP's, each naming the digest before it", log)
	}
	var st api.Overview
	if err := json.Unmarshal(postern(t, b, "status", "--json"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Config == nil || st.Config.Digest != log[1].Digest {
		t.Errorf("status config = %+v; want the SIGHUP reload's digest %s", st.Config, log[1].Digest)
	}
	t.Logf("%d calls of the load across 2 reloads and 2 refused ones, each ran once", len(files))
}

// withoutRule takes noDate out of b's config.
func withoutRule(t *testing.T, b *harness.Bastion) {
	t.Helper()
	data, err := os.ReadFile(b.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), noDate) {
		t.Fatalf("config lacks the rule:\n%s", data)
	}
	writeConfig(t, b, strings.Replace(string(data), noDate, "", 1))
}

func writeConfig(t *testing.T, b *harness.Bastion, data string) {
	t.Helper()
	if err := os.WriteFile(b.ConfigPath, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// reloadLog reads the reload log's lines.
func reloadLog(t *testing.T, path string) []api.ConfigChange {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []api.ConfigChange
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var c api.ConfigChange
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("reload log line %q: %v", sc.Text(), err)
		}
		out = append(out, c)
	}
	return out
}
