package hostagent_test

import (
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/testutil"
)

// TestRetiredCAClosesItsConnections: CA rotation as a host sees it. While the trusted CA
// file lists both the old and the new CA, certificates of either log in; once the old CA is
// dropped from the file (retired), a connection it let in is closed at the next key check,
// a new login with its certificate is refused, and the new CA's connection goes on. A
// certificate that expires while its connection is open ends nothing (as in OpenSSH); a new
// login with it is refused.
func TestRetiredCAClosesItsConnections(t *testing.T) {
	ts := startServer(t, func(c *hostagent.Config) { c.KeyCheckInterval = 100 * time.Millisecond })
	oldCA, newCA := ts.ca, testutil.NewSSHKey(t)
	caFile := ts.cfg.TrustedUserCAKeysFile
	testutil.WriteAuthorizedKeys(t, caFile, oldCA.AuthorizedLine(), newCA.AuthorizedLine())

	login := func(ca testutil.SSHKey, spec testutil.UserCert) (*gossh.Client, error) {
		key := testutil.NewSSHKey(t)
		return ts.dial(t, ts.account, gossh.PublicKeys(testutil.CertSigner(t, testutil.SignUserCert(t, ca, key.Public(), spec), key)))
	}
	spec := testutil.UserCert{KeyID: "postern-bastion replica=r1", Principals: []string{ts.account}}
	oldConn, err := login(oldCA, spec)
	if err != nil {
		t.Fatalf("login with the old CA's certificate during the overlap: %v", err)
	}
	defer oldConn.Close()
	newConn, err := login(newCA, spec)
	if err != nil {
		t.Fatalf("login with the new CA's certificate during the overlap: %v", err)
	}
	defer newConn.Close()
	// Valid for two seconds from now: it expires while its connection is open.
	shortSpec := spec
	shortSpec.ValidAfter, shortSpec.ValidBefore = time.Now().Add(-time.Minute), time.Now().Add(2*time.Second)
	shortKey := testutil.NewSSHKey(t)
	shortCert := testutil.SignUserCert(t, newCA, shortKey.Public(), shortSpec)
	shortConn, err := ts.dial(t, ts.account, gossh.PublicKeys(testutil.CertSigner(t, shortCert, shortKey)))
	if err != nil {
		t.Fatalf("login with a certificate valid two more seconds: %v", err)
	}
	defer shortConn.Close()

	testutil.WriteAuthorizedKeys(t, caFile, newCA.AuthorizedLine())
	closed := make(chan error, 1)
	go func() { closed <- oldConn.Wait() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the retired CA's connection is still open")
	}
	if _, err := login(oldCA, spec); err == nil {
		t.Fatal("a new login with the retired CA's certificate succeeded")
	}
	testutil.WaitFor(t, "the short certificate to expire", func() bool {
		return time.Now().After(time.Unix(int64(shortCert.ValidBefore), 0).Add(time.Second))
	})
	if _, err := ts.dial(t, ts.account, gossh.PublicKeys(testutil.CertSigner(t, shortCert, shortKey))); err == nil {
		t.Fatal("a new login with an expired certificate succeeded")
	}
	for name, c := range map[string]*gossh.Client{"new CA": newConn, "expired since login": shortConn} {
		if got := run(t, c, withID(), "echo still"); got.status != 0 || got.stdout != "still\n" {
			t.Errorf("the %s connection after the rotation: %+v; want it working", name, got)
		}
	}
}
