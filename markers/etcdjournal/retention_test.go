package etcdjournal_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
	"github.com/postern-dev/postern/markers/internal/journaltest"
)

// opener opens each journal on a prefix of its own of one cluster.
func opener(c *etcdtest.Cluster) journaltest.Opener {
	var n atomic.Int64
	return func(t *testing.T, adjust func(*markers.Options)) (markers.JournalStore, string) {
		signer, verifier, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "postern-test")
		if err != nil {
			t.Fatal(err)
		}
		mo := markers.Options{Signer: signer, Origin: "postern test journal"}
		adjust(&mo)
		j, err := etcdjournal.Open(etcdjournal.Options{
			Client: c.Client(), Prefix: fmt.Sprintf("/%s/%d/", t.Name(), n.Add(1)), Replica: "r0", OpTimeout: 5 * time.Second, Markers: mo,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		return j, verifier
	}
}

func TestRetentionAndIndexes(t *testing.T) {
	c := etcdtest.Start(t, 3)
	open := opener(c)
	t.Run("Retention", func(t *testing.T) { journaltest.Retention(t, open) })
	t.Run("Indexes", func(t *testing.T) { journaltest.Indexes(t, open) })
	t.Run("OlderJournalGetsItsIndexes", func(t *testing.T) { testOlderJournalGetsItsIndexes(t, c, open) })
	t.Run("PassIsBoundedAndCompacts", func(t *testing.T) { testPassIsBoundedAndCompacts(t, open) })
}

// A journal an older release wrote (imported without the new index families) gets them when
// a replica opens it for writing.
func testOlderJournalGetsItsIndexes(t *testing.T, c *etcdtest.Cluster, open journaltest.Opener) {
	clock := journaltest.NewClock()
	src, _ := open(t, func(o *markers.Options) { o.Now = clock.Now; o.CheckpointEvery = 2 })
	for i := range 6 {
		journaltest.Finished(t, src, &markers.Record{ID: fmt.Sprintf("ex_%02d", i), Actor: fmt.Sprintf("a%d", i%2),
			IntentScope: "run:1", Fingerprint: fmt.Sprint(i), Class: "read_only"}, clock.Now())
	}
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	prefix := "/" + t.Name() + "/old/"
	mo := markers.Options{Signer: signer, Now: clock.Now, Retention: map[string]time.Duration{"read_only": time.Hour}}
	ro := mo
	ro.ReadOnly = true
	dst, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: prefix, Markers: ro})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Import(func(yield func(markers.KV, error) bool) {
		for kv, err := range src.(markers.RawJournal).Raw() {
			if f := kv.Key[0]; err == nil && (f == 'a' || f == 'v' || f == 'y' || string(kv.Key) == string(markers.IndexVersionKey())) {
				continue
			}
			if !yield(kv, err) {
				return
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	recs, _, err := dst.List(markers.Query{Actor: "a1"})
	dst.Close()
	if err != nil || len(recs) != 3 {
		t.Fatalf("read-only List by actor of an older journal = %d, %v; want 3", len(recs), err)
	}
	j, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: prefix, Replica: "r1", Markers: mo})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	recs, _, err = j.List(markers.Query{Actor: "a1", Scope: "run:1"})
	if err != nil || len(recs) != 3 {
		t.Fatalf("List by run after the migration = %d, %v; want 3", len(recs), err)
	}
	clock.Advance(2 * time.Hour)
	res, err := j.GC(context.Background(), markers.GCOptions{})
	if err != nil || res.Records != 6 || res.Events == 0 {
		t.Fatalf("pass on the migrated journal = %+v, %v", res, err)
	}
}

// A pass of many records stays within etcd's request limits (the cluster would refuse a
// transaction past them), leaves no key of what it removed, and — with the journal to
// itself — compacts the history: the members' size in use drops.
func testPassIsBoundedAndCompacts(t *testing.T, open journaltest.Opener) {
	clock := journaltest.NewClock()
	j, verifier := open(t, func(o *markers.Options) {
		o.Now = clock.Now
		o.Retention = map[string]time.Duration{"read_only": time.Hour}
		o.TombstoneRetention = func(string) time.Duration { return time.Hour }
	})
	const n = 300
	for i := range n {
		rec := &markers.Record{ID: fmt.Sprintf("ex_%05d", i), Actor: "alice", IntentScope: "run:1", Fingerprint: fmt.Sprint(i), Class: "read_only",
			Command: []string{"sh", "-c", "echo " + strings.Repeat("x", 2000)}}
		journaltest.Finished(t, j, rec, clock.Now())
	}
	clock.Advance(2 * time.Hour)
	res, err := j.GC(context.Background(), markers.GCOptions{Exclusive: true})
	if err != nil || res.Records != n || res.Tombstones != n || !res.Compacted || res.Events == 0 {
		t.Fatalf("pass = %+v, %v", res, err)
	}
	t.Logf("in use %d → %d bytes", res.BytesBefore, res.BytesAfter)
	if res.BytesAfter >= res.BytesBefore {
		t.Errorf("size in use %d → %d: compaction freed nothing", res.BytesBefore, res.BytesAfter)
	}
	for kv, err := range j.(markers.RawJournal).Raw() {
		if err != nil {
			t.Fatal(err)
		}
		switch kv.Key[0] {
		case 'r', 'b', 'x', 's', 't', 'a', 'v', 'y', 'g', 'e':
			t.Fatalf("key %q left after every record was removed", kv.Key)
		}
	}
	st, err := j.Backend(context.Background())
	if err != nil || st.Backend != "etcd" || len(st.Members) != 3 || st.QuotaBytes != etcdjournal.DefaultQuotaBytes || st.BaseSeq != res.BaseSeq {
		t.Fatalf("backend = %+v, %v", st, err)
	}
	if rep := verifyExport(t, j, verifier); !rep.OK || rep.PrunedThrough != res.BaseSeq {
		t.Fatalf("verify = %v", rep)
	}
}

func verifyExport(t *testing.T, j markers.JournalStore, verifier string) markers.Report {
	t.Helper()
	var buf bytes.Buffer
	if err := j.Export(&buf); err != nil {
		t.Fatal(err)
	}
	rep, err := markers.VerifyJSONL(&buf, verifier, markers.VerifyOptions{RequireSealed: true})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// A pass keeps the last CompactionLag of history: an export reading at one revision while
// passes run is not cut short by a compaction; once the lag has passed, a pass compacts up
// to where the history was then.
func TestCompactionKeepsRecentHistory(t *testing.T) {
	c := etcdtest.Start(t, 1)
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	j, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: "/lag/", Replica: "r0", CompactionLag: time.Second,
		Markers: markers.Options{Signer: signer}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	journaltest.Finished(t, j, &markers.Record{ID: "ex_1", Actor: "a", IntentScope: "run:1", Fingerprint: "f"}, time.Now())
	res, err := j.GC(ctx, markers.GCOptions{})
	if err != nil || res.Compacted {
		t.Fatalf("first pass = %+v, %v; want nothing compacted (no history a second old)", res, err)
	}
	// An export begun now reads at today's revision; passes within the lag leave it be.
	var buf bytes.Buffer
	if err := j.Export(&buf); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	res, err = j.GC(ctx, markers.GCOptions{})
	if err != nil || !res.Compacted {
		t.Fatalf("pass after the lag = %+v, %v; want the history before it compacted", res, err)
	}
}
