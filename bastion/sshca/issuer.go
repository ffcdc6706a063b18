package sshca

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// pollInterval is how often the renewal loop looks at ca.json between renewals, so a
// rotation made by `postern ca rotate` (to sign at once) or on another replica's copy is
// picked up without a restart.
const pollInterval = 10 * time.Second

// errNoPrincipals: no account to certify yet.
var errNoPrincipals = errors.New("sshca: no account to sign a certificate for (enroll a host first)")

// IssuerOptions configure an Issuer.
type IssuerOptions struct {
	Store *Store
	// KeyID names the holder in every certificate (the replica).
	KeyID string
	// Lifetime is each certificate's validity (besides Backdate). Required.
	Lifetime time.Duration
	// Principals are the accounts the certificate must cover, asked at every signing: the
	// enrolled accounts and the run-as accounts policy grants. An account a dial needs that
	// is not among them is added then (Signer).
	Principals func() []string
	// SourceAddresses restrict where the certificates may be used from; none: anywhere.
	SourceAddresses []string
	Logger          *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Issuer holds this replica's user certificate: a fresh in-memory ed25519 key signed by
// the CA's signing generation. Signer hands out the current one, signing a new one when it
// is missing, due for renewal, does not cover the account asked, or the signing generation
// changed; Run renews it at two thirds of its lifetime even when nothing dials. A
// connection made with an older certificate keeps working (the host checked it at login);
// new connections use the newest one.
type Issuer struct {
	opts IssuerOptions

	mu sync.Mutex // guards the fields below
	// cur is the certificate in force; nil before the first signing.
	cur *issued
	// lastSerial makes serials increase even if the clock repeats.
	lastSerial uint64
	// stamp is ca.json's identity when cur was signed: a change means a rotation or a
	// retirement to look at.
	stamp fileStamp
}

type issued struct {
	signer  gossh.Signer
	cert    *gossh.Certificate
	gen     Generation
	renewAt time.Time
}

type fileStamp struct {
	mod        time.Time
	size       int64
	dev, inode uint64
	ok         bool
}

// NewIssuer returns an issuer; nothing is signed until Signer or Run.
func NewIssuer(opts IssuerOptions) (*Issuer, error) {
	if opts.Store == nil || opts.Principals == nil {
		return nil, errors.New("sshca: an issuer needs a store and its principals")
	}
	if opts.Lifetime <= 0 {
		return nil, errors.New("sshca: an issuer needs a certificate lifetime")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Issuer{opts: opts}, nil
}

// Signer returns a signer presenting a certificate valid now for account, signing one
// first if needed (see Issuer). It offers nothing else: with the CA enabled, the bastion
// has no other key for hosts.
func (i *Issuer) Signer(account string) (gossh.Signer, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	now := i.opts.Now()
	covers := i.cur != nil && slices.Contains(i.cur.cert.ValidPrincipals, account)
	if covers && now.Before(i.cur.renewAt) && i.stateUnchangedLocked() {
		return i.cur.signer, nil
	}
	if err := i.renewLocked(now, account); err != nil {
		// A certificate that still covers the account serves until it expires: a CA file
		// unreadable for a moment must not cut the fleet off.
		if covers && now.Before(time.Unix(int64(i.cur.cert.ValidBefore), 0)) {
			i.opts.Logger.Error("ssh certificate not renewed; using the current one until it expires", "err", err,
				"valid_before", time.Unix(int64(i.cur.cert.ValidBefore), 0).UTC())
			return i.cur.signer, nil
		}
		return nil, err
	}
	return i.cur.signer, nil
}

// Current is the certificate in force, nil before the first.
func (i *Issuer) Current() *gossh.Certificate {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cur == nil {
		return nil
	}
	return i.cur.cert
}

// Run renews the certificate until ctx ends: at two thirds of its lifetime, when the
// signing generation changes (a rotation's signs_from came, or ca.json changed), and
// retrying a failed signing every poll. It returns when ctx ends.
func (i *Issuer) Run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(i.tick())
	}
}

// tick renews if due and says how long to sleep.
func (i *Issuer) tick() time.Duration {
	i.mu.Lock()
	defer i.mu.Unlock()
	now := i.opts.Now()
	due := i.cur == nil || !now.Before(i.cur.renewAt) || !i.stateUnchangedLocked()
	if !due && i.cur != nil {
		// The generation that signs may change by the clock alone (signs_from).
		if st, err := i.opts.Store.State(); err == nil {
			if g, ok := st.Signing(now); ok && g.ID != i.cur.gen.ID {
				due = true
			}
		}
	}
	if due {
		if err := i.renewLocked(now, ""); err != nil {
			level := slog.LevelError
			if errors.Is(err, errNoPrincipals) {
				level = slog.LevelDebug // no host enrolled yet: nothing to sign for
			}
			i.opts.Logger.Log(context.Background(), level, "ssh certificate not renewed; retrying", "err", err, "retry_in", pollInterval)
			return pollInterval
		}
	}
	sleep := min(i.cur.renewAt.Sub(now), pollInterval)
	if st, err := i.opts.Store.State(); err == nil {
		if p, ok := st.Pending(now); ok && p.SignsFrom.Sub(now) < sleep {
			sleep = p.SignsFrom.Sub(now)
		}
	}
	return max(sleep, 10*time.Millisecond)
}

// renewLocked signs a new certificate with the generation signing at now, for the
// principals asked (IssuerOptions.Principals) plus extra when not "": the account of a dial
// that the principals do not list yet (a host enrolled a moment ago).
func (i *Issuer) renewLocked(now time.Time, extra string) error {
	stamp := statStamp(i.opts.Store.StatePath())
	st, err := i.opts.Store.State()
	if err != nil {
		return err
	}
	gen, ok := st.Signing(now)
	if !ok {
		return fmt.Errorf("sshca: no CA generation signs at %s (postern ca status)", now.UTC().Format(time.RFC3339))
	}
	ca, err := i.opts.Store.Signer(gen)
	if err != nil {
		return err
	}
	principals := slices.Clone(i.opts.Principals())
	if extra != "" {
		principals = append(principals, extra)
	}
	slices.Sort(principals)
	principals = slices.Compact(principals)
	if len(principals) == 0 {
		return errNoPrincipals
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("sshca: generate key: %w", err)
	}
	sshPub, err := gossh.NewPublicKey(pub)
	if err != nil {
		return err
	}
	key, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		return err
	}
	serial := max(uint64(now.UnixNano()), i.lastSerial+1)
	cert, err := Sign(ca, sshPub, CertSpec{
		KeyID: i.opts.KeyID, Serial: serial, Principals: principals, SourceAddresses: i.opts.SourceAddresses,
		ValidAfter: now.Add(-Backdate), ValidBefore: now.Add(i.opts.Lifetime),
	})
	if err != nil {
		return err
	}
	signer, err := gossh.NewCertSigner(cert, key)
	if err != nil {
		return fmt.Errorf("sshca: %w", err)
	}
	i.lastSerial = serial
	i.cur = &issued{signer: signer, cert: cert, gen: gen, renewAt: now.Add(i.opts.Lifetime * 2 / 3)}
	i.stamp = stamp
	i.opts.Logger.Info("signed the bastion's ssh certificate", "key_id", cert.KeyId, "serial", serial,
		"principals", principals, "ca_generation", gen.ID, "ca", gen.Fingerprint,
		"valid_before", time.Unix(int64(cert.ValidBefore), 0).UTC(), "renew_at", i.cur.renewAt.UTC())
	return nil
}

// stateUnchangedLocked reports whether ca.json is the one cur was signed under.
func (i *Issuer) stateUnchangedLocked() bool {
	return statStamp(i.opts.Store.StatePath()) == i.stamp
}

func statStamp(path string) fileStamp {
	info, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	stamp := fileStamp{mod: info.ModTime(), size: info.Size(), ok: true}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		// Every change replaces ca.json (a rename): a new inode even within one mtime tick.
		stamp.dev, stamp.inode = uint64(st.Dev), st.Ino
	}
	return stamp
}
