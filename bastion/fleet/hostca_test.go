package fleet

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
)

// signHostCert certifies hostKey with ca, as ssh-keygen -s ca -h -n principals -V would.
func signHostCert(t testing.TB, ca gossh.Signer, hostKey gossh.PublicKey, serial uint64, principals []string, after, before time.Time) *gossh.Certificate {
	t.Helper()
	cert := &gossh.Certificate{
		Key: hostKey, Serial: serial, CertType: gossh.HostCert, KeyId: "test",
		ValidPrincipals: principals, ValidAfter: uint64(after.Unix()), ValidBefore: uint64(before.Unix()),
	}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestCheckHostKey: what a host may present, case by case — the decision is a pure function
// of the host, the key, the CAs, the revocation list and the time.
func TestCheckHostKey(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ca, otherCA, hostKey, pinned := testutil.NewSSHKey(t), testutil.NewSSHKey(t), testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	cas := []HostCA{{Name: "prod", Key: ca.Public(), Hosts: []string{"db-*", "web1"}}, {Name: "other", Key: otherCA.Public(), Hosts: []string{"lab-*"}}}
	host := Host{Name: "db-1", Addr: "10.0.0.5:2222", Account: "postern", HostCA: true}
	valid := func(principals ...string) *gossh.Certificate {
		return signHostCert(t, ca.Signer, hostKey.Public(), 7, principals, now.Add(-time.Hour), now.Add(time.Hour))
	}
	userCert := valid("db-1")
	userCert.CertType = gossh.UserCert
	if err := userCert.SignCert(rand.Reader, ca.Signer); err != nil {
		t.Fatal(err)
	}
	tampered := *valid("db-1")
	tampered.ValidPrincipals = []string{"db-1", "db-2"} // changed after signing

	revocations := func(text string) *Revocations {
		path := filepath.Join(t.TempDir(), "revoked")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := OpenRevocations(path)
		if err != nil && text != "bad" {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		host    Host
		key     gossh.PublicKey
		revoked *Revocations
		want    string // "" accepted; else a substring of the error
	}{
		{name: "certificate for the enrolled name", host: host, key: valid("db-1")},
		{name: "certificate for the address's host", host: host, key: valid("10.0.0.5")},
		{name: "certificate for another host", host: host, key: valid("db-2"), want: `is for "db-2", not for db-1 or 10.0.0.5: re-sign it with ssh-keygen -s CA -h -n db-1`},
		{name: "expired", host: host, key: signHostCert(t, ca.Signer, hostKey.Public(), 7, []string{"db-1"}, now.Add(-2*time.Hour), now.Add(-time.Hour)), want: "expired at 2026-12-01T11:00:00Z: re-sign"},
		{name: "not yet valid", host: host, key: signHostCert(t, ca.Signer, hostKey.Public(), 7, []string{"db-1"}, now.Add(time.Hour), now.Add(2*time.Hour)), want: "not valid before"},
		{name: "untrusted CA", host: host, key: signHostCert(t, testutil.NewSSHKey(t).Signer, hostKey.Public(), 7, []string{"db-1"}, now.Add(-time.Hour), now.Add(time.Hour)), want: "which no [[host_cas]] entry trusts for host db-1"},
		{name: "CA trusted for other hosts only", host: host, key: signHostCert(t, otherCA.Signer, hostKey.Public(), 7, []string{"db-1"}, now.Add(-time.Hour), now.Add(time.Hour)), want: "no [[host_cas]] entry trusts"},
		{name: "plain key where a certificate is needed", host: host, key: hostKey.Public(), want: "presents a plain host key"},
		{name: "user certificate", host: host, key: userCert, want: "user certificate"},
		{name: "signature does not verify", host: host, key: &tampered, want: "certificate"},
		{name: "serial revoked", host: host, key: valid("db-1"), revoked: revocations("# revoked\nserial 7\n"), want: "revoked"},
		{name: "CA revoked", host: host, key: valid("db-1"), revoked: revocations(gossh.FingerprintSHA256(ca.Public()) + "\n"), want: "revoked"},
		{name: "host key revoked", host: host, key: valid("db-1"), revoked: revocations(strings.TrimSpace(string(gossh.MarshalAuthorizedKey(hostKey.Public())))), want: "revocation list"},
		{name: "other entries revoked", host: host, key: valid("db-1"), revoked: revocations("serial 8\n" + gossh.FingerprintSHA256(pinned.Public()) + " # old key\n")},
		{name: "revocation list unusable", host: host, key: valid("db-1"), revoked: revocations("bad"), want: "every host is refused"},
		{name: "pinned key", host: Host{Name: "db-1", Addr: "10.0.0.5:2222", HostKey: pinned.Public()}, key: pinned.Public()},
		{name: "pinned key wins over a valid certificate", host: Host{Name: "db-1", Addr: "10.0.0.5:2222", HostKey: pinned.Public()}, key: valid("db-1"), want: ErrHostKeyMismatch.Error()},
		{name: "pinned key revoked", host: Host{Name: "db-1", Addr: "10.0.0.5:2222", HostKey: pinned.Public()}, key: pinned.Public(), revoked: revocations(gossh.FingerprintSHA256(pinned.Public())), want: "revocation list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckHostKey(tc.host, tc.key, cas, tc.revoked, now)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted; want refused with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q; want it to contain %q", err, tc.want)
			case err != nil && !errors.Is(err, ErrHostCertRefused) && !errors.Is(err, ErrHostKeyMismatch):
				t.Fatalf("error %v is neither ErrHostCertRefused nor ErrHostKeyMismatch", err)
			}
		})
	}
}

func TestParseRevocations(t *testing.T) {
	key := testutil.NewSSHKey(t)
	keys, serials, err := ParseRevocations([]byte("# header\n\nserial 12 # a comment\n  SHA256:" + strings.Repeat("A", 43) + "\n" + key.AuthorizedLine() + " old host\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !serials[12] || len(serials) != 1 || !keys["SHA256:"+strings.Repeat("A", 43)] || !keys[gossh.FingerprintSHA256(key.Public())] || len(keys) != 2 {
		t.Fatalf("keys %v, serials %v", keys, serials)
	}
	for _, bad := range []string{"serial x", "SHA256:short", "nonsense", "serial -1", "serial"} {
		if _, _, err := ParseRevocations([]byte("\n" + bad + "\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: err %v; want one naming line 2", bad, err)
		}
	}
}

func FuzzParseRevocations(f *testing.F) {
	f.Add([]byte("serial 1\nSHA256:" + strings.Repeat("A", 43) + "\n# c\n"))
	f.Add([]byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDx3 x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, serials, err := ParseRevocations(data)
		if err == nil && (keys == nil || serials == nil) {
			t.Fatal("nil sets without an error")
		}
	})
}

// TestPoolHostCertificate: over SSH on loopback, a host trusted through a CA is pooled on
// its certificate; the pooled connection is dropped, and the host refused, once the
// certificate is revoked or has expired.
func TestPoolHostCertificate(t *testing.T) {
	th := newTestHost(t)
	ca := testutil.NewSSHKey(t)
	now := time.Now()
	cert := signHostCert(t, ca.Signer, th.key.Public(), 42, []string{"web1"}, now.Add(-time.Minute), now.Add(time.Hour))
	signer, err := gossh.NewCertSigner(cert, th.key.Signer)
	if err != nil {
		t.Fatal(err)
	}
	th.set(func(th *testHost) { th.cert = signer })
	revokedFile := filepath.Join(t.TempDir(), "revoked")
	if err := os.WriteFile(revokedFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	revoked, err := OpenRevocations(revokedFile)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	p := th.newTestPool(t, func(o *PoolOptions) {
		o.HostCAs = []HostCA{{Name: "test", Key: ca.Public()}}
		o.Revoked = revoked
		o.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	})
	h := Host{Name: "web1", Addr: th.addr(), Account: "postern", HostCA: true}
	c, err := p.Conn(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := p.Conn(t.Context(), h); err != nil || again != c {
		t.Fatalf("Conn again = %v; want the pooled connection", err)
	}

	// Expired while pooled: dropped, and the redial refused for the same reason.
	clock.Store(now.Add(2 * time.Hour).UnixNano())
	if _, err := p.Conn(t.Context(), h); !errors.Is(err, ErrHostCertRefused) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Conn after expiry = %v; want refused, expired", err)
	}
	if !closed(c) || p.Connected("web1") {
		t.Fatal("the expired certificate's connection is still pooled")
	}

	// Valid again, then revoked while pooled.
	clock.Store(now.UnixNano())
	c, err = p.Conn(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(revokedFile, []byte("serial 42\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	future := now.Add(time.Second)
	os.Chtimes(revokedFile, future, future)
	if _, err := p.Conn(t.Context(), h); !errors.Is(err, ErrHostCertRefused) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("Conn after revocation = %v; want refused, revoked", err)
	}
	if !closed(c) {
		t.Fatal("the revoked certificate's connection is still open")
	}
}
