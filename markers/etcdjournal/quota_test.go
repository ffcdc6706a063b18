package etcdjournal_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
	"github.com/postern-dev/postern/markers/internal/journaltest"
)

// The etcd quota arithmetic of docs/operations.md ("Retention and capacity"), scaled down:
// executions at a steady rate a day (`ssh_exec true` as the bastion journals it), one
// class kept a few days, a retention pass a day as the bastion schedules it (not
// exclusive: the revision history since the previous pass stays). Over the run they write
// more than one and a half times the members' quota, yet the database never reaches it, no
// alarm is raised, and it stops growing once the first retention has passed.
func TestQuotaHoldsUnderRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a few thousand executions to a 3-member etcd")
	}
	const (
		quota     = 24 << 20
		perDay    = 200
		days      = 10
		retention = 2 * 24 * time.Hour
		day       = 24 * time.Hour
	)
	c := etcdtest.StartQuota(t, 3, quota)
	signer, verifier, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	clock := journaltest.NewClock()
	j, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: "/postern/", Replica: "r0", OpTimeout: 10 * time.Second,
		QuotaBytes: quota, CompactionLag: time.Millisecond,
		Markers: markers.Options{Signer: signer, Now: clock.Now, Origin: "postern test journal",
			Retention: map[string]time.Duration{"remote_command": retention}, MinRetention: retention,
			TombstoneRetention: func(string) time.Duration { return retention }, RunRetention: retention,
			EventRetention: retention + retention/4 + 2*day}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	ctx := context.Background()
	var sizes []int64
	for d := range days {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < perDay; i = int(next.Add(1) - 1) {
					n := d*perDay + i
					if err := journaltest.Execution(ctx, j, n, fmt.Sprintf("run:q-%d", n/10), n%10 == 0); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		clock.Advance(day)
		res, err := j.GC(ctx, markers.GCOptions{})
		if err != nil {
			t.Fatalf("day %d: pass: %v", d, err)
		}
		time.Sleep(200 * time.Millisecond) // the members commit their backend every 100 ms
		st, err := j.Backend(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Alarms) > 0 || st.Bytes >= quota {
			t.Fatalf("day %d: backend %d bytes of a %d quota, alarms %v", d, st.Bytes, quota, st.Alarms)
		}
		sizes = append(sizes, st.Bytes)
		t.Logf("day %d: %d executions so far; pass removed %d, pruned %d events, carried %d; database %d bytes (%d in use) of %d",
			d, (d+1)*perDay, res.Records, res.Events, res.Carried, st.Bytes, st.InUseBytes, quota)
	}
	if written := int64(days) * sizes[0]; written < quota*3/2 {
		t.Errorf("the run wrote about %d bytes (%d a day): not enough to fill the quota without retention", written, sizes[0])
	}
	// Flat after the first retention (and the day its pass needs): the last days' database
	// is no bigger than on the first day retention removed anything, with a page's slack.
	settled := int(retention/day) + 1
	for d, b := range sizes[settled+1:] {
		if b > sizes[settled]+sizes[settled]/10 {
			t.Errorf("day %d: database %d bytes, more than on day %d (%d): still growing", settled+1+d, b, settled, sizes[settled])
		}
	}
	if rep := verifyExport(t, j, verifier); !rep.OK {
		t.Fatalf("verify after %d passes: %v", days, rep)
	}
}
