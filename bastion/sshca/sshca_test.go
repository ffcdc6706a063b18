package sshca

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestStoreRotateRetire walks a CA through its life: the first generation signs at once;
// a rotation publishes the next one, which signs only after the overlap; retiring waits
// until the previous generation's certificates have expired, then deletes its key; every
// step is in the event log.
func TestStoreRotateRetire(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ssh_ca")
	s := Open(dir)
	if _, err := s.State(); !errors.Is(err, ErrNoCA) {
		t.Fatalf("State of an empty dir: %v, want ErrNoCA", err)
	}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st, created, err := s.Init(t0, "test")
	if err != nil || !created {
		t.Fatalf("Init: %v created=%v", err, created)
	}
	if _, created, err := s.Init(t0, "test"); err != nil || created {
		t.Fatalf("second Init: %v created=%v; want the CA kept", err, created)
	}
	for _, p := range []string{dir, filepath.Join(dir, "ca-1"), s.StatePath(), s.EventsPath()} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %#o; want nothing for group and others", p, info.Mode().Perm())
		}
	}
	g1, ok := st.Signing(t0)
	if !ok || g1.ID != 1 {
		t.Fatalf("Signing = %+v %v", g1, ok)
	}

	overlap := time.Hour
	g2, err := s.Rotate(t0.Add(time.Minute), overlap, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rotate(t0.Add(2*time.Minute), overlap, "test"); !errors.Is(err, ErrRotationPending) {
		t.Fatalf("second rotation during the overlap: %v, want ErrRotationPending", err)
	}
	st, _ = s.State()
	if got := len(st.Trusted()); got != 2 {
		t.Fatalf("trusted generations during the overlap: %d, want 2", got)
	}
	lines := st.TrustedLines()
	if !strings.Contains(lines, g1.PublicKey) || !strings.Contains(lines, g2.PublicKey) {
		t.Fatalf("TrustedLines lack a generation:\n%s", lines)
	}
	if g, _ := st.Signing(t0.Add(30 * time.Minute)); g.ID != 1 {
		t.Fatalf("during the overlap generation %d signs; want 1", g.ID)
	}
	switchAt := t0.Add(time.Minute + overlap)
	if g, _ := st.Signing(switchAt); g.ID != 2 {
		t.Fatalf("after the overlap generation %d signs; want 2", g.ID)
	}

	lifetime := time.Hour
	if _, err := s.Retire(switchAt.Add(time.Minute), lifetime, false, "test"); !errors.Is(err, ErrTooEarly) {
		t.Fatalf("retire while generation 1's certificates may be valid: %v, want ErrTooEarly", err)
	}
	retired, err := s.Retire(switchAt.Add(lifetime), lifetime, false, "test")
	if err != nil || len(retired) != 1 || retired[0].ID != 1 {
		t.Fatalf("Retire = %+v, %v", retired, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ca-1")); !os.IsNotExist(err) {
		t.Fatalf("retired key still on disk: %v", err)
	}
	st, _ = s.State()
	if tr := st.Trusted(); len(tr) != 1 || tr[0].ID != 2 {
		t.Fatalf("trusted after retiring: %+v", tr)
	}
	if _, err := s.Signer(st.Generations[0]); err == nil {
		t.Fatal("a retired generation still signs")
	}
	if _, err := s.Retire(switchAt.Add(2*lifetime), lifetime, false, "test"); !errors.Is(err, ErrNothingToRetire) {
		t.Fatalf("retire again: %v, want ErrNothingToRetire", err)
	}
	events, err := s.Events()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Event)
	}
	if want := []string{"created", "rotated", "retired"}; !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
}

// TestSignRefusesEmptyPrincipals: a certificate without principals would be valid as every
// account on a host whose server does not insist on one.
func TestSignRefusesEmptyPrincipals(t *testing.T) {
	ca, key := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	now := time.Now()
	spec := CertSpec{KeyID: "x", ValidAfter: now, ValidBefore: now.Add(time.Hour)}
	if _, err := Sign(ca.Signer, key.Public(), spec); err == nil {
		t.Fatal("signed a certificate without principals")
	}
	spec.Principals = []string{"root;rm"}
	if _, err := Sign(ca.Signer, key.Public(), spec); err == nil {
		t.Fatal("signed a principal that is not an account name")
	}
}

// clock is a settable clock for the issuer.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestIssuerCertificate: the certificate names the replica, covers the principals and the
// account a dial asks for, is backdated and bounded by the lifetime, and is signed by the
// generation signing; a new one is signed at two thirds of the lifetime, with a higher
// serial, and after a rotation's overlap by the new generation.
func TestIssuerCertificate(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "ssh_ca"))
	clk := &clock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	if _, _, err := s.Init(clk.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(IssuerOptions{Store: s, KeyID: "postern-bastion replica=r1", Lifetime: 30 * time.Minute,
		Principals: func() []string { return []string{"deploy", "app"} }, Logger: quiet(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := iss.Signer("backup")
	if err != nil {
		t.Fatal(err)
	}
	cert := signer.PublicKey().(*gossh.Certificate)
	if want := []string{"app", "backup", "deploy"}; !slices.Equal(cert.ValidPrincipals, want) {
		t.Errorf("principals %v, want %v", cert.ValidPrincipals, want)
	}
	if cert.KeyId != "postern-bastion replica=r1" || cert.CertType != gossh.UserCert {
		t.Errorf("key id %q type %d", cert.KeyId, cert.CertType)
	}
	if got, want := time.Unix(int64(cert.ValidAfter), 0), clk.Now().Add(-Backdate); !got.Equal(want) {
		t.Errorf("valid after %v, want %v", got, want)
	}
	if got, want := time.Unix(int64(cert.ValidBefore), 0), clk.Now().Add(30*time.Minute); !got.Equal(want) {
		t.Errorf("valid before %v, want %v", got, want)
	}
	if len(cert.Extensions) != 0 || len(cert.CriticalOptions) != 0 {
		t.Errorf("extensions %v, critical options %v; want none", cert.Extensions, cert.CriticalOptions)
	}
	st, _ := s.State()
	checker := gossh.CertChecker{IsUserAuthority: func(k gossh.PublicKey) bool {
		return gossh.FingerprintSHA256(k) == st.Generations[0].Fingerprint
	}, Clock: clk.Now}
	if err := checker.CheckCert("deploy", cert); err != nil {
		t.Fatalf("the certificate does not check: %v", err)
	}

	// Within two thirds of the lifetime the same certificate is handed out.
	clk.Add(19 * time.Minute)
	again, _ := iss.Signer("deploy")
	if again.PublicKey().(*gossh.Certificate).Serial != cert.Serial {
		t.Fatal("renewed before two thirds of the lifetime")
	}
	clk.Add(2 * time.Minute)
	renewed, _ := iss.Signer("deploy")
	if rc := renewed.PublicKey().(*gossh.Certificate); rc.Serial <= cert.Serial {
		t.Fatalf("after two thirds of the lifetime: serial %d, want above %d", rc.Serial, cert.Serial)
	}

	// A rotation signs with the new generation only after its overlap.
	g2, err := s.Rotate(clk.Now(), 5*time.Minute, "test")
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := iss.Signer("deploy"); !sameKey(c.PublicKey().(*gossh.Certificate).SignatureKey, st.Generations[0].PublicKey) {
		t.Fatal("signed by the new generation during the overlap")
	}
	clk.Add(5 * time.Minute)
	if tick := iss.tick(); tick <= 0 {
		t.Fatalf("tick slept %v", tick)
	}
	if c := iss.Current(); !sameKey(c.SignatureKey, g2.PublicKey) {
		t.Fatal("the renewal loop did not move to the new generation after the overlap")
	}
}

func sameKey(k gossh.PublicKey, line string) bool {
	want, _, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
	return err == nil && string(k.Marshal()) == string(want.Marshal())
}

// TestIssuerRunRenews: with a short lifetime, the loop signs a new certificate (a higher
// serial) on the real clock; it stops when its context ends.
func TestIssuerRunRenews(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "ssh_ca"))
	if _, _, err := s.Init(time.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(IssuerOptions{Store: s, KeyID: "r", Lifetime: 3 * time.Second,
		Principals: func() []string { return []string{"deploy"} }, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); iss.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testutil.WaitFor(t, "a first certificate", func() bool { return iss.Current() != nil })
	first := iss.Current()
	testutil.WaitFor(t, "a renewed certificate", func() bool { return iss.Current().Serial > first.Serial })
}

// TestStoreChangesAreSerialized: first starts racing on a shared key_dir make one CA, and
// racing rotations make one next generation (the others find it pending).
func TestStoreChangesAreSerialized(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ssh_ca")
	now := time.Now()
	var wg sync.WaitGroup
	created := make([]bool, 8)
	errs := make([]error, 8)
	for i := range created {
		wg.Go(func() { _, created[i], errs[i] = Open(dir).Init(now, "test") })
	}
	wg.Wait()
	n := 0
	for i := range created {
		if errs[i] != nil {
			t.Fatalf("Init %d: %v", i, errs[i])
		}
		if created[i] {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d racing Inits made a CA; want 1", n)
	}
	for i := range errs {
		wg.Go(func() { _, errs[i] = Open(dir).Rotate(now, time.Hour, "test") })
	}
	wg.Wait()
	rotated := 0
	for _, err := range errs {
		switch {
		case err == nil:
			rotated++
		case !errors.Is(err, ErrRotationPending):
			t.Fatalf("racing rotation: %v", err)
		}
	}
	st, err := Open(dir).State()
	if err != nil || rotated != 1 || len(st.Generations) != 2 {
		t.Fatalf("%d racing rotations succeeded, %d generations (%v); want 1, 2", rotated, len(st.Generations), err)
	}
}

// TestIssuerKeepsAValidCertificateWhenSigningFails: when the CA cannot sign (its key gone),
// a certificate that still covers the account serves until it expires; past that, or for an
// account it does not cover, the dial gets the error — never another key.
func TestIssuerKeepsAValidCertificateWhenSigningFails(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "ssh_ca"))
	clk := &clock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	if _, _, err := s.Init(clk.Now(), "test"); err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(IssuerOptions{Store: s, KeyID: "r", Lifetime: 30 * time.Minute,
		Principals: func() []string { return []string{"deploy"} }, Logger: quiet(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	first, err := iss.Signer("deploy")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(s.Dir(), "ca-1")); err != nil {
		t.Fatal(err)
	}
	clk.Add(25 * time.Minute) // due for renewal, still valid
	if again, err := iss.Signer("deploy"); err != nil || again != first {
		t.Fatalf("Signer while the CA cannot sign = %v, %v; want the current certificate", again, err)
	}
	if _, err := iss.Signer("other"); err == nil {
		t.Fatal("signed for an account the current certificate does not cover without a CA key")
	}
	clk.Add(10 * time.Minute) // expired
	if _, err := iss.Signer("deploy"); err == nil {
		t.Fatal("handed out an expired certificate")
	}
}

// TestSignSourceAddresses: source_addresses become the source-address critical option,
// which hosts enforce (the hostagent and sshd alike).
func TestSignSourceAddresses(t *testing.T) {
	ca, key := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	now := time.Now()
	cert, err := Sign(ca.Signer, key.Public(), CertSpec{KeyID: "x", Principals: []string{"deploy"},
		SourceAddresses: []string{"10.0.0.5", "10.1.0.0/16"}, ValidAfter: now, ValidBefore: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got := cert.CriticalOptions["source-address"]; got != "10.0.0.5,10.1.0.0/16" || len(cert.CriticalOptions) != 1 {
		t.Fatalf("critical options %v", cert.CriticalOptions)
	}
}
