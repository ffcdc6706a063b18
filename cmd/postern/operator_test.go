package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/markers"
)

func TestMain(m *testing.M) {
	code := m.Run()
	harness.CleanupBinaries()
	os.Exit(code)
}

// cliResult is what one in-process run of the CLI printed and returned.
type cliResult struct {
	stdout, stderr string
	err            error
}

// runCLI runs `postern args...` in this process with stdin.
func runCLI(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, strings.NewReader(stdin), &stdout, &stderr)
	return cliResult{stdout.String(), stderr.String(), err}
}

// mustRun runs the CLI and fails the test if it returns an error.
func mustRun(t *testing.T, args ...string) cliResult {
	t.Helper()
	res := runCLI(t, "", args...)
	if res.err != nil {
		t.Fatalf("postern %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.err, res.stdout, res.stderr)
	}
	return res
}

// decodeJSON decodes a command's --json output into v.
func decodeJSON(t *testing.T, res cliResult, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(res.stdout), v); err != nil {
		t.Fatalf("decode JSON output: %v\n%s", err, res.stdout)
	}
}

// testbed is a running `postern serve` with one enrolled hostagent ("h1") and one execution
// run through it by the go-sdk MCP client.
type testbed struct {
	bastion *harness.Bastion
	host    *harness.Hostagent
	exec    api.Execution
}

func startFleet(t *testing.T) *testbed {
	t.Helper()
	h := harness.StartHostagent(t)
	b := harness.NewBastion(t, h.ClientKey)
	b.Enroll(t, "h1", h)
	b.Start(t)
	f := &testbed{bastion: b, host: h}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := b.Connect(t, "agent", nil)
	res, err := harness.CallTool(ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo hello; echo oops >&2"}, &f.exec)
	if err != nil {
		t.Fatal(err)
	}
	if f.exec.State != "completed" || f.exec.Stdout != "hello\n" {
		t.Fatalf("ssh_exec: %+v (%s); want completed with output\n%s", f.exec, harness.ResultText(res), b.Logs())
	}
	// Delivery is journaled after the result is written to the transport.
	testutil.WaitFor(t, "the result's delivery in the journal", func() bool {
		d := f.showJSON(t)
		return d.Record.ResultDeliveredAt != nil
	})
	return f
}

// at adds the flag that locates the fleet's bastion to args.
func (f *testbed) at(args ...string) []string {
	return append(args, "--state-dir", f.bastion.StateDir())
}

func (f *testbed) showJSON(t *testing.T) api.ExecutionDetail {
	t.Helper()
	var d api.ExecutionDetail
	decodeJSON(t, mustRun(t, f.at("executions", "show", f.exec.ExecutionID, "--json")...), &d)
	return d
}

// theStory is the lifecycle of an execution that ran to completion.
var theStory = []markers.State{markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running, markers.Completed}

var eventLine = regexp.MustCompile(`^\s+\d+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\s+(.+?)(\s{2,}|$)`)

func TestOperatorCommands(t *testing.T) {
	f := startFleet(t)
	id := f.exec.ExecutionID

	t.Run("executions list --json", func(t *testing.T) {
		var page api.ExecutionPage
		decodeJSON(t, mustRun(t, f.at("executions", "list", "--json")...), &page)
		if len(page.Executions) != 1 || page.Executions[0].ID != id {
			t.Fatalf("executions = %+v; want just %s", page.Executions, id)
		}
		if r := page.Executions[0]; r.State != markers.Completed || r.Actor != "token:agent" || r.Host != "h1" {
			t.Fatalf("record = %+v; want completed, actor token:agent, host h1", r)
		}
	})

	t.Run("executions list", func(t *testing.T) {
		out := mustRun(t, f.at("executions", "list")...).stdout
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("got %d lines; want a header and one row:\n%s", len(lines), out)
		}
		if fields := strings.Fields(lines[0]); !slices.Equal(fields, []string{"ID", "ACCEPTED", "STATE", "ACTOR", "HOST", "EXIT", "COMMAND"}) {
			t.Fatalf("header = %q", lines[0])
		}
		for _, want := range []string{id, " completed ", " token:agent ", " h1 ", " 0 ", "echo hello; echo oops >&2"} {
			if !strings.Contains(lines[1], want) {
				t.Errorf("row %q lacks %q", lines[1], want)
			}
		}
	})

	t.Run("executions list filters", func(t *testing.T) {
		tests := []struct {
			name  string
			flags []string
			want  int
		}{
			{"host", []string{"--host", "h1"}, 1},
			{"other host", []string{"--host", "h2"}, 0},
			{"state", []string{"--state", "completed"}, 1},
			{"other state", []string{"--state", "running"}, 0},
			{"actor", []string{"--actor", "token:agent"}, 1},
			{"actor by bare name", []string{"--actor", "agent"}, 0},
			{"other actor", []string{"--actor", "token:other"}, 0},
			{"since before", []string{"--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)}, 1},
			{"since after", []string{"--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, 0},
			{"limit", []string{"--limit", "1"}, 1},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var page api.ExecutionPage
				decodeJSON(t, mustRun(t, f.at(append([]string{"executions", "list", "--json"}, tt.flags...)...)...), &page)
				if got := len(page.Executions); got != tt.want {
					t.Fatalf("got %d executions; want %d", got, tt.want)
				}
			})
		}
	})

	t.Run("executions list usage errors", func(t *testing.T) {
		tests := []struct {
			name  string
			flags []string
		}{
			{"unknown state", []string{"--state", "exited"}},
			{"since not RFC 3339", []string{"--since", "yesterday"}},
			{"limit zero", []string{"--limit", "0"}},
			{"positional", []string{"extra"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				res := runCLI(t, "", f.at(append([]string{"executions", "list"}, tt.flags...)...)...)
				if !errors.Is(res.err, cli.ErrUsage) || res.stderr == "" {
					t.Fatalf("err = %v, stderr %q; want a usage error that says what is wrong", res.err, res.stderr)
				}
			})
		}
	})

	t.Run("executions show --json", func(t *testing.T) {
		d := f.showJSON(t)
		var story []markers.State
		var last time.Time
		for _, ev := range d.Events {
			if ev.At.Before(last) {
				t.Errorf("event %d at %v is before the one before it (%v)", ev.Seq, ev.At, last)
			}
			last = ev.At
			if ev.Kind != markers.KindUpdate {
				story = append(story, ev.To)
			}
		}
		if !slices.Equal(story, theStory) {
			t.Fatalf("story = %v; want %v", story, theStory)
		}
		if d.Output == nil || d.Output.Stdout != "hello\n" || d.Output.Stderr != "oops\n" {
			t.Fatalf("output = %+v; want hello and oops", d.Output)
		}
	})

	t.Run("executions show", func(t *testing.T) {
		out := mustRun(t, f.at("executions", "show", id)...).stdout
		var steps []string
		for line := range strings.SplitSeq(out, "\n") {
			if m := eventLine.FindStringSubmatch(line); m != nil {
				steps = append(steps, m[1])
			}
		}
		want := []string{"→ accepted", "accepted → authorized", "authorized → dispatched", "dispatched → running", "running → completed"}
		var transitions []string
		for _, s := range steps {
			if !strings.HasSuffix(s, "(update)") {
				transitions = append(transitions, s)
			}
		}
		if !slices.Equal(transitions, want) {
			t.Fatalf("timestamped steps = %q; want %q\n%s", transitions, want, out)
		}
		for _, want := range []string{"execution  " + id, "state  completed\n", "outcome  exit 0", "command  echo hello; echo oops >&2",
			"stdout:\nhello\n", "stderr:\noops\n"} {
			if !strings.Contains(collapseSpaces(out), want) {
				t.Errorf("show lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("executions show unknown", func(t *testing.T) {
		missing, err := markers.NewExecutionID(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		res := runCLI(t, "", f.at("executions", "show", missing)...)
		var ae *apiError
		if !errors.As(res.err, &ae) || ae.Code != api.CodeNotFound {
			t.Fatalf("err = %v; want the API's not_found", res.err)
		}
		// It says what happened and what to do, in the operator's terms, not a package's.
		if msg := res.err.Error(); !strings.Contains(msg, "the journal has no execution "+missing) ||
			!strings.Contains(msg, "postern executions list") || strings.Contains(msg, "markers:") {
			t.Errorf("show unknown: %q; want the id is unknown and what to do", msg)
		}
		if res := runCLI(t, "", f.at("investigate", missing)...); res.err == nil || !strings.Contains(res.err.Error(), "the journal has no execution") {
			t.Errorf("investigate unknown: %v; want the id is unknown", res.err)
		}
		if res := runCLI(t, "", f.at("executions", "show", "nope")...); !errors.Is(res.err, cli.ErrUsage) {
			t.Fatalf("show nope: err = %v; want a usage error", res.err)
		}
	})

	t.Run("hosts list", func(t *testing.T) {
		var hosts api.HostsResult
		decodeJSON(t, mustRun(t, f.at("hosts", "list", "--json")...), &hosts)
		if len(hosts.Hosts) != 1 || hosts.Hosts[0].Name != "h1" || hosts.Hosts[0].Addr != f.host.Addr || !hosts.Hosts[0].Connected {
			t.Fatalf("hosts = %+v; want h1 at %s, connected", hosts.Hosts, f.host.Addr)
		}
		res := mustRun(t, f.at("hosts", "list")...)
		row := strings.Split(strings.TrimSpace(res.stdout), "\n")[1]
		for _, want := range []string{"h1", f.host.Addr, f.host.Account, hosts.Hosts[0].HostKey, "yes"} {
			if !strings.Contains(row, want) {
				t.Errorf("row %q lacks %q", row, want)
			}
		}
		if res.stderr != "" {
			t.Errorf("stderr = %q; want nothing while the daemon runs", res.stderr)
		}
	})

	t.Run("found by the variables, as by the flags", func(t *testing.T) {
		noMachine(t)
		t.Setenv(envStateDir, f.bastion.StateDir())
		var page api.ExecutionPage
		decodeJSON(t, mustRun(t, "executions", "list", "--json"), &page)
		if len(page.Executions) != 1 || page.Executions[0].ID != id {
			t.Fatalf("executions = %+v; want %s", page.Executions, id)
		}
		t.Setenv(envStateDir, "")
		t.Setenv(envConfig, f.bastion.ConfigPath)
		res := mustRun(t, "doctor")
		for _, want := range []string{"valid: config " + f.bastion.ConfigPath + ", chosen by POSTERN_CONFIG", "ok      daemon"} {
			if !strings.Contains(res.stdout, want) {
				t.Errorf("doctor lacks %q:\n%s", want, res.stdout)
			}
		}
	})

	t.Run("markers", func(t *testing.T) {
		var page api.MarkerPage
		decodeJSON(t, mustRun(t, f.at("markers", "--host", "h1", "list", "--json")...), &page)
		if len(page.Markers) != 1 || page.Markers[0].ID != id || page.Markers[0].State != hostproto.MarkerExited {
			t.Fatalf("markers = %+v; want %s exited", page.Markers, id)
		}
		out := mustRun(t, f.at("markers", "--host", "h1", "list")...).stdout
		if !strings.Contains(out, id) || !strings.Contains(out, "exited") {
			t.Fatalf("markers list lacks %s exited:\n%s", id, out)
		}
		var rec markers.Record
		// --host after the subcommand works too.
		decodeJSON(t, mustRun(t, f.at("markers", "show", id, "--host", "h1", "--json")...), &rec)
		if rec.ID != id || rec.ExitCode == nil || *rec.ExitCode != 0 {
			t.Fatalf("marker = %+v; want %s with exit 0", rec, id)
		}
		out = mustRun(t, f.at("markers", "--host", "h1", "show", id)...).stdout
		if c := collapseSpaces(out); !strings.Contains(c, "marker  "+id) || !strings.Contains(c, "outcome  exit 0") {
			t.Fatalf("markers show:\n%s", out)
		}
		if res := runCLI(t, "", f.at("markers", "list")...); !errors.Is(res.err, cli.ErrUsage) {
			t.Fatalf("markers list without --host: err = %v; want a usage error", res.err)
		}
		res := runCLI(t, "", f.at("markers", "--host", "nosuch", "list")...)
		var ae *apiError
		if !errors.As(res.err, &ae) || ae.Code != api.CodeUnknownHost {
			t.Fatalf("unknown host: err = %v; want the API's unknown_host", res.err)
		}
	})

	export := filepath.Join(t.TempDir(), "journal.jsonl")
	t.Run("audit export and verify", func(t *testing.T) {
		res := mustRun(t, f.at("audit", "export", "--out", export)...)
		data, err := os.ReadFile(export)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), id) || !strings.Contains(res.stderr, "exported the journal to") {
			t.Fatalf("export lacks %s (stderr %q)", id, res.stderr)
		}
		stdoutExport := mustRun(t, f.at("audit", "export")...).stdout
		if !strings.HasPrefix(stdoutExport, `{"type":"event"`) {
			t.Fatalf("export to stdout starts %q", cli.Truncate(stdoutExport, 40))
		}
		tests := []struct {
			name string
			args []string
		}{
			{"file", []string{"--file", export}},
			{"file, sealed", []string{"--file", export, "--require-sealed"}},
			{"the daemon's export", nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				out := mustRun(t, f.at(append([]string{"audit", "verify"}, tt.args...)...)...).stdout
				if !strings.Contains(out, ": PASS") || !strings.Contains(out, "validated events 1..") {
					t.Fatalf("verify: %s; want PASS", out)
				}
				var rep markers.Report
				decodeJSON(t, mustRun(t, f.at(append([]string{"audit", "verify", "--json"}, tt.args...)...)...), &rep)
				if !rep.OK || rep.Events < uint64(len(theStory)) {
					t.Fatalf("report = %+v; want OK with the story's events", rep)
				}
			})
		}
	})

	t.Run("audit verify a tampered export", func(t *testing.T) {
		data, err := os.ReadFile(export)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitAfter(string(data), "\n")
		// Line 2 is the second event: its record names the actor.
		if !strings.Contains(lines[1], `"actor":"token:agent"`) {
			t.Fatalf("line 2 is %q; want an event naming the actor", lines[1])
		}
		lines[1] = strings.Replace(lines[1], `"actor":"token:agent"`, `"actor":"token:agenT"`, 1)
		tampered := filepath.Join(t.TempDir(), "tampered.jsonl")
		if err := os.WriteFile(tampered, []byte(strings.Join(lines, "")), 0o600); err != nil {
			t.Fatal(err)
		}
		res := runCLI(t, "", f.at("audit", "verify", "--file", tampered)...)
		if !errors.Is(res.err, errVerifyFailed) || !strings.Contains(res.stdout, "FAIL at line 2") {
			t.Fatalf("verify: err = %v, output %q; want FAIL at line 2", res.err, res.stdout)
		}
		res = runCLI(t, "", f.at("audit", "verify", "--json", "--file", tampered)...)
		var rep markers.Report
		decodeJSON(t, res, &rep)
		if !errors.Is(res.err, errVerifyFailed) || rep.OK || rep.BadLine != 2 || rep.Reason == "" {
			t.Fatalf("report = %+v, err %v; want FAIL at line 2 with a reason", rep, res.err)
		}
	})

	// The daemon stops; what can work without it does, and says so.
	f.bastion.Kill(t)

	t.Run("daemon down: hosts list reads the inventory", func(t *testing.T) {
		res := mustRun(t, f.at("hosts", "list", "--json")...)
		var hosts api.HostsResult
		decodeJSON(t, res, &hosts)
		if len(hosts.Hosts) != 1 || hosts.Hosts[0].Name != "h1" || hosts.Hosts[0].Connected {
			t.Fatalf("hosts = %+v; want h1, not connected", hosts.Hosts)
		}
		if !strings.Contains(res.stderr, "the bastion is not running") || !strings.Contains(res.stderr, "reading the inventory") {
			t.Fatalf("stderr = %q; want a note that the inventory was read directly", res.stderr)
		}
	})

	t.Run("daemon down: the read commands read the files, and change nothing", func(t *testing.T) {
		before := testutil.DirDigest(t, f.bastion.StateDir())
		for _, args := range [][]string{
			{"executions", "list"}, {"executions", "show", id}, {"investigate", id}, {"runs", "list"},
			{"approvals", "list"}, {"markers", "--host", "h1", "list"}, {"markers", "--host", "h1", "show", id},
		} {
			res := runCLI(t, "", f.at(args...)...)
			if res.err != nil {
				t.Errorf("%v: %v; want an answer from the files", args, res.err)
				continue
			}
			if !strings.Contains(res.stderr, "the bastion is not running; reading its journal files in "+f.bastion.StateDir()) {
				t.Errorf("%v: stderr = %q; want a note that the files were read", args, res.stderr)
			}
			if args[0] != "approvals" && args[0] != "runs" && !strings.Contains(res.stdout, id) {
				t.Errorf("%v: stdout lacks %s:\n%s", args, id, res.stdout)
			}
		}
		res := runCLI(t, "", f.at("review", id, "--outcome", "completed", "--note", "checked")...)
		if res.err == nil || !strings.Contains(res.err.Error(), "the bastion is not running, and decisions") {
			t.Errorf("review with the daemon down: %v; want it refused, saying what to do", res.err)
		}
		if after := testutil.DirDigest(t, f.bastion.StateDir()); after != before {
			t.Errorf("the state dir changed:\nbefore %s\nafter  %s", before, after)
		}
	})

	t.Run("daemon down: audit export and verify read the journal", func(t *testing.T) {
		offline := filepath.Join(t.TempDir(), "offline.jsonl")
		res := mustRun(t, f.at("audit", "export", "--out", offline)...)
		if !strings.Contains(res.stderr, "exporting the journal") {
			t.Fatalf("stderr = %q; want a note that the journal was exported directly", res.stderr)
		}
		for _, args := range [][]string{{"--file", offline, "--require-sealed"}, {"--dir", f.bastion.StateDir() + "/journal"}, nil} {
			res := mustRun(t, f.at(append([]string{"audit", "verify"}, args...)...)...)
			if !strings.Contains(res.stdout, ": PASS") {
				t.Errorf("verify %v: %s; want PASS", args, res.stdout)
			}
		}
		data, err := os.ReadFile(offline)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), id) {
			t.Fatalf("offline export lacks %s", id)
		}
	})
}

func TestBastionNeverStarted(t *testing.T) {
	dir := sockdir.New(t)
	res := runCLI(t, "", "executions", "list", "--state-dir", dir)
	want := "the bastion is not running (no socket at " + filepath.Join(dir, "operator.sock") + "; state dir " + dir + ", chosen by --state-dir); nor could its files be read: " + dir + " holds no journal (has a bastion run with this state dir? --state-dir or --config names the one it uses)"
	if !errors.Is(res.err, errBastionDown) || res.err.Error() != want {
		t.Fatalf("err = %v; want %q", res.err, want)
	}
	res = runCLI(t, "", "hosts", "list", "--state-dir", dir)
	if res.err != nil || strings.TrimSpace(res.stdout) != "NAME  ADDR  ACCOUNT  HOST KEY  GUARANTEE  CONNECTED  GROUPS  LABELS  OS" {
		t.Fatalf("hosts list: %v %q; want an empty table", res.err, res.stdout)
	}
}

// collapseSpaces turns runs of spaces (table padding) into two, so tests match rows.
func collapseSpaces(s string) string {
	return regexp.MustCompile(` {2,}`).ReplaceAllString(s, "  ")
}
