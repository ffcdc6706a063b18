package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/version"
)

// Host is an enrolled fleet machine: where its hostagent (or, without one, its sshd) listens,
// the account commands run as, and the host key recorded once at enrollment.
type Host struct {
	Name string
	Addr string // host:port of the hostagent
	// Account is the account commands run as: the one enrolled, or another one policy let a
	// call use (As).
	Account string
	// runAs: Account is not the enrolled one (As); the pool keeps its connection apart.
	runAs bool
	// HostKey is the key pinned at enrollment; nil when HostCA.
	HostKey gossh.PublicKey
	// HostCA: no key is pinned; the host proves itself with a host certificate of a
	// trusted host CA (hostca.go).
	HostCA bool
	// Cwd is where commands run when a call names none ("" = the account's home).
	Cwd string
	// Groups name sets of hosts for class rules.
	Groups []string
	// Description, Labels and OS tell agents what the host is (hosts_list): a line of text,
	// name=value labels such as env=prod or role=db, and the operating system. They decide
	// nothing (policy matches names and groups); see ValidateHostInfo for their bounds.
	Description string
	Labels      map[string]string
	OS          string
	// AcceptEnv mirrors the accept_env of the host's hostagent: the variables, besides LANG
	// and LC_*, an ssh_exec may set there (internal/envpolicy). The bastion refuses any other
	// name, which the host would drop.
	AcceptEnv []string
	// Guarantee is what the host promises about a lost outcome; "" is GuaranteeHostagent
	// (Level). ScriptSHA256 is the marker script's digest recorded at enrollment, for
	// GuaranteeMarkerScript (agentless.go).
	Guarantee    Guarantee
	ScriptSHA256 string
}

// As is h reached as account (the SSH user name, which the hostagent maps to the local
// account, within its allowed_accounts): h itself for "" or the enrolled account. The
// pool keeps one connection per host and account; the enrolled account's is the host's own
// (Connected, Protocol).
func (h Host) As(account string) Host {
	if account == "" || account == h.Account {
		return h
	}
	h.Account, h.runAs = account, true
	return h
}

// poolKey is where the pool keeps h's connection: the host's name for its enrolled
// account, name and account for another one (host names never contain a space).
func (h Host) poolKey() string {
	if h.runAs {
		return h.Name + " as " + h.Account
	}
	return h.Name
}

// ErrHostKeyMismatch: the host presented another key than the one enrolled. Nothing is sent
// to it; re-enrolling is an explicit operator decision.
var ErrHostKeyMismatch = errors.New("bastion: host key does not match the enrolled key")

// PoolOptions configure a Pool. Zero values take the documented defaults.
type PoolOptions struct {
	// Signer authenticates the bastion to hostagents with its static key. Required unless
	// Certs is set.
	Signer gossh.Signer
	// Certs, when set, is the only way the bastion authenticates ([ssh_ca]): the signer of
	// a user certificate valid now for the account dialed (bastion/sshca). A connection
	// keeps the certificate it logged in with; the next dial asks again.
	Certs func(account string) (gossh.Signer, error)
	// DialTimeout bounds connecting and the SSH handshake. Default 10s.
	DialTimeout time.Duration
	// KeepaliveInterval is how often an idle connection is probed. Default 15s.
	KeepaliveInterval time.Duration
	// KeepaliveTimeout is how long a probe may take before the connection is dropped (and
	// redialed on next use). Default 10s.
	KeepaliveTimeout time.Duration
	Logger           *slog.Logger
	// HostCAs are the host CAs whose certificates vouch for hosts enrolled with
	// host_key = "@cert-authority" (hostca.go).
	HostCAs []HostCA
	// Revoked is the revocation list of host keys and certificates; nil revokes nothing.
	Revoked *Revocations
	// Now is the clock certificates are checked against. Default time.Now.
	Now func() time.Time
}

// Pool keeps one SSH connection per host and account (Host.As), multiplexing sessions over it. A connection that
// fails a keepalive or breaks is dropped and redialed on the next use; host keys are checked
// strictly against the enrolled key on every dial.
type Pool struct {
	opts PoolOptions
	log  *slog.Logger

	ctx    context.Context // ended by Close; parent of the keepalive loops
	cancel context.CancelFunc
	wg     sync.WaitGroup // keepalive loops

	// mu guards conns, dialing, failing and closed, each keyed by Host.poolKey. Lock order: a host's dialing mutex
	// before mu (Conn holds the first while it dials, taking mu briefly).
	mu    sync.Mutex
	conns map[string]*pooledConn
	// dialing serializes dials per host, so concurrent callers share one connection.
	dialing map[string]*sync.Mutex
	// failing holds the hosts whose last dial failed: callers get that error without a new
	// dial until the backoff passes, so an unreachable host is not hammered.
	failing map[string]dialFailure
	closed  bool
}

type dialFailure struct {
	err   error
	fails int
	until time.Time
}

// Backoff after failed dials: 250ms, doubling, at most 30s.
const (
	minRedialBackoff = 250 * time.Millisecond
	maxRedialBackoff = 30 * time.Second
)

// ErrHostUnreachable: the host could not be reached (the dial or the handshake failed),
// now or recently: while the pool waits before dialing it again, Conn answers with the last
// failure, wrapped in this.
var ErrHostUnreachable = errors.New("bastion: host unreachable")

// ErrKeyRefused: the host answered, and refused the bastion's key (SSH public key
// authentication failed). Nothing was sent; only authorizing the key on the host helps.
var ErrKeyRefused = errors.New("bastion: the host refuses the bastion's key")

type pooledConn struct {
	client *gossh.Client
	// trust is what h trusted when it was dialed (its pinned key, or a CA); presented is the
	// key (or certificate) the host presented, checked again before each reuse.
	trust     string
	presented gossh.PublicKey
	// protocol is the host protocol version agreed when it connected (hostproto.SayHello).
	protocol int
}

// NewPool returns an empty pool.
func NewPool(opts PoolOptions) (*Pool, error) {
	if opts.Signer == nil && opts.Certs == nil {
		return nil, errors.New("bastion: pool needs a signer")
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.KeepaliveInterval == 0 {
		opts.KeepaliveInterval = 15 * time.Second
	}
	if opts.KeepaliveTimeout == 0 {
		opts.KeepaliveTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool{
		opts: opts, log: opts.Logger.With("component", "ssh-pool"), ctx: ctx, cancel: cancel,
		conns: map[string]*pooledConn{}, dialing: map[string]*sync.Mutex{}, failing: map[string]dialFailure{},
	}, nil
}

// Conn returns the pooled connection to h, dialing it if there is none. A connection made
// with another host key than h's (h was re-enrolled) is not reused.
func (p *Pool) Conn(ctx context.Context, h Host) (*gossh.Client, error) {
	if h.HostKey == nil && !h.HostCA {
		return nil, fmt.Errorf("bastion: host %s has no enrolled host key", h.Name)
	}
	key := h.poolKey()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("bastion: pool closed")
	}
	dial := p.dialing[key]
	if dial == nil {
		dial = &sync.Mutex{}
		p.dialing[key] = dial
	}
	p.mu.Unlock()

	dial.Lock()
	defer dial.Unlock()
	if c := p.current(h); c != nil {
		return c, nil
	}
	p.mu.Lock()
	failed, backingOff := p.failing[key]
	p.mu.Unlock()
	if backingOff && time.Now().Before(failed.until) && !errors.Is(failed.err, ErrHostKeyMismatch) && !errors.Is(failed.err, ErrHostCertRefused) {
		// The same error as the dial that failed, so callers read one answer for one cause;
		// when the next dial happens is the pool's business.
		return nil, failed.err
	}
	client, presented, protocol, err := p.dial(ctx, h)
	if err != nil {
		if ctx.Err() == nil {
			p.mu.Lock()
			f := p.failing[key]
			f.fails++
			f.err = err
			f.until = time.Now().Add(min(minRedialBackoff<<min(f.fails-1, 10), maxRedialBackoff))
			p.failing[key] = f
			p.mu.Unlock()
		}
		return nil, err
	}
	p.mu.Lock()
	delete(p.failing, key)
	p.mu.Unlock()
	pc := &pooledConn{client: client, trust: h.trust(), presented: presented, protocol: protocol}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		client.Close()
		return nil, errors.New("bastion: pool closed")
	}
	p.conns[key] = pc
	// Added under mu, with closed checked: Close (which sets closed under mu, then waits)
	// either sees this loop or stops it from starting.
	p.wg.Add(1)
	p.mu.Unlock()
	go p.keepalive(key, pc)
	return client, nil
}

// Invalidate drops c if it is still the pooled connection to h (as its account): a call on
// it failed in a way that suggests the connection is gone, so the next use redials.
func (p *Pool) Invalidate(h Host, c *gossh.Client) {
	key := h.poolKey()
	p.mu.Lock()
	pc := p.conns[key]
	if pc == nil || pc.client != c {
		p.mu.Unlock()
		return
	}
	delete(p.conns, key)
	p.mu.Unlock()
	c.Close()
}

// Connected reports whether the pool holds a live connection to the host named name.
func (p *Pool) Connected(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[name] != nil
}

// Holds reports whether the pool holds a connection to h (under h's account when it runs
// as another), without dialing, waiting for a dial or checking the connection's trust:
// whether Conn would have to dial, as far as the pool knows now.
func (p *Pool) Holds(h Host) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[h.poolKey()] != nil
}

// ProtocolOf is the host protocol version c, a connection Conn returned for h, speaks; 0 when
// c is no longer h's pooled connection (a version of a connection since replaced would be
// another hostagent's, perhaps an older one).
func (p *Pool) ProtocolOf(h Host, c *gossh.Client) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conns[h.poolKey()]; pc != nil && pc.client == c {
		return pc.protocol
	}
	return 0
}

// Protocol is the host protocol version the pooled connection to the host named name speaks
// (see hostproto, "Compatibility"); 0 when there is none.
func (p *Pool) Protocol(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conns[name]; pc != nil {
		return pc.protocol
	}
	return 0
}

// current returns the live pooled connection to h, if any: one dialed under what h trusts
// now, whose key (or certificate) is still trusted — not revoked or expired since.
// Called with h's dial mutex held; the check (which may read the revocation list) runs
// outside mu.
func (p *Pool) current(h Host) *gossh.Client {
	p.mu.Lock()
	pc := p.conns[h.poolKey()]
	p.mu.Unlock()
	if pc == nil {
		return nil
	}
	if pc.trust == h.trust() && CheckHostKey(h, pc.presented, p.opts.HostCAs, p.opts.Revoked, p.opts.Now()) == nil {
		return pc.client
	}
	p.mu.Lock()
	if p.conns[h.poolKey()] == pc {
		delete(p.conns, h.poolKey())
	}
	p.mu.Unlock()
	pc.client.Close()
	return nil
}

// trust is what h's host key is checked against, as a string: its pinned key, or its CA.
func (h Host) trust() string {
	switch {
	case h.HostCA:
		return CertAuthorityMarker
	case h.HostKey == nil:
		return ""
	}
	return string(h.HostKey.Marshal())
}

// dial connects to h, checks its host key (CheckHostKey), and agrees on the host protocol
// version. It returns the key or certificate the host presented.
func (p *Pool) dial(ctx context.Context, h Host) (*gossh.Client, gossh.PublicKey, int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", h.Addr)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%w: dial %s (%s): %w", ErrHostUnreachable, h.Name, h.Addr, err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	signer := p.opts.Signer
	if p.opts.Certs != nil {
		if signer, err = p.opts.Certs(h.Account); err != nil {
			raw.Close()
			return nil, nil, 0, fmt.Errorf("bastion: no ssh certificate to log in to %s as %s: %w", h.Name, h.Account, err)
		}
	}
	var presented gossh.PublicKey
	var refused error // the host key callback's own error: it says what to fix
	conn, chans, reqs, err := gossh.NewClientConn(raw, h.Addr, &gossh.ClientConfig{
		User: h.Account,
		Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error {
			presented = key
			refused = CheckHostKey(h, key, p.opts.HostCAs, p.opts.Revoked, p.opts.Now())
			return refused
		},
		HostKeyAlgorithms: h.hostKeyAlgorithms(),
	})
	if err != nil {
		raw.Close()
		if errors.Is(err, ErrHostKeyMismatch) {
			p.log.Error("host key mismatch: refusing the host", "host", h.Name,
				"enrolled", gossh.FingerprintSHA256(h.HostKey), "presented", gossh.FingerprintSHA256(presented))
			return nil, nil, 0, fmt.Errorf("%w: %s presented %s, enrolled %s", ErrHostKeyMismatch, h.Name,
				gossh.FingerprintSHA256(presented), gossh.FingerprintSHA256(h.HostKey))
		}
		if errors.Is(refused, ErrHostCertRefused) {
			p.log.Error("host certificate refused: refusing the host", "host", h.Name, "error", refused)
			return nil, nil, 0, refused
		}
		if strings.Contains(err.Error(), "unable to authenticate") {
			// x/crypto/ssh has no error type for it; its message is stable.
			if p.opts.Certs != nil {
				return nil, nil, 0, fmt.Errorf("%w: %s (as %s) refuses the bastion's ssh certificate (does it trust the CA? postern ca keys): %w", ErrKeyRefused, h.Name, h.Account, err)
			}
			return nil, nil, 0, fmt.Errorf("%w: %s (as %s): %w", ErrKeyRefused, h.Name, h.Account, err)
		}
		return nil, nil, 0, fmt.Errorf("%w: ssh handshake with %s: %w", ErrHostUnreachable, h.Name, err)
	}
	client := gossh.NewClient(conn, chans, reqs)
	// Still under the dial's deadline: a host that does not answer the hello is not connected.
	protocol, _, err := hostproto.SayHello(client, version.String())
	if err != nil {
		client.Close()
		return nil, nil, 0, fmt.Errorf("bastion: host %s: %w", h.Name, err)
	}
	raw.SetDeadline(time.Time{})
	return client, presented, protocol, nil
}

// hostKeyAlgorithms are the host key algorithms h is asked for: its pinned key's type, or
// host certificates.
func (h Host) hostKeyAlgorithms() []string {
	if h.HostCA {
		return certAlgorithms
	}
	return []string{h.HostKey.Type()}
}

// keepalive probes the connection kept under key until it fails or the pool closes, then
// drops it.
func (p *Pool) keepalive(key string, pc *pooledConn) {
	defer p.wg.Done()
	ticker := time.NewTicker(p.opts.KeepaliveInterval)
	defer ticker.Stop()
	broken := make(chan error, 1)
	go func() { broken <- pc.client.Wait() }()
	for {
		select {
		case <-p.ctx.Done():
			pc.client.Close()
			<-broken
			return
		case err := <-broken:
			p.drop(key, pc, fmt.Errorf("connection ended: %v", err))
			return
		case <-ticker.C:
			if err := p.probe(pc.client); err != nil {
				p.drop(key, pc, err)
				<-broken
				return
			}
		}
	}
}

// probe sends one keepalive request and waits for its reply, within KeepaliveTimeout.
func (p *Pool) probe(c *gossh.Client) error {
	done := make(chan error, 1)
	go func() {
		_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
		done <- err
	}()
	timer := time.NewTimer(p.opts.KeepaliveTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		c.Close() // unblocks SendRequest
		<-done
		return fmt.Errorf("keepalive unanswered after %s", p.opts.KeepaliveTimeout)
	}
}

func (p *Pool) drop(key string, pc *pooledConn, why error) {
	p.mu.Lock()
	if p.conns[key] == pc {
		delete(p.conns, key)
	}
	p.mu.Unlock()
	pc.client.Close()
	p.log.Warn("dropped connection", "host", key, "reason", why)
}

// Close closes every connection and waits for the keepalive loops.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.conns = map[string]*pooledConn{}
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	return nil
}
