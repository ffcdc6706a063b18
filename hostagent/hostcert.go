package hostagent

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// maxHostCertBytes bounds the host certificate file; an ed25519 host certificate is ~1 KiB.
const maxHostCertBytes = 64 << 10

// hostCert presents the host's SSH host certificate (Config.HostCertificateFile) besides its
// plain host key: a bastion that trusts a host CA asks for the certificate, one that pinned
// the key asks for the key. The file is read again when it changes, so a renewed certificate
// is presented from the next connection on; one that does not load keeps the last good one
// (and is logged), since refusing every bastion over a botched renewal helps no one.
type hostCert struct {
	path    string
	hostKey gossh.Signer
	log     *slog.Logger

	mu     sync.Mutex // guards the fields below
	signer gossh.Signer
	mod    time.Time
	size   int64
}

// newHostCert loads the certificate at path for hostKey; it must load now.
func newHostCert(path string, hostKey gossh.Signer, log *slog.Logger) (*hostCert, error) {
	hc := &hostCert{path: path, hostKey: hostKey, log: log}
	if err := hc.reload(); err != nil {
		return nil, err
	}
	return hc, nil
}

// current is the certificate's signer, re-read first if the file changed.
func (hc *hostCert) current() gossh.Signer {
	if err := hc.reload(); err != nil {
		hc.log.Error("host certificate not reloaded: presenting the previous one", "file", hc.path, "err", err)
	}
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.signer
}

func (hc *hostCert) reload() error {
	info, err := os.Stat(hc.path)
	if err != nil {
		return fmt.Errorf("hostagent: host_certificate_file: %w", err)
	}
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.signer != nil && info.ModTime().Equal(hc.mod) && info.Size() == hc.size {
		return nil
	}
	signer, err := loadHostCert(hc.path, hc.hostKey)
	if err != nil {
		return err
	}
	hc.signer, hc.mod, hc.size = signer, info.ModTime(), info.Size()
	return nil
}

// loadHostCert reads an OpenSSH host certificate (ssh-keygen -s CA -h …, the *-cert.pub
// file) for hostKey and returns the signer that presents it.
func loadHostCert(path string, hostKey gossh.Signer) (gossh.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hostagent: host_certificate_file: %w", err)
	}
	if len(data) > maxHostCertBytes {
		return nil, fmt.Errorf("hostagent: host_certificate_file %s: larger than %d bytes", path, maxHostCertBytes)
	}
	key, _, _, _, err := gossh.ParseAuthorizedKey(data)
	if err != nil {
		return nil, fmt.Errorf("hostagent: host_certificate_file %s: %w", path, err)
	}
	cert, ok := key.(*gossh.Certificate)
	if !ok || cert.CertType != gossh.HostCert {
		return nil, fmt.Errorf("hostagent: host_certificate_file %s: not a host certificate (sign the host key with ssh-keygen -s CA -h)", path)
	}
	if !bytes.Equal(cert.Key.Marshal(), hostKey.PublicKey().Marshal()) {
		return nil, fmt.Errorf("hostagent: host_certificate_file %s certifies %s, not this host's key %s: sign %s.pub",
			path, gossh.FingerprintSHA256(cert.Key), gossh.FingerprintSHA256(hostKey.PublicKey()), "the host key")
	}
	signer, err := gossh.NewCertSigner(cert, hostKey)
	if err != nil {
		return nil, fmt.Errorf("hostagent: host_certificate_file %s: %w", path, err)
	}
	return signer, nil
}
