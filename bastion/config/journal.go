package config

import (
	"fmt"
	"net/url"
	"os"
	"time"
)

// Journal chooses the journal's backend: Pebble in the state dir (the default, one
// bastion), or etcd (N bastion replicas serving one fleet: docs/replicas.md).
type Journal struct {
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
	// QuotaBytes is the members' backend quota (their --quota-backend-bytes), which doctor
	// and /metrics report use against. Default 2 GiB, etcd's default.
	QuotaBytes int64 `toml:"quota_bytes"`
	// CompactionLag is how much recent revision history the retention pass keeps when it
	// compacts etcd's: an export or a copy that takes longer fails (and is run again).
	// Default 5m.
	CompactionLag time.Duration `toml:"compaction_lag"`
}

// Etcd reports whether the journal is on etcd.
func (j Journal) Etcd() bool { return j.Backend == "etcd" }

func (j Journal) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: journal: "+format, args...)) }
	switch j.Backend {
	case "", "pebble":
		if len(j.Endpoints) > 0 || j.CAFile != "" || j.CertFile != "" || j.KeyFile != "" || j.Prefix != "" || j.QuotaBytes != 0 || j.CompactionLag != 0 {
			bad("endpoints, ca_file, cert_file, key_file, prefix, quota_bytes and compaction_lag are for backend = \"etcd\"")
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
	if j.QuotaBytes < 0 || j.CompactionLag < 0 {
		bad("quota_bytes and compaction_lag must not be negative")
	}
	return errs
}
