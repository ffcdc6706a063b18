package hostagent

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/durable"
)

// maxHostKeyFileBytes bounds what LoadOrCreateHostKey reads; an OpenSSH ed25519 key is ~400 bytes.
const maxHostKeyFileBytes = 64 << 10

// LoadOrCreateHostKey returns the host key stored at path, generating a new ed25519 key there
// (mode 0600, OpenSSH private key format) on first use. Concurrent first starts agree on one
// key: the new key is written to a temporary file and linked into place only if path does not
// exist yet. A key file readable by group or others is refused, as sshd does.
func LoadOrCreateHostKey(path string) (gossh.Signer, error) {
	signer, err := loadHostKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return signer, err
	}
	if err := createHostKey(path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return loadHostKey(path)
}

// HostKeyFingerprint is the SHA256 fingerprint of a host key as OpenSSH prints it
// ("SHA256:…"), the value an operator compares when enrolling the host.
func HostKeyFingerprint(signer gossh.Signer) string {
	return gossh.FingerprintSHA256(signer.PublicKey())
}

func loadHostKey(path string) (gossh.Signer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("host key %s: permissions %#o are too open, want 0600", path, perm)
	}
	if info.Size() > maxHostKeyFileBytes {
		return nil, fmt.Errorf("host key %s: %d bytes is too large for a key", path, info.Size())
	}
	pemBytes := make([]byte, info.Size())
	if _, err := f.ReadAt(pemBytes, 0); err != nil {
		return nil, fmt.Errorf("host key %s: %w", path, err)
	}
	signer, err := gossh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("host key %s: %w", path, err)
	}
	return signer, nil
}

func createHostKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("host key: generate: %w", err)
	}
	block, err := gossh.MarshalPrivateKey(priv, "postern-hostagent")
	if err != nil {
		return fmt.Errorf("host key: encode: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".host_key-*")
	if err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600; the key is written and synced before it gets its name.
	if err := writePEMAndSync(tmp, block); err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	return durable.SyncDir(dir)
}

func marshalAuthorizedKey(signer gossh.Signer) []byte {
	return gossh.MarshalAuthorizedKey(signer.PublicKey())
}
