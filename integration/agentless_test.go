package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
	"github.com/postern-dev/postern/markers"
)

// Hosts without the hostagent, against Debian's real sshd with a throwaway account that
// authorizes the bastion's key in its ~/.ssh/authorized_keys, enrolled with the real
// `postern hosts enroll --agentless [--marker-script]`, reached through a fault proxy.

// stockFleet is a bastion and one stock sshd host, "s1".
type stockFleet struct {
	bastion *harness.Bastion
	sshd    *harness.SSHD
	proxy   *testutil.FaultProxy
	account unixuser.User
}

// startStockFleet makes the account (shell: /bin/sh, or bash if bash is set), starts sshd
// and the bastion, and enrolls the host with the CLI; markerScript installs the wrapper.
func startStockFleet(t *testing.T, tag string, markerScript, bash bool) *stockFleet {
	t.Helper()
	acct := stockAccount(t, "postern-al-"+tag, bash)
	key := testutil.NewSSHKey(t)
	s := startStockSSHD(t, acct, key)
	f := &stockFleet{bastion: harness.NewBastion(t, key), sshd: s, proxy: testutil.StartFaultProxy(t, s.Addr), account: acct}
	args := []string{"hosts", "enroll", "s1", f.proxy.Addr(), "--agentless", "--account", acct.Name, "--yes"}
	if markerScript {
		args = append(args, "--marker-script")
	}
	out := string(postern(t, f.bastion, args...))
	want := "guarantee none"
	if markerScript {
		want = "guarantee marker script"
	}
	if !strings.Contains(out, want) {
		t.Fatalf("enroll printed %q; want %q", out, want)
	}
	f.bastion.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s\nsshd log:\n%s", f.bastion.Logs(), s.Logs())
		}
	})
	return f
}

// stockAccount makes the throwaway account name, with /bin/sh (or bash) as its shell.
func stockAccount(t *testing.T, name string, bash bool) unixuser.User {
	t.Helper()
	acct := unixuser.NewLogin(t, name)
	// useradd locks the password ("!"), and sshd without PAM refuses locked accounts even
	// for keys: "*" is no password, not a lock.
	usermod := []string{"--password", "*"}
	if bash {
		usermod = append(usermod, "--shell", "/bin/bash")
	}
	if out, err := exec.Command("usermod", append(usermod, acct.Name)...).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v\n%s", err, out)
	}
	return acct
}

// startStockSSHD starts Debian's sshd for acct, which authorizes the bastion's key.
func startStockSSHD(t *testing.T, acct unixuser.User, bastionKey testutil.SSHKey) *harness.SSHD {
	t.Helper()
	return harness.StartSSHDWith(t, harness.SSHDOptions{Account: acct.Name, Home: acct.Home, UID: acct.UID, GID: acct.GID, AuthorizedKeys: []string{bastionKey.AuthorizedLine()}})
}

// redispatchedAfterUnknown reports whether the execution's events show unknown → dispatched:
// sent again under the same id after its host proved it never started.
func redispatchedAfterUnknown(detail api.ExecutionDetail) bool {
	for _, e := range detail.Events {
		if e.From == markers.Unknown && e.To == markers.Dispatched {
			return true
		}
	}
	return false
}

// path is a file in the account's home.
func (f *stockFleet) path(name string) string { return filepath.Join(f.account.Home, name) }

// gate is a command that waits for ~/gate (asAccount(t, "gate", "") opens it), then appends to its
// effects file. It prints nothing after the gate: output to a connection that is gone would
// end it with SIGPIPE, which is stock sshd's behaviour, not what these tests are about.
func (f *stockFleet) gate() (cmd, effects string) {
	gate := f.path("gate")
	effects = f.path("effects")
	return fmt.Sprintf("echo started; for i in $(seq 1200); do [ -e %s ] && break; sleep 0.05; done; echo x >> %s", gate, effects), effects
}

// asAccount writes a file the account owns.
func (f *stockFleet) asAccount(t *testing.T, name, content string) {
	t.Helper()
	p := f.path(name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, f.account.UID, f.account.GID); err != nil {
		t.Fatal(err)
	}
}

// hostsGuarantee is the GUARANTEE column of `postern hosts list` for s1.
func hostsGuarantee(t *testing.T, b *harness.Bastion) string {
	t.Helper()
	var res api.HostsResult
	if err := json.Unmarshal(postern(t, b, "hosts", "list", "--json"), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Hosts) != 1 {
		t.Fatalf("hosts list: %+v", res)
	}
	return string(res.Hosts[0].Guarantee)
}

// TestStockHostOnceThroughTheJournal: on a level-none host the journal still gives the
// execution identity: a retry with the same idempotency key from another run joins the
// first execution, the command runs once, sees POSTERN_EXECUTION_ID (exported at the head
// of the line: Debian's sshd accepts only LANG and LC_*), and hostile quoting arrives intact.
func TestStockHostOnceThroughTheJournal(t *testing.T) {
	f := startStockFleet(t, "once", false, false)
	ctx := testContext(t)
	if g := hostsGuarantee(t, f.bastion); g != "none" {
		t.Fatalf("hosts list guarantee %q; want none", g)
	}
	effects := f.path("effects")
	cmd := `echo "$POSTERN_EXECUTION_ID" >> ` + effects + `; printf '%s|' "it's" "$(echo sub)" 'a"b'; echo; echo 'two
lines'`
	args := map[string]any{"host": "s1", "command": cmd, "idempotency_key": "deploy-1", "env": map[string]any{"LANG": "C.UTF-8"}}
	first := mustCall(t, ctx, f.session(t, "run-a"), "ssh_exec", args)
	if first.State != "completed" || first.Stdout != "it's|sub|a\"b|\ntwo\nlines\n" {
		t.Fatalf("first call = %+v", first)
	}
	retry := mustCall(t, ctx, f.session(t, "run-b"), "ssh_exec", args)
	if retry.ExecutionID != first.ExecutionID || !retry.Replayed {
		t.Fatalf("retry = %+v; want %s replayed", retry, first.ExecutionID)
	}
	data, err := os.ReadFile(effects)
	if err != nil || string(data) != first.ExecutionID+"\n" {
		t.Fatalf("effects %q (%v); want one run that saw %s", data, err, first.ExecutionID)
	}
	// What the wrapper cannot honour is refused before anything is journaled.
	if msg := mustRefuse(t, ctx, f.session(t, "run-a"), "ssh_exec", map[string]any{"host": "s1", "command": "true", "operation_key": "m:1"}); !strings.Contains(msg, "operation_key needs the hostagent") {
		t.Fatalf("operation_key on a stock host: %s", msg)
	}
}

func (f *stockFleet) session(t *testing.T, run string) *mcp.ClientSession {
	t.Helper()
	return f.bastion.Connect(t, "agent", runHeader(run))
}

// startGated starts the gated command in the background and returns its execution id once
// the host confirmed the start (journaled running), and the call's outcome.
func (f *stockFleet) startGated(t *testing.T, ctx context.Context, cmd string) (string, chan callOutcome) {
	t.Helper()
	done := make(chan callOutcome, 1)
	go func() {
		x, err := callExecution(ctx, f.session(t, "run-gated"), "ssh_exec", map[string]any{"host": "s1", "command": cmd, "wait_s": 60})
		done <- callOutcome{x, err}
	}()
	var id string
	testutil.WaitFor(t, "the command to be journaled running", func() bool {
		for _, x := range listOf(t, ctx, f.session(t, "")) {
			if x.Command == cmd && x.State == "running" {
				id = x.ExecutionID
			}
		}
		return id != ""
	})
	return id, done
}

// TestStockHostLevelNoneCutAfterStart: a TCP cut after the command started leaves the
// execution unknown, review required; it is not sent again — not by the driver, not by a
// retry, not after a bastion restart — and investigate says what cannot be known. The
// operator's review settles it.
func TestStockHostLevelNoneCutAfterStart(t *testing.T) {
	f := startStockFleet(t, "none", false, false)
	ctx := testContext(t)
	cmd, effects := f.gate()
	id, done := f.startGated(t, ctx, cmd)
	f.proxy.Cut()
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.x.ExecutionID != id || got.x.State != "unknown" || !got.x.ReviewRequired {
		t.Fatalf("call = %+v; want %s unknown, review required", got.x, id)
	}
	f.asAccount(t, "gate", "")
	testutil.WaitFor(t, "the command to finish on the host", func() bool { return countLines(t, effects) == 1 })

	f.bastion.Kill(t)
	f.bastion.Start(t)
	retry, err := callExecution(ctx, f.session(t, "run-gated"), "ssh_exec", map[string]any{"host": "s1", "command": cmd, "wait_s": 5})
	if err != nil || retry.ExecutionID != id || retry.State != "unknown" || !retry.ReviewRequired {
		t.Fatalf("retry after restart = %+v (%v); want %s unknown, review required", retry, err, id)
	}
	time.Sleep(2 * time.Second) // two reconcile ticks
	rec := journaled(t, f.bastion, id)
	if rec.State != markers.Unknown || !rec.ReviewRequired || !hasEvidence(rec, "guarantee level none") {
		t.Fatalf("journal = %s review=%v %q", rec.State, rec.ReviewRequired, rec.Evidence)
	}
	if n := countLines(t, effects); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	inv := investigate(t, f.bastion, id)
	if !strings.Contains(inv.Answers[2], "cannot be known") || !strings.Contains(inv.Answers[2], "guarantee level none") {
		t.Errorf("investigate answer 3 = %q; want it to say what cannot be known", inv.Answers[2])
	}
	if a := inv.Answers[4]; !strings.Contains(a, "nothing can be asked of s1") || strings.Contains(a, "reconciled with the host") {
		t.Errorf("investigate answer 5 = %q; want the retry's join to say nothing could be asked of the host", a)
	}
	postern(t, f.bastion, "review", id, "--outcome", "completed", "--note", "effects file has the line")
	if rec := journaled(t, f.bastion, id); rec.State != markers.Completed {
		t.Fatalf("after review: %s", rec.State)
	}
}

// TestStockHostMarkerScriptCutAfterStart: a TCP cut after the command started is resolved by
// reading the marker: the bastion watches it while the command runs, and journals the exit
// status it records, with one effect.
func TestStockHostMarkerScriptCutAfterStart(t *testing.T) {
	f := startStockFleet(t, "mscut", true, false)
	ctx := testContext(t)
	if g := hostsGuarantee(t, f.bastion); g != "marker_script" {
		t.Fatalf("hosts list guarantee %q; want marker_script", g)
	}
	cmd, effects := f.gate()
	id, done := f.startGated(t, ctx, cmd)
	f.proxy.Cut()
	testutil.WaitFor(t, "the bastion to read the marker", func() bool {
		return hasEvidence(journaled(t, f.bastion, id), "still running")
	})
	f.asAccount(t, "gate", "")
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.x.ExecutionID != id || got.x.State != "completed" || got.x.ExitCode == nil || *got.x.ExitCode != 0 {
		t.Fatalf("call = %+v; want %s completed, exit 0", got.x, id)
	}
	if n := countLines(t, effects); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	if rec := journaled(t, f.bastion, id); !hasEvidence(rec, "marker script on s1 recorded exit status 0") {
		t.Errorf("evidence %q", rec.Evidence)
	}
	if inv := investigate(t, f.bastion, id); !strings.Contains(inv.Answers[2], "the marker script on s1, asked now, has marker "+id+": exited, exit 0") {
		t.Errorf("investigate answer 3 = %q; want the marker read now", inv.Answers[2])
	}
}

// TestStockHostMarkerScriptCutBeforeStart: the exec reaches sshd, but the connection is cut
// and the account's shell dies before the wrapper ran (held in ~/.bashrc, then killed): the
// bastion finds no marker and dispatches the same execution id again — one effect.
func TestStockHostMarkerScriptCutBeforeStart(t *testing.T) {
	f := startStockFleet(t, "msbefore", true, true)
	ctx := testContext(t)
	cs := f.session(t, "run-before")
	if x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "s1", "command": "true"}); x.State != "completed" {
		t.Fatalf("warm-up = %+v", x)
	}
	// Debian's bash reads ~/.bashrc for commands over ssh: while ~/hold exists, the next
	// shell records its pid and waits there, before it runs anything of Postern's.
	f.asAccount(t, ".bashrc", "if [ -e ~/hold ]; then rm -f ~/hold; echo $$ > ~/held; exec sleep 60; fi\n")
	f.asAccount(t, "hold", "")
	cmd := "echo x >> " + f.path("effects")
	done := make(chan callOutcome, 1)
	go func() {
		x, err := callExecution(ctx, cs, "ssh_exec", map[string]any{"host": "s1", "command": cmd, "wait_s": 60})
		done <- callOutcome{x, err}
	}()
	var pid int
	testutil.WaitFor(t, "the shell to hold before the wrapper", func() bool {
		data, err := os.ReadFile(f.path("held"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	f.proxy.Cut()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.x.State != "completed" {
		t.Fatalf("call = %+v; want completed", got.x)
	}
	if n := countLines(t, f.path("effects")); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}
	detail := operatorDetail(t, f.bastion, got.x.ExecutionID)
	if !redispatchedAfterUnknown(detail) || !hasEvidence(detail.Record, "no marker") {
		t.Errorf("no re-dispatch after a missing marker: events %+v evidence %q", detail.Events, detail.Record.Evidence)
	}
}

// TestStockHostSameIDByHand: the wrapper, run by hand with OpenSSH twice under one id, runs
// the command once; the second run prints the recorded outcome.
func TestStockHostSameIDByHand(t *testing.T) {
	f := startStockFleet(t, "byhand", true, false)
	id, err := markers.NewExecutionID(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	remote := "~/.postern/run exec " + id + " '' 0 'echo x >> ~/effects; exit 3'"
	ssh := func() (string, int) {
		cmd := exec.Command("ssh", append(testutil.OpenSSHArgs(f.sshd.KnownHosts, f.sshd.Identity, f.sshd.Port), f.account.Name+"@127.0.0.1", remote)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stderr.String(), code
	}
	first, code := ssh()
	if code != 3 || !strings.Contains(first, agentless.Prefix+"started id="+id) {
		t.Fatalf("first: exit %d, stderr %q", code, first)
	}
	second, code := ssh()
	if code != 0 || !strings.Contains(second, agentless.Prefix+"duplicate id="+id+" state=exited exit=3") {
		t.Fatalf("second: exit %d, stderr %q", code, second)
	}
	if n := countLines(t, f.path("effects")); n != 1 {
		t.Fatalf("command ran %d times; want 1", n)
	}

	// postern doctor checks the wrapper too, and tells a changed one to be re-enrolled.
	if out := string(postern(t, f.bastion, "doctor")); !strings.Contains(out, "s1 ("+f.proxy.Addr()+"): reachable, pinned host key verified, stock sshd with the marker script (digest verified)") {
		t.Errorf("doctor:\n%s", out)
	}
	f.asAccount(t, ".postern/run", agentless.Script+"# edited\n")
	out, _ := exec.Command(harness.Binary(t, "postern"), "doctor", "--config", f.bastion.ConfigPath).CombinedOutput()
	if !strings.Contains(string(out), "not the one enrolled") || !strings.Contains(string(out), "--marker-script") {
		t.Errorf("doctor with an edited wrapper:\n%s", out)
	}
}

// TestStockHostChangedKeyIsRefused: a host that presents another key than the enrolled one
// is sent nothing: the execution fails before the dispatch boundary.
func TestStockHostChangedKeyIsRefused(t *testing.T) {
	f := startStockFleet(t, "rekey", false, false)
	ctx := testContext(t)
	other := startStockSSHD(t, f.account, f.bastion.ClientKey)
	inv := config.DefaultConfig(f.bastion.StateDir()).InventoryPath()
	if err := fleet.Enroll(inv, fleet.Host{Name: "s1", Addr: other.Addr, Account: f.account.Name, HostKey: f.sshd.HostKey, Guarantee: fleet.GuaranteeNone}); err != nil {
		t.Fatal(err)
	}
	x := mustCall(t, ctx, f.session(t, "run-rekey"), "ssh_exec", map[string]any{"host": "s1", "command": "echo x >> " + f.path("effects")})
	if x.State != "failed" || !strings.Contains(x.Cause, "another host key than the one enrolled") {
		t.Fatalf("call = %+v; want failed for the host key", x)
	}
	if n := countLines(t, f.path("effects")); n != 0 {
		t.Fatalf("command ran %d times; want 0", n)
	}
}

func countLines(t *testing.T, file string) int { t.Helper(); return effects(t, file) }

// TestStockHostEnrollNeedsTheKey: --marker-script without the bastion's key in the account's
// authorized_keys enrolls nothing and shows the line to add.
func TestStockHostEnrollNeedsTheKey(t *testing.T) {
	acct := stockAccount(t, "postern-al-nokey", false)
	s := startStockSSHD(t, acct, testutil.NewSSHKey(t)) // authorizes another key
	b := harness.NewBastion(t, testutil.NewSSHKey(t))
	cmd := exec.Command(harness.Binary(t, "postern"), "hosts", "enroll", "s1", s.Addr, "--agentless", "--marker-script", "--account", acct.Name, "--yes", "--config", b.ConfigPath)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), b.ClientKey.AuthorizedLine()) || !strings.Contains(string(out), "not enrolled") {
		t.Fatalf("enroll without the key: %v\n%s", err, out)
	}
	inv, err := fleet.OpenInventory(config.DefaultConfig(b.StateDir()).InventoryPath())
	if err != nil {
		t.Fatal(err)
	}
	if hosts, _ := inv.Hosts(); len(hosts) != 0 {
		t.Fatalf("enrolled %+v", hosts)
	}
}

// TestStockHostForgedNotRunAnswer: a start-up file of the account (which any command of it
// can write) prints a forged "refused" answer before Postern's line runs. The command runs
// anyway; the journal must never say it did not run — on a marker-script host the marker
// shows it started, at level none nothing can confirm the answer — so a retry under the same
// idempotency_key joins instead of running it a second time.
func TestStockHostForgedNotRunAnswer(t *testing.T) {
	for _, tc := range []struct {
		name         string
		markerScript bool
		want         string
	}{
		{"marker script", true, "completed"},
		{"level none", false, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag := "fgn"
			if tc.markerScript {
				tag = "fgm"
			}
			f := startStockFleet(t, tag, tc.markerScript, true)
			ctx := testContext(t)
			f.asAccount(t, ".bashrc", "printf '%s\\n' 'postern-run:1:refused reason=cwd' >&2\n")
			effects := f.path("effects")
			args := map[string]any{"host": "s1", "command": "echo x >> " + effects, "idempotency_key": "forged-1", "wait_s": 20}
			first := mustCall(t, ctx, f.session(t, "run-a"), "ssh_exec", args)
			if first.State != tc.want {
				t.Fatalf("first call = %+v; want %s, never failed (did not run)", first, tc.want)
			}
			retry := mustCall(t, ctx, f.session(t, "run-b"), "ssh_exec", args)
			if retry.ExecutionID != first.ExecutionID {
				t.Errorf("retry = %s; want it to join %s", retry.ExecutionID, first.ExecutionID)
			}
			if n := countLines(t, effects); n != 1 {
				t.Fatalf("the command ran %d times; want 1", n)
			}
		})
	}
}
