package sshca

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
)

// Bounds of [ssh_ca] cert_lifetime: long enough that renewing is rare work, short enough
// that a stolen certificate is worth little.
const (
	MinLifetime = time.Minute
	MaxLifetime = 24 * time.Hour
)

// Backdate is how far before its signing a certificate is valid, for hosts whose clock is
// behind the bastion's.
const Backdate = 2 * time.Minute

// CertSpec is what a user certificate says.
type CertSpec struct {
	// KeyID names who holds it: "postern-bastion replica=bastion-a" (it is in every host's
	// log of the login).
	KeyID  string
	Serial uint64
	// Principals are the accounts it may log in as; never empty (a certificate without
	// principals would be valid for every account).
	Principals []string
	// SourceAddresses, if any, restrict where it may be used from (the source-address
	// critical option: addresses and CIDR blocks).
	SourceAddresses []string
	// ValidAfter and ValidBefore bound its validity.
	ValidAfter, ValidBefore time.Time
}

// Sign makes a user certificate of key by ca. It grants no extension (no pty, no
// forwarding, no agent): the bastion runs commands only.
func Sign(ca gossh.Signer, key gossh.PublicKey, spec CertSpec) (*gossh.Certificate, error) {
	if len(spec.Principals) == 0 {
		return nil, errors.New("sshca: a certificate needs at least one principal")
	}
	for _, p := range spec.Principals {
		if !hostproto.ValidAccountName(p) {
			return nil, fmt.Errorf("sshca: principal %q is not an account name", p)
		}
	}
	if !spec.ValidBefore.After(spec.ValidAfter) {
		return nil, fmt.Errorf("sshca: valid_before %v is not after valid_after %v", spec.ValidBefore, spec.ValidAfter)
	}
	cert := &gossh.Certificate{
		Key:             key,
		Serial:          spec.Serial,
		CertType:        gossh.UserCert,
		KeyId:           spec.KeyID,
		ValidPrincipals: slices.Clone(spec.Principals),
		ValidAfter:      uint64(spec.ValidAfter.Unix()),
		ValidBefore:     uint64(spec.ValidBefore.Unix()),
	}
	if len(spec.SourceAddresses) > 0 {
		cert.CriticalOptions = map[string]string{"source-address": strings.Join(spec.SourceAddresses, ",")}
	}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		return nil, fmt.Errorf("sshca: sign: %w", err)
	}
	return cert, nil
}
