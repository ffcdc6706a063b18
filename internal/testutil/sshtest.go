package testutil

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// SSHKey is a generated ed25519 key pair.
type SSHKey struct {
	Signer  gossh.Signer
	Private ed25519.PrivateKey
}

// Public is the key's SSH public key.
func (k SSHKey) Public() gossh.PublicKey { return k.Signer.PublicKey() }

// AuthorizedLine is the key in authorized_keys format, without a trailing newline.
func (k SSHKey) AuthorizedLine() string {
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k.Public())))
}

// NewSSHKey generates an ed25519 key.
func NewSSHKey(t testing.TB) SSHKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatalf("signer: %v", err)
	}
	return SSHKey{Signer: signer, Private: priv}
}

// WritePrivateKey writes the key in OpenSSH format (mode 0600) for the ssh(1) client's -i
// and returns the path.
func (k SSHKey) WritePrivateKey(t testing.TB, path string) string {
	t.Helper()
	block, err := gossh.MarshalPrivateKey(k.Private, "test")
	if err != nil {
		t.Fatalf("marshal private key: %v", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatalf("write private key: %v", err)
	}
	return path
}

// WriteAuthorizedKeys writes lines (e.g. SSHKey.AuthorizedLine, optionally with options) to
// path, replacing it atomically so a concurrent reader never sees a partial file.
func WriteAuthorizedKeys(t testing.TB, path string, lines ...string) {
	t.Helper()
	WriteFileAtomic(t, path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// WriteFileAtomic writes data to a temporary file and renames it over path.
func WriteFileAtomic(t testing.TB, path string, data []byte, perm os.FileMode) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		t.Fatalf("create temp: %v", err)
	}
	if _, err := tmp.Write(data); err != nil {
		t.Fatalf("write %s: %v", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		t.Fatalf("chmod %s: %v", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatalf("close %s: %v", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatalf("rename to %s: %v", path, err)
	}
}

// UserCert describes a user certificate to sign. Zero ValidAfter/ValidBefore mean one hour
// before and after now.
type UserCert struct {
	KeyID           string
	Principals      []string
	ValidAfter      time.Time
	ValidBefore     time.Time
	CriticalOptions map[string]string
	Extensions      map[string]string
}

// SignUserCert certifies key with ca and returns the certificate.
func SignUserCert(t testing.TB, ca SSHKey, key gossh.PublicKey, spec UserCert) *gossh.Certificate {
	t.Helper()
	now := time.Now()
	if spec.ValidAfter.IsZero() {
		spec.ValidAfter = now.Add(-time.Hour)
	}
	if spec.ValidBefore.IsZero() {
		spec.ValidBefore = now.Add(time.Hour)
	}
	cert := &gossh.Certificate{
		Key:             key,
		CertType:        gossh.UserCert,
		KeyId:           spec.KeyID,
		ValidPrincipals: spec.Principals,
		ValidAfter:      uint64(spec.ValidAfter.Unix()),
		ValidBefore:     uint64(spec.ValidBefore.Unix()),
		Permissions: gossh.Permissions{
			CriticalOptions: spec.CriticalOptions,
			Extensions:      spec.Extensions,
		},
	}
	if err := cert.SignCert(rand.Reader, ca.Signer); err != nil {
		t.Fatalf("sign cert: %v", err)
	}
	return cert
}

// CertSigner authenticates with cert, whose private key is key.
func CertSigner(t testing.TB, cert *gossh.Certificate, key SSHKey) gossh.Signer {
	t.Helper()
	signer, err := gossh.NewCertSigner(cert, key.Signer)
	if err != nil {
		t.Fatalf("cert signer: %v", err)
	}
	return signer
}

// WriteCert writes cert in the format ssh(1) expects next to a private key (KEY-cert.pub).
func WriteCert(t testing.TB, path string, cert *gossh.Certificate) {
	t.Helper()
	if err := os.WriteFile(path, gossh.MarshalAuthorizedKey(cert), 0o600); err != nil {
		t.Fatalf("write cert: %v", err)
	}
}

// DialSSH connects to addr as user, pinning the server's host key. It returns the error so
// tests can assert refusals; the client is closed at test cleanup.
func DialSSH(t testing.TB, addr, user string, hostKey gossh.PublicKey, auth ...gossh.AuthMethod) (*gossh.Client, error) {
	t.Helper()
	client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{
		User:            user,
		Auth:            auth,
		HostKeyCallback: gossh.FixedHostKey(hostKey),
		Timeout:         30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { client.Close() })
	return client, nil
}

// MustDialSSH is DialSSH that fails the test on error.
func MustDialSSH(t testing.TB, addr, user string, hostKey gossh.PublicKey, auth ...gossh.AuthMethod) *gossh.Client {
	t.Helper()
	client, err := DialSSH(t, addr, user, hostKey, auth...)
	if err != nil {
		t.Fatalf("ssh dial %s as %s: %v", addr, user, err)
	}
	return client
}

// WriteKnownHosts writes a known_hosts file pinning hostKey for addr ("host:port") and
// returns its path.
func WriteKnownHosts(t testing.TB, path, addr string, hostKey gossh.PublicKey) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("known_hosts address %q: %v", addr, err)
	}
	line := "[" + host + "]:" + port + " " + string(gossh.MarshalAuthorizedKey(hostKey))
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatalf("write known_hosts: %v", err)
	}
	return path
}

// OpenSSHArgs are ssh(1) options for a non-interactive, strictly pinned connection that
// reads no user or system configuration: -F /dev/null, batch mode, only the given identity.
func OpenSSHArgs(knownHosts, identity, port string) []string {
	return []string{
		"-F", "/dev/null",
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityAgent=none",
		"-o", "ConnectTimeout=30",
		"-o", "LogLevel=ERROR",
		"-i", identity,
		"-p", port,
	}
}
