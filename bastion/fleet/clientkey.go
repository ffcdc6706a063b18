package fleet

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/durable"
)

// LoadOrCreateClientKey reads the bastion's ed25519 SSH key at path (OpenSSH PEM),
// generating it on first use, and keeps its public key in path.pub (an authorized_keys line).
func LoadOrCreateClientKey(path string) (gossh.Signer, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, fmt.Errorf("bastion: generate client key: %w", gerr)
		}
		block, merr := gossh.MarshalPrivateKey(priv, "postern bastion")
		if merr != nil {
			return nil, fmt.Errorf("bastion: encode client key: %w", merr)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("bastion: client key dir: %w", err)
		}
		if err := durable.CreateFile(path, pem.EncodeToMemory(block), 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("bastion: write client key: %w", err)
		}
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("bastion: read client key: %w", err)
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("bastion: client key %s: %w", path, err)
	}
	// The public half, for operators: what every hostagent's authorized_keys file needs.
	line := gossh.MarshalAuthorizedKey(signer.PublicKey())
	if old, err := os.ReadFile(path + ".pub"); err != nil || !bytes.Equal(old, line) {
		if err := durable.WriteFile(path+".pub", line, 0o600); err != nil {
			return nil, fmt.Errorf("bastion: write client public key: %w", err)
		}
	}
	return signer, nil
}

// ReadClientKey reads the bastion's SSH key at path without creating or rewriting anything:
// for reading the hosts while the daemon is down.
func ReadClientKey(path string) (gossh.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bastion: read client key: %w", err)
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("bastion: client key %s: %w", path, err)
	}
	return signer, nil
}
