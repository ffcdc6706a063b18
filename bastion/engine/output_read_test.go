package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// TestOutputFromOffsets reads a command's output from offsets while it runs and after it
// ended; Status shows it in progress, then finished.
func TestOutputFromOffsets(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "printf a; " + f.gate("g") + "; printf b", CallOptions: api.CallOptions{WaitS: waitS(0)}})
	id := x.ExecutionID

	got, err := f.engine().Output(ctx, alice, api.OutputArgs{ExecutionID: id, WaitS: waitS(30)})
	if err != nil {
		t.Fatal(err)
	}
	if got.Stdout != "a" || got.StdoutOffset != 0 || markers.JournalGraph.Terminal(markers.State(got.State)) {
		t.Errorf("output from 0 while running = %q at %d (%s); want \"a\" at 0, in progress", got.Stdout, got.StdoutOffset, got.State)
	}
	got, err = f.engine().Output(ctx, alice, api.OutputArgs{ExecutionID: id, StdoutOffset: 1, WaitS: waitS(0)})
	if err != nil {
		t.Fatal(err)
	}
	if got.Stdout != "" || got.StdoutOffset != 1 || got.StdoutBytes != 1 {
		t.Errorf("output from 1 with nothing new = %q at %d of %d; want nothing at 1 of 1", got.Stdout, got.StdoutOffset, got.StdoutBytes)
	}
	st, err := f.engine().Status(ctx, alice, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State == string(markers.Completed) || st.Stdout != "a" {
		t.Errorf("status while running = %s, stdout %q; want in progress with \"a\"", st.State, st.Stdout)
	}

	f.release(t, "g")
	got, err = f.engine().Output(ctx, alice, api.OutputArgs{ExecutionID: id, StdoutOffset: 1, WaitS: waitS(30)})
	if err != nil {
		t.Fatal(err)
	}
	if got.Stdout != "b" || got.StdoutOffset != 1 {
		t.Errorf("output from 1 after the release = %q at %d; want \"b\" at 1", got.Stdout, got.StdoutOffset)
	}
	f.waitState(t, alice, id, markers.Completed)
	for _, off := range []int64{0, 1, 2, 5} {
		got, err = f.engine().Output(ctx, alice, api.OutputArgs{ExecutionID: id, StdoutOffset: off})
		if err != nil {
			t.Fatal(err)
		}
		want := "ab"[min(off, 2):]
		if got.Stdout != want || got.StdoutOffset != min(off, 2) {
			t.Errorf("output from %d after the end = %q at %d; want %q", off, got.Stdout, got.StdoutOffset, want)
		}
	}
	st, err = f.engine().Status(ctx, alice, id)
	if err != nil {
		t.Fatal(err)
	}
	finished(t, st)
	if st.Stdout != "ab" {
		t.Errorf("status after the end: stdout %q; want \"ab\"", st.Stdout)
	}

	for _, a := range []api.OutputArgs{{ExecutionID: id, StdoutOffset: -1}, {ExecutionID: id, WaitS: waitS(-1)}} {
		_, err := f.engine().Output(ctx, alice, a)
		wantCode(t, err, api.CodeInvalidArgument)
	}
}

// TestOutputFromSpool: output older than the stored tail is read from the host's spool.
func TestOutputFromSpool(t *testing.T) {
	f := newFleet(t, func(c *config.Config) { c.OutputTailBytes = 8 })
	x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "seq 1 20"})
	finished(t, x)
	var all strings.Builder
	for i := 1; i <= 20; i++ {
		all.WriteString(strconv.Itoa(i) + "\n")
	}
	whole := all.String()
	if x.Stdout != whole[len(whole)-8:] || x.StdoutOffset != int64(len(whole)-8) {
		t.Fatalf("result = %q at %d; want the last 8 bytes at %d", x.Stdout, x.StdoutOffset, len(whole)-8)
	}
	tests := []struct {
		name   string
		offset int64
		want   string
	}{
		{name: "from the start", offset: 0, want: whole[:8]},
		{name: "inside the spool", offset: 10, want: whole[10:18]},
		{name: "inside the tail", offset: int64(len(whole) - 4), want: whole[len(whole)-4:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.engine().Output(context.Background(), alice, api.OutputArgs{ExecutionID: x.ExecutionID, StdoutOffset: tt.offset})
			if err != nil {
				t.Fatal(err)
			}
			if got.Stdout != tt.want || got.StdoutOffset != tt.offset {
				t.Errorf("output = %q at %d; want %q at %d", got.Stdout, got.StdoutOffset, tt.want, tt.offset)
			}
			op, err := f.engine().ReadOutput(context.Background(), x.ExecutionID, api.OutputArgs{ExecutionID: x.ExecutionID, StdoutOffset: tt.offset})
			if err != nil {
				t.Fatal(err)
			}
			if op.Stdout != tt.want {
				t.Errorf("operator's read = %q; want %q", op.Stdout, tt.want)
			}
		})
	}
}

// TestCancel: an execution not dispatched yet (queued) is cancelled in the journal; one on
// the host is cancelled there and its process is gone; one awaiting approval stays so; an
// ended one is left as it is.
func TestCancel(t *testing.T) {
	f := newFleet(t, func(c *config.Config) {
		c.Actors[0].MaxConcurrent = 1
		c.Rules = []policy.Rule{approvalRule("gated")}
	})
	f.alias(t, "gated")
	ctx := context.Background()

	pidFile := f.path("pid")
	running := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "echo $$ > " + pidFile + "; " + f.gate("never"), CallOptions: api.CallOptions{WaitS: waitS(0)}})
	var pid int
	testutil.WaitFor(t, "the command to write its pid", func() bool {
		data, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})

	pending := f.exec(t, alice, api.ExecArgs{Host: "gated", Command: f.effect("approved")})
	if pending.State != string(markers.AwaitingApproval) {
		t.Fatalf("exec needing approval = %s; want awaiting_approval", pending.State)
	}
	x, err := f.engine().Cancel(ctx, alice, pending.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if x.State != string(markers.AwaitingApproval) || strings.Contains(x.Next, "ended") || !strings.Contains(x.Next, "approval_timeout") {
		t.Errorf("cancel awaiting approval = %s (next %q); want it to stay awaiting_approval, saying how it ends", x.State, x.Next)
	}

	// Approved while the actor is at max_concurrent: queued, then cancelled before dispatch.
	if _, err := f.engine().Approve(ctx, testOperator, pending.ExecutionID, ""); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the approved execution to be queued", func() bool {
		st, err := f.engine().State(alice, pending.ExecutionID)
		return err == nil && st.Queued
	})
	if x, err = f.engine().Cancel(ctx, alice, pending.ExecutionID); err != nil {
		t.Fatal(err)
	}
	if x.State != string(markers.Cancelled) {
		t.Errorf("cancel of a queued execution = %s; want cancelled", x.State)
	}

	x, err = f.engine().Cancel(ctx, alice, running.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if x.State != string(markers.Cancelled) {
		t.Errorf("cancel on the host = %s (evidence %q); want cancelled", x.State, x.Evidence)
	}
	testutil.WaitFor(t, "the cancelled command's process to be gone", func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})

	again, err := f.engine().Cancel(ctx, alice, running.ExecutionID)
	if err != nil {
		t.Fatal(err)
	}
	if again.State != string(markers.Cancelled) || !strings.Contains(again.Next, "nothing to cancel") {
		t.Errorf("cancel again = %s (next %q); want it left cancelled", again.State, again.Next)
	}
	if got := f.count(t, "approved"); got != 0 {
		t.Errorf("the cancelled approved command ran %d times; want 0", got)
	}
}

// TestListAndOwnership: executions_list filters and bounds; another actor's executions are
// invisible to every read and to cancel.
func TestListAndOwnership(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		x := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "echo " + strconv.Itoa(i)})
		finished(t, x)
		ids = append(ids, x.ExecutionID)
	}
	nonzero := f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "exit 3"})
	theirs := f.exec(t, bob, api.ExecArgs{Host: "h1", Command: "echo bob"})

	tests := []struct {
		name string
		args api.ListArgs
		want []string
	}{
		{name: "all, newest first", want: []string{nonzero.ExecutionID, ids[2], ids[1], ids[0]}},
		{name: "limit", args: api.ListArgs{Limit: 2}, want: []string{nonzero.ExecutionID, ids[2]}},
		{name: "state", args: api.ListArgs{State: "completed"}, want: []string{nonzero.ExecutionID, ids[2], ids[1], ids[0]}},
		{name: "state unknown", args: api.ListArgs{State: "unknown"}, want: nil},
		{name: "host", args: api.ListArgs{Host: "h1", Limit: 1}, want: []string{nonzero.ExecutionID}},
		{name: "other host", args: api.ListArgs{Host: "h2"}, want: nil},
		{name: "since the future", args: api.ListArgs{Since: time.Now().Add(time.Hour).Format(time.RFC3339)}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := f.engine().List(alice, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := joinIDs(res.Executions, executionID), strings.Join(tt.want, ","); got != want {
				t.Errorf("got = %s; want %s", got, want)
			}
		})
	}
	for _, a := range []api.ListArgs{{State: "bogus"}, {Since: "yesterday"}, {Limit: -1}, {Limit: 501}} {
		_, err := f.engine().List(alice, a)
		wantCode(t, err, api.CodeInvalidArgument)
	}
	if nonzero.ExitCode == nil || *nonzero.ExitCode != 3 || !nonzero.IsError {
		t.Errorf("exit 3 = exit %v, is_error %v; want exit 3 and is_error", nonzero.ExitCode, nonzero.IsError)
	}

	// Bob sees his own execution only; alice's reads of it find nothing.
	res, err := f.engine().List(bob, api.ListArgs{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Executions) != 1 || res.Executions[0].ExecutionID != theirs.ExecutionID {
		t.Errorf("bob's list = %d executions; want his one", len(res.Executions))
	}
	for _, id := range []string{theirs.ExecutionID, "ex_00000000000000000000000000", "not-an-id"} {
		_, err := f.engine().Status(ctx, alice, id)
		wantCode(t, err, api.CodeNotFound)
		_, err = f.engine().Output(ctx, alice, api.OutputArgs{ExecutionID: id})
		wantCode(t, err, api.CodeNotFound)
		_, err = f.engine().Cancel(ctx, alice, id)
		wantCode(t, err, api.CodeNotFound)
		_, err = f.engine().State(alice, id)
		wantCode(t, err, api.CodeNotFound)
	}
}

// TestHosts lists the enrolled host, connected once it ran something.
func TestHosts(t *testing.T) {
	f := newFleet(t)
	finished(t, f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "true"}))
	res, err := f.engine().Hosts(api.HostsArgs{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Hosts) != 1 {
		t.Fatalf("hosts = %+v; want h1", res.Hosts)
	}
	h := res.Hosts[0]
	if h.Name != "h1" || h.Addr != f.host.Addr || h.Guarantee != "hostagent" || !h.Connected || h.HostKeyType != f.host.HostKey.Type() {
		t.Errorf("h1 = %+v; want it at %s, level hostagent, connected", h, f.host.Addr)
	}
}

// TestHostsPages: hosts_list filters by labels and pages by cursor over the hosts the caller
// may use; a bad selector or cursor is the caller's error.
func TestHostsPages(t *testing.T) {
	f := newFleet(t)
	for i, env := range []string{"prod", "staging", "prod", "prod"} {
		h := f.hostAs(fmt.Sprintf("db%d", i))
		h.Labels = map[string]string{"role": "db", "env": env}
		f.enroll(t, h)
	}
	var got []string
	a := api.HostsArgs{Labels: "env=prod,role=db", Limit: 2}
	for range 10 {
		res, err := f.engine().HostsOf(alice, a)
		if err != nil {
			t.Fatal(err)
		}
		if res.Total != 3 || len(res.Hosts) > 2 {
			t.Fatalf("page %+v; want at most 2 of 3", res)
		}
		for _, h := range res.Hosts {
			got = append(got, h.Name)
		}
		if res.NextCursor == "" {
			break
		}
		a.Cursor = res.NextCursor
	}
	if want := []string{"db0", "db2", "db3"}; !slices.Equal(got, want) {
		t.Fatalf("pages gave %v; want %v", got, want)
	}
	if res, err := f.engine().Hosts(api.HostsArgs{}); err != nil || res.Total != 5 || res.NextCursor != "" {
		t.Fatalf("every host = %+v, %v; want 5 in one page", res, err)
	}
	for _, bad := range []api.HostsArgs{{Labels: "env"}, {Cursor: "not a name"}, {Limit: 5000}} {
		_, err := f.engine().HostsOf(alice, bad)
		wantCode(t, err, api.CodeInvalidArgument)
	}
}
