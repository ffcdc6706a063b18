package bastion

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/mod/sumdb/note"

	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
)

// JournalConfig chooses the journal's backend: Pebble in the state dir (the default, one
// bastion), or etcd (N bastion replicas serving one fleet: see README, "Replicas").
type JournalConfig struct {
	// Backend is "pebble" (default) or "etcd".
	Backend string `toml:"backend"`
	// Endpoints are the etcd members' client URLs (etcd only), e.g. "https://10.0.0.1:2379".
	Endpoints []string `toml:"endpoints"`
	// CAFile verifies the members' certificates; CertFile and KeyFile are this replica's
	// client certificate (all PEM; https endpoints only).
	CAFile   string `toml:"ca_file"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// Prefix is the journal's key prefix in etcd. Default "/postern/".
	Prefix string `toml:"prefix"`
	// Replica names this bastion in owner keys and the election. Default hostname-pid.
	Replica string `toml:"replica"`
	// LeaseTTL is how long a dead replica's executions stay owned before another replica
	// takes them over. Default 10s; whole seconds, at least 2s.
	LeaseTTL time.Duration `toml:"lease_ttl"`
	// Timeout bounds each etcd request: past it the call fails closed. Default 5s.
	Timeout time.Duration `toml:"timeout"`
}

// Etcd reports whether the journal is on etcd.
func (j JournalConfig) Etcd() bool { return j.Backend == "etcd" }

func (j JournalConfig) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: journal: "+format, args...)) }
	switch j.Backend {
	case "", "pebble":
		if len(j.Endpoints) > 0 || j.CAFile != "" || j.CertFile != "" || j.KeyFile != "" || j.Prefix != "" {
			bad("endpoints, ca_file, cert_file, key_file and prefix are for backend = \"etcd\"")
		}
		return errs
	case "etcd":
	default:
		bad("backend %q: want \"pebble\" or \"etcd\"", j.Backend)
		return errs
	}
	if len(j.Endpoints) == 0 {
		bad("backend \"etcd\" needs endpoints (the etcd members' client URLs)")
	}
	secure := false
	for _, ep := range j.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("endpoint %q: want http://host:port or https://host:port", ep)
			continue
		}
		secure = secure || u.Scheme == "https"
	}
	if (j.CertFile == "") != (j.KeyFile == "") {
		bad("cert_file and key_file go together")
	}
	if !secure && (j.CAFile != "" || j.CertFile != "") {
		bad("ca_file, cert_file and key_file need https endpoints")
	}
	for _, f := range []string{j.CAFile, j.CertFile, j.KeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			bad("%v", err)
		}
	}
	if j.LeaseTTL != 0 && (j.LeaseTTL < 2*time.Second || j.LeaseTTL%time.Second != 0) {
		bad("lease_ttl must be whole seconds, at least 2s, got %v", j.LeaseTTL)
	}
	if j.Timeout < 0 {
		bad("timeout must not be negative")
	}
	return errs
}

// openJournal opens the configured journal.
func openJournal(cfg Config, signer note.Signer, retention map[string]time.Duration, log *slog.Logger, now func() time.Time) (markers.JournalStore, error) {
	mo := markers.Options{
		Graph:         markers.JournalGraph,
		Signer:        signer,
		Origin:        "postern bastion journal",
		MemTableBytes: markers.JournalMemTableBytes,
		CacheBytes:    markers.JournalCacheBytes,
		PresenceKeys:  markers.JournalPresenceKeys,
		MaxOpenFiles:  1000,
		Retention:     retention,
		Logger:        log.With("component", "journal"),
		Now:           now,
	}
	if !cfg.Journal.Etcd() {
		return markers.Open(cfg.journalDir(), mo)
	}
	return OpenEtcdJournal(cfg.Journal, mo)
}

// etcdJournal is the etcd journal with the client it owns.
type etcdJournal struct {
	*etcdjournal.Journal
	cli *clientv3.Client
}

func (e etcdJournal) Close() error { return errors.Join(e.Journal.Close(), e.cli.Close()) }

// OpenEtcdJournal connects to the etcd cluster of jc and opens the journal under its prefix
// (read-only with mo.ReadOnly: for verify and copy). It fails if no quorum answers in time.
func OpenEtcdJournal(jc JournalConfig, mo markers.Options) (markers.JournalStore, error) {
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
		LeaseTTL: jc.LeaseTTL, OpTimeout: jc.Timeout,
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

// OpenJournalReadOnly opens the configured journal for reading (export, verify, copy) while
// no bastion of this state dir serves (Pebble locks its dir); an etcd journal may be read
// while replicas serve it.
func OpenJournalReadOnly(cfg Config, log *slog.Logger) (markers.JournalStore, error) {
	mo := markers.Options{ReadOnly: true, Graph: markers.JournalGraph, Logger: log}
	if cfg.Journal.Etcd() {
		return OpenEtcdJournal(cfg.Journal, mo)
	}
	return markers.Open(cfg.journalDir(), mo)
}
