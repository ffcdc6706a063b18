package hostagent_test

import (
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/testutil"
)

// writeHostCert writes a host certificate of hostKey, signed by ca, to path (the
// *-cert.pub form), with a new modification time.
func writeHostCert(t *testing.T, path string, ca testutil.SSHKey, hostKey gossh.PublicKey, serial uint64, certType uint32) {
	t.Helper()
	cert := &gossh.Certificate{Key: hostKey, Serial: serial, CertType: certType, KeyId: "h", ValidPrincipals: []string{"db-1"},
		ValidAfter: uint64(time.Now().Add(-time.Minute).Unix()), ValidBefore: uint64(time.Now().Add(time.Hour).Unix())}
	if err := cert.SignCert(rand.Reader, ca.Signer); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, gossh.MarshalAuthorizedKey(cert), 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Duration(serial) * time.Second)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
}

// presented dials ts asking for algos and returns the host key (or certificate) it shows.
func presented(t *testing.T, ts *testServer, algos []string) gossh.PublicKey {
	t.Helper()
	var got gossh.PublicKey
	conn, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, _, _, err := gossh.NewClientConn(conn, ts.addr, &gossh.ClientConfig{
		User: ts.account, Auth: []gossh.AuthMethod{gossh.PublicKeys(ts.key.Signer)}, HostKeyAlgorithms: algos,
		HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error { got = key; return nil },
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	return got
}

// TestHostCertificate: with host_certificate_file the hostagent presents its certificate to
// a client that asks for one and its plain key to one that pinned it; a renewed certificate
// is presented from the next connection on, without a restart.
func TestHostCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, hostKey := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	keyFile := hostKey.WritePrivateKey(t, filepath.Join(dir, "host_key"))
	certFile := filepath.Join(dir, "host_key-cert.pub")
	writeHostCert(t, certFile, ca, hostKey.Public(), 1, gossh.HostCert)
	ts := startServer(t, func(c *hostagent.Config) { c.HostKeyFile, c.HostCertificateFile = keyFile, certFile })

	cert, ok := presented(t, ts, []string{gossh.CertAlgoED25519v01}).(*gossh.Certificate)
	if !ok || cert.Serial != 1 {
		t.Fatalf("presented %v; want the certificate of serial 1", cert)
	}
	if key := presented(t, ts, []string{gossh.KeyAlgoED25519}); string(key.Marshal()) != string(hostKey.Public().Marshal()) {
		t.Fatalf("a client that pinned the key was shown %s", key.Type())
	}
	writeHostCert(t, certFile, ca, hostKey.Public(), 2, gossh.HostCert)
	if cert := presented(t, ts, []string{gossh.CertAlgoED25519v01}).(*gossh.Certificate); cert.Serial != 2 {
		t.Fatalf("after the renewal, serial %d; want 2", cert.Serial)
	}
	// A renewal that does not load keeps the last good certificate.
	if err := os.WriteFile(certFile, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cert := presented(t, ts, []string{gossh.CertAlgoED25519v01}).(*gossh.Certificate); cert.Serial != 2 {
		t.Fatalf("after a bad renewal, serial %d; want the previous 2", cert.Serial)
	}
}

// TestHostCertificateRefused: a certificate that is not for the host key, or not a host
// certificate, stops the hostagent from starting, saying why.
func TestHostCertificateRefused(t *testing.T) {
	dir := t.TempDir()
	ca, hostKey := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	keyFile := hostKey.WritePrivateKey(t, filepath.Join(dir, "host_key"))
	for _, tc := range []struct {
		name, want string
		write      func(path string)
	}{
		{"another key's", "certifies", func(p string) { writeHostCert(t, p, ca, testutil.NewSSHKey(t).Public(), 1, gossh.HostCert) }},
		{"a user certificate", "not a host certificate", func(p string) { writeHostCert(t, p, ca, hostKey.Public(), 1, gossh.UserCert) }},
		{"a plain key", "not a host certificate", func(p string) { os.WriteFile(p, []byte(hostKey.AuthorizedLine()), 0o600) }},
		{"missing", "no such file", func(string) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certFile := filepath.Join(t.TempDir(), "cert.pub")
			tc.write(certFile)
			cfg := hostagent.DefaultConfig()
			cfg.DataDir = filepath.Join(t.TempDir(), "data")
			cfg.AuthorizedKeysFile = filepath.Join(dir, "authorized_keys")
			cfg.AllowedAccounts = []string{currentUser(t)}
			cfg.HostKeyFile, cfg.HostCertificateFile = keyFile, certFile
			_, err := hostagent.NewServer(cfg, &testHandler{}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewServer = %v; want an error saying %q", err, tc.want)
			}
		})
	}
}
