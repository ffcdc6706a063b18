// Package journal opens the bastion's journal on the backend its config chooses: Pebble in
// the state dir (one bastion), or etcd (replicas serving one fleet; docs/replicas.md). The
// journal itself is markers.JournalStore; this package only connects it.
package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/mod/sumdb/note"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
)

// Open opens the configured journal for the daemon. classes are the action classes in force
// (nil: the config's), which the retention pass reads each time it decides.
func Open(cfg config.Config, signer note.Signer, classes func() *config.Classes, log *slog.Logger, now func() time.Time) (markers.JournalStore, error) {
	mo := markers.Options{
		Graph:         markers.JournalGraph,
		Signer:        signer,
		Origin:        "postern bastion journal",
		MemTableBytes: markers.JournalMemTableBytes,
		CacheBytes:    markers.JournalCacheBytes,
		PresenceKeys:  markers.JournalPresenceKeys,
		MaxOpenFiles:  1000,
		Logger:        log.With("component", "journal"),
		Now:           now,
	}
	Retention(cfg, classes, &mo)
	if !cfg.Journal.Etcd() {
		return markers.Open(cfg.JournalDir(), mo)
	}
	return OpenEtcd(cfg.Journal, mo)
}

// Retention sets the journal's retention rules (docs/design.md, "Retention") from the
// configuration's action classes: an execution is removable once no call could match it
// (intent.Removable, its class's attach window and retention); the pointer entries of a
// removed execution keep its tombstone for one more retention of its class, so a late call
// is answered by intent.RuleRemoved; an agent run with no execution left goes once it was
// first seen longer ago than the longest retention; and the chain's prefix older than
// event_retention is pruned, the events there of executions still held carried forward
// first. event_retention defaults to the shortest class retention, its removal margin and
// two retention intervals (for a command that ran long, whose first events are that much
// older than its end): an execution of the shortest class is removed before its events reach
// that horizon, so only what is held longer is carried, and the chain holds about the
// shortest retention of events plus one copy of those of what is held, whatever the mix of
// classes (a horizon at the longest retention would keep every removed execution's events as
// long as the longest class keeps one: 90 days, not 7, with the built-in classes).
// classes are the classes in force (nil: the config's): whether a record may go, and how long
// its tombstones stay, follow a reload; the bounds above are taken once, at open (a reload
// that adds a shorter or a longer class applies them at the next start).
func Retention(cfg config.Config, classes func() *config.Classes, mo *markers.Options) {
	if classes == nil {
		fixed := cfg.ResolveClasses()
		classes = func() *config.Classes { return fixed }
	}
	var shortest, longest time.Duration
	for _, d := range classes().Retention() {
		if shortest == 0 || d < shortest {
			shortest = d
		}
		longest = max(longest, d)
	}
	mo.Removable = func(r *markers.Record, now time.Time) bool { return intent.Removable(r, now, classes().Get(r.Class)) }
	mo.TombstoneRetention = func(class string) time.Duration { return classes().Get(class).Retention }
	mo.MinRetention = shortest
	mo.RunRetention = longest
	mo.EventRetention = cfg.EventRetention
	if mo.EventRetention == 0 {
		mo.EventRetention = shortest + intent.RemovalMargin(shortest) + 2*cfg.RetentionInterval
	}
}

// etcdJournal is the etcd journal with the client it owns.
type etcdJournal struct {
	*etcdjournal.Journal
	cli *clientv3.Client
}

func (e etcdJournal) Close() error { return errors.Join(e.Journal.Close(), e.cli.Close()) }

// OpenEtcd connects to the etcd cluster of jc and opens the journal under its prefix
// (read-only with mo.ReadOnly: for verify and copy). It fails if no quorum answers in time.
func OpenEtcd(jc config.Journal, mo markers.Options) (markers.JournalStore, error) {
	cc := clientv3.Config{Endpoints: jc.Endpoints, DialTimeout: orDefault(jc.Timeout, 5*time.Second), Logger: zap.NewNop()}
	if jc.CAFile != "" || jc.CertFile != "" {
		tlsInfo := transport.TLSInfo{TrustedCAFile: jc.CAFile, CertFile: jc.CertFile, KeyFile: jc.KeyFile}
		tc, err := tlsInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("bastion: etcd TLS: %w", err)
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("bastion: etcd client: %w", err)
	}
	replica := jc.Replica
	if replica == "" {
		host, _ := os.Hostname()
		replica = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	j, err := etcdjournal.Open(etcdjournal.Options{
		Client: cli, Prefix: orDefault(jc.Prefix, "/postern/"), Markers: mo, Replica: replica,
		LeaseTTL: jc.LeaseTTL, OpTimeout: jc.Timeout, QuotaBytes: jc.QuotaBytes, CompactionLag: jc.CompactionLag,
	})
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("bastion: etcd journal at %v: %w", jc.Endpoints, err)
	}
	return etcdJournal{j, cli}, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// OpenReadOnly opens the configured journal for reading (export, verify, copy) while
// no bastion of this state dir serves (Pebble locks its dir); an etcd journal may be read
// while replicas serve it.
func OpenReadOnly(cfg config.Config, log *slog.Logger) (markers.JournalStore, error) {
	mo := markers.Options{ReadOnly: true, Graph: markers.JournalGraph, Logger: log}
	Retention(cfg, nil, &mo) // a dry run of the retention pass reads them
	if cfg.Journal.Etcd() {
		return OpenEtcd(cfg.Journal, mo)
	}
	return markers.Open(cfg.JournalDir(), mo)
}
