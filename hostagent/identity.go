package hostagent

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/postern-dev/postern/markers"
)

// maxCertKeyIDBytes bounds a certificate key id that names an identity; it is stored in every
// marker the identity creates.
const maxCertKeyIDBytes = 256

// ErrBadKeyID: a certificate's key id cannot name an identity (too long, or control
// characters); the certificate authority must issue another.
var ErrBadKeyID = errors.New("certificate key id unusable as an identity")

// Identity is who sends a request over SSH: the local account it logged in as and the key
// that signed the login — or, for a user certificate, the certificate's key id, so that a
// certificate renewed with a new key stays the same identity.
//
// An execution belongs to the identity that created it (docs/design.md, "The hostagent"). The
// marker records it as Account plus Actor: "cert:<key id>" for a certificate, "key:<SHA256
// fingerprint>" for a plain key. Another identity is told nothing about it.
type Identity struct {
	// Account is the SSH user name, the local account (for a certificate: the principal it
	// was accepted for).
	Account string
	// Fingerprint is the SHA256 fingerprint of the key that signed the login (for a
	// certificate, of the certified key).
	Fingerprint string
	// KeyID is the certificate's key id; "" for a plain key.
	KeyID string
}

// newIdentity is the identity of a login as account with the verified key auth.
func newIdentity(account string, auth authIdentity) (Identity, error) {
	id := Identity{Account: account, Fingerprint: auth.Fingerprint, KeyID: auth.CertKeyID}
	if err := checkKeyID(id.KeyID); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// checkKeyID accepts a key id of at most maxCertKeyIDBytes of UTF-8 without control
// characters ("" is a plain key, or a certificate without key id).
func checkKeyID(keyID string) error {
	if len(keyID) > maxCertKeyIDBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrBadKeyID, len(keyID), maxCertKeyIDBytes)
	}
	if !utf8.ValidString(keyID) {
		return fmt.Errorf("%w: not UTF-8", ErrBadKeyID)
	}
	for _, r := range keyID {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: contains control characters", ErrBadKeyID)
		}
	}
	return nil
}

// Actor is how markers record the identity next to its account: "cert:<key id>" for a
// certificate with a key id, else "key:<fingerprint>".
func (id Identity) Actor() string {
	if id.KeyID != "" {
		return "cert:" + id.KeyID
	}
	return keyActor(id.Fingerprint)
}

func keyActor(fingerprint string) string { return "key:" + fingerprint }

// owner is the identity an execution belongs to, as its marker records it.
type owner struct{ account, actor string }

func ownerOf(rec *markers.Record) owner { return owner{account: rec.Account, actor: rec.Actor} }

func (id Identity) owner() owner { return owner{account: id.Account, actor: id.Actor()} }

// owns reports whether an execution of o belongs to id: same account, and the same
// certificate key id or the same signing key. The signing key always matches: whoever holds
// it is the identity that created a "key:" marker, including one a certificate on that key
// created before markers recorded key ids.
func (id Identity) owns(o owner) bool {
	return o.account == id.Account && (o.actor == id.Actor() || o.actor == keyActor(id.Fingerprint))
}

// ownsRecord is owns for a marker.
func (id Identity) ownsRecord(rec *markers.Record) bool { return id.owns(ownerOf(rec)) }
