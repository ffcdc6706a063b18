package config

import (
	"fmt"
	"path"

	gossh "golang.org/x/crypto/ssh"
)

// HostCA is a host certificate authority the bastion trusts ([[host_cas]]): a host enrolled
// with host_key = "@cert-authority" is accepted when it presents a host certificate this CA
// signed, valid now, for its enrolled name or its address's host (docs/inventory.md,
// "Host certificates").
type HostCA struct {
	// Name is what errors and logs call it. Default: the key's fingerprint.
	Name string `toml:"name"`
	// PublicKey is the CA's public key, as in its .pub file ("ssh-ed25519 AAAA… host-ca").
	PublicKey string `toml:"public_key"`
	// Hosts limits the enrolled host names it vouches for (patterns: "db-*", "*.prod").
	// Default: every host.
	Hosts []string `toml:"hosts"`
}

// Key is the CA's parsed public key (Validate has checked it parses).
func (ca HostCA) Key() (gossh.PublicKey, error) {
	key, _, _, _, err := gossh.ParseAuthorizedKey([]byte(ca.PublicKey))
	if err != nil {
		return nil, fmt.Errorf("public_key: want the CA's public key (the line of its .pub file): %w", err)
	}
	if _, ok := key.(*gossh.Certificate); ok {
		return nil, fmt.Errorf("public_key: a certificate, not a CA's key: give the key that signs (ssh-keygen -s)")
	}
	return key, nil
}

// DisplayName is Name, or the key's fingerprint.
func (ca HostCA) DisplayName() string {
	if ca.Name != "" {
		return ca.Name
	}
	if key, err := ca.Key(); err == nil {
		return gossh.FingerprintSHA256(key)
	}
	return "?"
}

func (c Config) validateHostCAs() []error {
	var errs []error
	names := map[string]bool{}
	for i, ca := range c.HostCAs {
		if _, err := ca.Key(); err != nil {
			errs = append(errs, fmt.Errorf("config: host_cas[%d]: %w", i, err))
		}
		if ca.Name != "" && !actorName.MatchString(ca.Name) {
			errs = append(errs, fmt.Errorf("config: host_cas[%d]: name %q: want 1-64 of [A-Za-z0-9_.-]", i, ca.Name))
		}
		if ca.Name != "" && names[ca.Name] {
			errs = append(errs, fmt.Errorf("config: host_cas[%d]: duplicate name %q", i, ca.Name))
		}
		names[ca.Name] = true
		for _, p := range ca.Hosts {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				errs = append(errs, fmt.Errorf("config: host_cas[%d]: hosts: %q is not a pattern of host names (db-*, *.prod)", i, p))
			}
		}
	}
	return errs
}
