package hostagent_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// hostRecord is a stored marker with every field a host marker uses set.
func hostRecord() *markers.Record {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	code := 3
	return &markers.Record{
		ID: "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW", Graph: markers.HostGraph, State: markers.Exited,
		Actor: "deploy key SHA256:abc", Fingerprint: "hmac-sha256:ff", OperationKey: "migration:1", Channel: "ssh",
		Account: "deploy", Command: []string{"/bin/sh", "-c", "make migrate"}, Cwd: "/srv/app",
		CreatedAt: at, UpdatedAt: at.Add(time.Minute),
		StateTimes: map[markers.State]time.Time{markers.Started: at, markers.Running: at.Add(time.Second), markers.Exited: at.Add(time.Minute)},
		ExitCode:   &code, Signal: "SIGTERM", IsError: true,
		Output:   markers.Output{StdoutBytes: 10, StderrBytes: 2, StdoutSHA256: "aa", StderrSHA256: "bb", Truncated: true},
		Evidence: []string{"exited"}, StartError: "cwd /srv/app does not exist",
		PID: 42, PIDStart: 4242, SpoolDir: "/var/lib/postern-hostagent/spool/ex_1", BootID: "boot-1",
		Checkpoints: []markers.Checkpoint{{At: at.Add(time.Second), Note: "schema applied"}}, Validated: true,
	}
}

func jsonKeys(t *testing.T, v any) map[string]bool {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for k := range m {
		keys[k] = true
	}
	return keys
}

// TestWireMarkerCarriesEveryField: every field of hostproto.Marker is filled from the store,
// under the JSON name the store's record has (the previous release sent the record itself).
func TestWireMarkerCarriesEveryField(t *testing.T) {
	wire := jsonKeys(t, hostagent.WireMarker(hostRecord()))
	stored := jsonKeys(t, hostRecord())
	typ := reflect.TypeFor[hostproto.Marker]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if !wire[name] {
			t.Errorf("hostproto.Marker field %s (%q) is not filled by WireMarker", typ.Field(i).Name, name)
		}
		if !stored[name] {
			t.Errorf("hostproto.Marker field %s is %q on the wire, which no field of markers.Record is named", typ.Field(i).Name, name)
		}
	}
}

// TestWireMarkerSpeaksThePreviousRelease: a marker this release sends decodes, as the previous
// release decodes it (into markers.Record), to the same marker; and a marker the previous
// release sends (a markers.Record) decodes here to what WireMarker makes of it.
func TestWireMarkerSpeaksThePreviousRelease(t *testing.T) {
	rec := hostRecord()
	want := hostagent.WireMarker(rec)

	sent, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var old markers.Record
	if err := json.Unmarshal(sent, &old); err != nil {
		t.Fatalf("the previous release cannot decode %s: %v", sent, err)
	}
	if got := hostagent.WireMarker(&old); !reflect.DeepEqual(got, want) {
		t.Errorf("this release → previous: %+v; want %+v", got, want)
	}

	oldSent, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var got hostproto.Marker
	if err := json.Unmarshal(oldSent, &got); err != nil {
		t.Fatalf("cannot decode the previous release's %s: %v", oldSent, err)
	}
	if !reflect.DeepEqual(&got, want) {
		t.Errorf("previous release → this: %+v; want %+v", got, want)
	}
}

// TestMarkerStatesAreTheHostGraph: the protocol's states are exactly the store's host graph.
func TestMarkerStatesAreTheHostGraph(t *testing.T) {
	var wire, graph []string
	for _, s := range hostproto.MarkerStates() {
		wire = append(wire, string(s))
	}
	for _, s := range markers.HostGraph.States() {
		graph = append(graph, string(s))
		if hostproto.MarkerState(s).Ended() != markers.HostGraph.Terminal(s) {
			t.Errorf("%s: Ended %v, terminal in the host graph %v", s, hostproto.MarkerState(s).Ended(), markers.HostGraph.Terminal(s))
		}
	}
	slices.Sort(wire)
	slices.Sort(graph)
	if !slices.Equal(wire, graph) {
		t.Errorf("hostproto.MarkerStates() = %v; the host graph has %v", wire, graph)
	}
}
