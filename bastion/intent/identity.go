// Package intent is what makes two calls the same intent: the canonical action record and
// its HMAC fingerprint (docs/design.md, "Three identifiers, never mixed" and "Canonical
// action record"), the intent scope of a call, and the matching rule that decides whether a
// call joins a prior execution or starts a new one (recover_or_attach). Everything here is a
// pure function of its arguments, except the fingerprint key's file.
//
// Invariants: no secret enters an action record (credentials only by reference); the
// fingerprint never leaves the bastion; a keyed call is matched by its key alone.
//
// The fingerprint is HMAC-SHA256, keyed by a per-installation secret, over the RFC 8785
// canonical JSON of the action record — never over request bytes, so formatting, key order,
// JSON-RPC ids and progress tokens cannot make one intent look like two. Every field is
// always present (defaults materialized), and no secret ever enters the record: credentials
// appear only as references.
package intent

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gowebpki/jcs"

	"github.com/postern-dev/postern/internal/durable"
)

// ActionRecord is the canonical description of one intended effect. Two requests with the
// same record (and the same actor and scope, which it contains) are the same intent.
type ActionRecord struct {
	Actor   string   `json:"actor"`
	Tool    string   `json:"tool"`
	Channel string   `json:"channel"`
	Target  string   `json:"target"`
	Account string   `json:"account"`
	Command []string `json:"command"`
	Cwd     string   `json:"cwd"`
	// Env holds the variables the action sets (never secrets).
	Env           map[string]string `json:"env"`
	CredentialRef string            `json:"credential_ref"`
	Method        string            `json:"method"`
	// Arguments are the remaining tool arguments that change the effect, secrets already
	// replaced by their references.
	Arguments   map[string]any `json:"arguments"`
	IntentScope string         `json:"intent_scope"`
}

// SSHTarget names a host as it enters a record: inventory name plus pinned host key, so the
// same command on a re-keyed or different host is a different intent.
func SSHTarget(host, hostKeyType, hostKeyFingerprint string) string {
	return "host:" + host + " " + hostKeyType + " " + hostKeyFingerprint
}

// Canonical returns the record's RFC 8785 canonical JSON. Nil collections are written as
// empty ones, so an absent env and an empty env are the same intent.
func (a ActionRecord) Canonical() ([]byte, error) {
	if a.Command == nil {
		a.Command = []string{}
	}
	if a.Env == nil {
		a.Env = map[string]string{}
	}
	if a.Arguments == nil {
		a.Arguments = map[string]any{}
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("bastion: encode action record: %w", err)
	}
	canon, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("bastion: canonicalize action record: %w", err)
	}
	return canon, nil
}

// FingerprintPrefix starts every intent fingerprint.
const FingerprintPrefix = "hmac-sha256:"

const fingerprintKeyBytes = 32

// Fingerprinter computes intent fingerprints with the installation's secret key.
type Fingerprinter struct{ key []byte }

// LoadOrCreateFingerprintKey reads the installation's fingerprint key from path (hex, 0600),
// generating it from crypto/rand on first use. The key never leaves the bastion.
func LoadOrCreateFingerprintKey(path string) (*Fingerprinter, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := make([]byte, fingerprintKeyBytes)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("bastion: generate fingerprint key: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("bastion: fingerprint key dir: %w", err)
		}
		err := durable.CreateFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("bastion: write fingerprint key: %w", err)
		}
		// Whoever created it first, the file is the key.
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("bastion: read fingerprint key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("bastion: read fingerprint key: %w", err)
	}
	return parseFingerprintKey(path, data)
}

// ReadFingerprintKey reads the installation's fingerprint key, never creating it: for
// reading the journal while the bastion is down (a fleet run finds its hosts' executions by
// their fingerprints).
func ReadFingerprintKey(path string) (*Fingerprinter, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bastion: read fingerprint key: %w", err)
	}
	return parseFingerprintKey(path, data)
}

func parseFingerprintKey(path string, data []byte) (*Fingerprinter, error) {
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != fingerprintKeyBytes {
		return nil, fmt.Errorf("bastion: fingerprint key %s is not %d hex-encoded bytes", path, fingerprintKeyBytes)
	}
	return &Fingerprinter{key: key}, nil
}

// Fingerprint returns "hmac-sha256:<hex>" of the record's canonical JSON.
func (f *Fingerprinter) Fingerprint(a ActionRecord) (string, error) {
	canon, err := a.Canonical()
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, f.key)
	mac.Write(canon)
	return FingerprintPrefix + hex.EncodeToString(mac.Sum(nil)), nil
}
