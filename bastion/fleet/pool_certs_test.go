package fleet

import (
	"crypto/rand"
	"slices"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
)

// TestPoolLogsInWithCertificates: with Certs set ([ssh_ca]) the pool logs in with the
// certificate it is handed for the account, and with nothing else (the host admits the
// static key too, and never sees it). A pooled connection made with an older certificate is
// reused after a newer one is issued; a new connection (another account here) logs in with
// the newest.
func TestPoolLogsInWithCertificates(t *testing.T) {
	th := newTestHost(t)
	ca := testutil.NewSSHKey(t)
	th.set(func(th *testHost) { th.userCA = ca.Public() })
	var mu sync.Mutex
	serial := uint64(1)
	var asked []string
	certs := func(account string) (gossh.Signer, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, account)
		key := testutil.NewSSHKey(t)
		cert := &gossh.Certificate{Key: key.Public(), Serial: serial, CertType: gossh.UserCert, ValidPrincipals: []string{"postern", "backup"},
			ValidAfter: 0, ValidBefore: gossh.CertTimeInfinity}
		if err := cert.SignCert(rand.Reader, ca.Signer); err != nil {
			return nil, err
		}
		return gossh.NewCertSigner(cert, key.Signer)
	}
	p := th.newTestPool(t, func(o *PoolOptions) { o.Signer, o.Certs = nil, certs })
	h := th.enrolled()
	first, err := p.Conn(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	serial = 2
	mu.Unlock()
	again, err := p.Conn(t.Context(), h)
	if err != nil || again != first {
		t.Fatalf("Conn after a newer certificate = %p, %v; want the pooled %p", again, err, first)
	}
	if _, err := p.Conn(t.Context(), h.As("backup")); err != nil {
		t.Fatal(err)
	}
	th.mu.Lock()
	serials := slices.Clone(th.certSerials)
	logins := th.logins
	th.mu.Unlock()
	if logins != 2 || !slices.Equal(serials, []uint64{1, 2}) {
		t.Fatalf("host saw %d logins with certificate serials %v; want 2 logins, serials [1 2] (no static key)", logins, serials)
	}
	if !slices.Equal(asked, []string{"postern", "backup"}) {
		t.Fatalf("certificates asked for %v; want one per dial, for its account", asked)
	}
}
