package config

import (
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/BurntSushi/toml"
)

// SSHCA is [ssh_ca]: the bastion as its hosts' SSH user certificate authority
// (docs/ssh-ca.md). Enabled, the bastion logs in to hosts only with short-lived user
// certificates its CA signs (bastion/sshca), never with its static key.
type SSHCA struct {
	// Enabled turns the CA on. Default false: the bastion logs in with its static key
	// (client_key_file), which hosts authorize.
	Enabled bool `toml:"enabled"`
	// KeyDir holds the CA's keys (ca-N, 0600), its state (ca.json) and event log
	// (events.jsonl). Replicas must share it, or get copies after each rotation. Default
	// <state_dir>/ssh_ca.
	KeyDir string `toml:"key_dir"`
	// CertLifetime is how long each certificate is valid; it is renewed at two thirds of
	// it. Default 1h; 1m..24h.
	CertLifetime time.Duration `toml:"cert_lifetime"`
	// RotationOverlap is how long after `postern ca rotate` the new CA key starts signing:
	// the time to make every host trust it. Default 24h; at most 90 days; `postern ca rotate
	// --overlap` overrides it.
	RotationOverlap time.Duration `toml:"rotation_overlap"`
	// SourceAddresses, if set, restrict where the certificates may be used from (their
	// source-address critical option): the bastion's addresses or CIDR blocks. Default
	// none: anywhere.
	SourceAddresses []string `toml:"source_addresses"`
}

// Defaults and bounds of [ssh_ca].
const (
	defaultCertLifetime    = time.Hour
	defaultRotationOverlap = 24 * time.Hour
	minCertLifetime        = time.Minute
	maxCertLifetime        = 24 * time.Hour
	maxRotationOverlap     = 90 * 24 * time.Hour
)

// SSHCADir is where the SSH CA's keys and state live.
func (c Config) SSHCADir() string { return c.orState(c.SSHCA.KeyDir, "ssh_ca") }

// sshCADurationProblems: [ssh_ca] durations must be strings (an integer would read as
// nanoseconds).
func sshCADurationProblems(md toml.MetaData) []error {
	var errs []error
	for _, key := range []string{"cert_lifetime", "rotation_overlap"} {
		if md.IsDefined("ssh_ca", key) && md.Type("ssh_ca", key) != "String" {
			errs = append(errs, fmt.Errorf(`config: ssh_ca.%s: must be a duration string such as "1h"`, key))
		}
	}
	return errs
}

func (s SSHCA) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: ssh_ca: "+format, args...)) }
	if s.KeyDir != "" && !filepath.IsAbs(s.KeyDir) {
		bad("key_dir must be an absolute path, got %q", s.KeyDir)
	}
	if s.CertLifetime < minCertLifetime || s.CertLifetime > maxCertLifetime {
		bad("cert_lifetime must be in %v..%v, got %v", minCertLifetime, maxCertLifetime, s.CertLifetime)
	}
	if s.RotationOverlap < 0 || s.RotationOverlap > maxRotationOverlap {
		bad("rotation_overlap must be in 0s..%v, got %v", maxRotationOverlap, s.RotationOverlap)
	}
	for _, a := range s.SourceAddresses {
		if net.ParseIP(a) == nil {
			if _, _, err := net.ParseCIDR(a); err != nil {
				bad("source_addresses: %q is neither an IP address nor a CIDR block", a)
			}
		}
	}
	return errs
}
