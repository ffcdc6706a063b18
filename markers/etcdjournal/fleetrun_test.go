package etcdjournal_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
)

// TestFleetRunAsPebble: a fleet run and its executions are journaled on etcd exactly as on
// Pebble — the same records and the same events, hash for hash — since both plan their
// writes with markers (plan.go) and a fleet run is a journal record like any other.
func TestFleetRunAsPebble(t *testing.T) {
	c := etcdtest.Start(t, 1)
	// One fixed clock for both, so both write the same times (the backends read their
	// clocks a different number of times per write).
	at := time.Date(2026, 7, 28, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }
	peb := testutil.OpenStore(t, markers.JournalGraph, func(o *markers.Options) { o.Now = clock })
	etcd, err := etcdjournal.Open(etcdjournal.Options{
		Client: c.Client(), Prefix: "/" + t.Name() + "/", Replica: "r0", LeaseTTL: 5 * time.Second, OpTimeout: 3 * time.Second,
		Markers: markers.Options{Signer: peb.Opts.Signer, Origin: "postern test journal", Now: clock},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })

	ids := testutil.FleetRunStory(t, peb.Store)
	if got := testutil.FleetRunStory(t, etcd); !reflect.DeepEqual(got, ids) {
		t.Fatalf("ids %v and %v", ids, got)
	}
	for _, id := range ids {
		want, err := peb.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := etcd.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s on etcd:\n%+v\non Pebble:\n%+v", id, got, want)
		}
		wantEvs, err := peb.Events(id)
		if err != nil {
			t.Fatal(err)
		}
		gotEvs, err := etcd.Events(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(gotEvs) != len(wantEvs) {
			t.Fatalf("%s: %d events on etcd, %d on Pebble", id, len(gotEvs), len(wantEvs))
		}
		for i := range wantEvs {
			if gotEvs[i].ThisHash != wantEvs[i].ThisHash {
				t.Errorf("%s event %d (%s %s): etcd hash %s, Pebble %s", id, i, wantEvs[i].Kind, wantEvs[i].To, gotEvs[i].ThisHash, wantEvs[i].ThisHash)
			}
		}
	}
}
