package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// markerPage is `postern markers --host s1 list --json ARGS`.
func markerPage(t *testing.T, b *harness.Bastion, args ...string) api.MarkerPage {
	t.Helper()
	var page api.MarkerPage
	if err := json.Unmarshal(postern(t, b, append([]string{"markers", "--host", "s1", "list", "--json"}, args...)...), &page); err != nil {
		t.Fatal(err)
	}
	return page
}

// TestStockHostMarkers: `postern markers` lists and shows a marker-script host's markers
// through the bastion — states, exit codes, the state filter and pages, newest first — by
// reading them with the wrapper's own list and status, which run nothing and write no
// marker; on a level-none host it says there are none, and why.
func TestStockHostMarkers(t *testing.T) {
	f := startStockFleet(t, "mklist", true, false)
	ctx := testContext(t)
	cs := f.session(t, "run-markers")
	effects := f.path("effects")
	var ids []string // oldest first
	for _, cmd := range []string{"echo x >> " + effects, "echo x >> " + effects + "; exit 3"} {
		ids = append(ids, mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "s1", "command": cmd}).ExecutionID)
	}
	gateCmd, _ := f.gate()
	gated, done := f.startGated(t, ctx, gateCmd)
	ids = append(ids, gated)

	all := markerPage(t, f.bastion)
	var got []string
	for _, m := range all.Markers {
		got = append(got, m.ID+" "+string(m.State))
	}
	want := []string{gated + " running", ids[1] + " exited", ids[0] + " exited"}
	if !slices.Equal(got, want) || all.Next != "" {
		t.Fatalf("markers list = %v next %q; want %v, newest first, one page", got, all.Next, want)
	}
	if m := all.Markers[1]; m.ExitCode == nil || *m.ExitCode != 3 || m.Account != f.account.Name {
		t.Errorf("marker %s = %+v; want exit 3 as %s", m.ID, m, f.account.Name)
	}
	if running := markerPage(t, f.bastion, "--state", "running"); len(running.Markers) != 1 || running.Markers[0].ID != gated {
		t.Errorf("--state running = %+v; want only %s", running.Markers, gated)
	}
	first := markerPage(t, f.bastion, "--limit", "2")
	second := markerPage(t, f.bastion, "--limit", "2", "--cursor", first.Next)
	if len(first.Markers) != 2 || first.Next == "" || len(second.Markers) != 1 || second.Markers[0].ID != ids[0] || second.Next != "" {
		t.Errorf("pages of 2: %+v next %q, then %+v next %q; want 2 then %s", first.Markers, first.Next, second.Markers, second.Next, ids[0])
	}

	shown := string(postern(t, f.bastion, "markers", "--host", "s1", "show", ids[1]))
	for _, w := range []string{ids[1], "exited", "exit 3", "marker script on s1"} {
		if !strings.Contains(shown, w) {
			t.Errorf("markers show:\n%s\nwant %q", shown, w)
		}
	}
	if strings.Contains(shown, "0001-01-01") {
		t.Errorf("markers show prints a zero time:\n%s", shown)
	}
	absent := newID(t)
	out, err := exec.Command(harness.Binary(t, "postern"), "markers", "--host", "s1", "show", absent, "--config", f.bastion.ConfigPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "has no marker "+absent) {
		t.Errorf("markers show of an id never sent: %v\n%s", err, out)
	}

	// Reading ran nothing and wrote no marker: two effects, three marker directories.
	if n := countLines(t, effects); n != 2 {
		t.Errorf("effects = %d lines; want 2", n)
	}
	dirs, err := os.ReadDir(filepath.Join(f.account.Home, ".postern", "markers"))
	if err != nil || len(dirs) != 3 {
		t.Errorf("marker dirs %v (%v); want 3", dirs, err)
	}
	f.asAccount(t, "gate", "")
	if got := <-done; got.err != nil || got.x.State != "completed" {
		t.Fatalf("gated call = %+v (%v)", got.x, got.err)
	}
}

// TestStockHostLevelNoneHasNoMarkers: on a host without the hostagent or the marker script,
// `postern markers` refuses (409 no_markers) saying that nothing there records executions,
// and where the bastion's own record is.
func TestStockHostLevelNoneHasNoMarkers(t *testing.T) {
	f := startStockFleet(t, "mknone", false, false)
	for _, args := range [][]string{{"list"}, {"show", newID(t)}} {
		cmd := exec.Command(harness.Binary(t, "postern"), append(append([]string{"markers", "--host", "s1"}, args...), "--config", f.bastion.ConfigPath)...)
		out, err := cmd.CombinedOutput()
		for _, w := range []string{"no markers", "guarantee level none", "postern executions list --host s1"} {
			if err == nil || !strings.Contains(string(out), w) {
				t.Errorf("markers %s: %v\n%s\nwant a refusal saying %q", args[0], err, out, w)
			}
		}
	}
}
