package journal

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
)

// The journal reaches an etcd cluster that serves TLS and requires client certificates
// with the config's ca_file, cert_file and key_file; without a client certificate it is
// refused (and Open fails: nothing can be journaled).
func TestEtcdJournalOverTLS(t *testing.T) {
	dir := t.TempDir()
	files := etcdtest.WriteTLS(t, dir)
	c := etcdtest.StartTLS(t, 1, files)
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(dir, "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	jc := config.Journal{Backend: "etcd", Endpoints: c.Endpoints(), CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey,
		Replica: "r0", LeaseTTL: 2 * time.Second, Timeout: 3 * time.Second}
	cfg := config.DefaultConfig(dir)
	cfg.Journal = jc
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	j, err := OpenEtcd(jc, markers.Options{Graph: markers.JournalGraph, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	rec := &markers.Record{ID: "ex_01JTLS00000000000000000001", Actor: "alice", IntentScope: "run:1", Fingerprint: "fp"}
	if _, err := j.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	noCert := jc
	noCert.CertFile, noCert.KeyFile = "", ""
	if j, err := OpenEtcd(noCert, markers.Options{Graph: markers.JournalGraph, Signer: signer}); err == nil {
		j.Close()
		t.Fatal("a client without a certificate opened the journal")
	}
}

// The journal's retention rules come from the classes: the event horizon is the shortest
// class retention with a margin (its removal margin and two retention intervals) unless
// event_retention sets it, runs go after the longest retention.
func TestRetentionRules(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		name             string
		eventRetention   time.Duration
		interval         time.Duration
		wantEvents, runs time.Duration
	}{
		{name: "built-in classes", interval: time.Hour, wantEvents: 7*day + 10*time.Minute + 2*time.Hour, runs: 90 * day},
		{name: "no scheduled pass", wantEvents: 7*day + 10*time.Minute, runs: 90 * day},
		{name: "event_retention set", eventRetention: 2 * day, interval: time.Hour, wantEvents: 2 * day, runs: 90 * day},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.DefaultConfig(t.TempDir())
			cfg.EventRetention, cfg.RetentionInterval = tt.eventRetention, tt.interval
			var mo markers.Options
			Retention(cfg, nil, &mo)
			if mo.EventRetention != tt.wantEvents || mo.RunRetention != tt.runs || mo.MinRetention != 7*day {
				t.Errorf("events %v, runs %v, min %v; want %v, %v, %v", mo.EventRetention, mo.RunRetention, mo.MinRetention, tt.wantEvents, tt.runs, 7*day)
			}
		})
	}
}

// What a pass may remove, and how long tombstones stay, follow the classes in force: a
// reload that lengthens a class's retention applies to the next pass.
func TestRetentionFollowsTheClassesInForce(t *testing.T) {
	cfg := config.DefaultConfig(t.TempDir())
	inForce := cfg.ResolveClasses()
	var mo markers.Options
	Retention(cfg, func() *config.Classes { return inForce }, &mo)
	if got := mo.TombstoneRetention(config.ClassReadOnly); got != 7*24*time.Hour {
		t.Fatalf("read_only tombstones stay %v; want 7 days", got)
	}
	reloaded := cfg
	reloaded.Classes = []config.Class{{Name: config.ClassReadOnly, Retention: 14 * 24 * time.Hour}}
	inForce = reloaded.ResolveClasses()
	if got := mo.TombstoneRetention(config.ClassReadOnly); got != 14*24*time.Hour {
		t.Fatalf("after a reload read_only tombstones stay %v; want 14 days", got)
	}
	ended := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	rec := &markers.Record{State: markers.Completed, Class: config.ClassReadOnly, CreatedAt: ended,
		UpdatedAt: ended, StateTimes: map[markers.State]time.Time{markers.Completed: ended}}
	if mo.Removable(rec, ended.Add(10*24*time.Hour)) {
		t.Error("a read_only execution ended 10 days ago is removable under a 14-day retention")
	}
}
