package fleet

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
)

// closed reports whether c's connection ends, waiting a minute at most.
func closed(c *gossh.Client) bool {
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(time.Minute):
		return false
	}
}

func TestNewPool(t *testing.T) {
	if _, err := NewPool(PoolOptions{}); err == nil {
		t.Fatal("NewPool without a signer succeeded")
	}
	p := newTestHost(t).newTestPool(t)
	want := PoolOptions{DialTimeout: 10 * time.Second, KeepaliveInterval: 15 * time.Second, KeepaliveTimeout: 10 * time.Second}
	if p.opts.DialTimeout != want.DialTimeout || p.opts.KeepaliveInterval != want.KeepaliveInterval || p.opts.KeepaliveTimeout != want.KeepaliveTimeout {
		t.Fatalf("defaults = %v, %v, %v; want %v, %v, %v", p.opts.DialTimeout, p.opts.KeepaliveInterval, p.opts.KeepaliveTimeout,
			want.DialTimeout, want.KeepaliveInterval, want.KeepaliveTimeout)
	}
	h := Host{Name: "web1", Addr: "127.0.0.1:1", Account: "postern"}
	if _, err := p.Conn(t.Context(), h); err == nil || !strings.Contains(err.Error(), "no enrolled host key") {
		t.Fatalf("Conn to a host without a key = %v; want refused", err)
	}
}

// TestPoolReusesOneConnection: every caller, concurrent or not, shares the host's one
// connection.
func TestPoolReusesOneConnection(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	h := th.enrolled()

	var wg sync.WaitGroup
	clients := make([]*gossh.Client, 8)
	errs := make([]error, 8)
	for i := range clients {
		wg.Go(func() { clients[i], errs[i] = p.Conn(t.Context(), h) })
	}
	wg.Wait()
	for i := range clients {
		if errs[i] != nil {
			t.Fatalf("Conn %d: %v", i, errs[i])
		}
		if clients[i] != clients[0] {
			t.Fatalf("Conn %d returned another connection", i)
		}
	}
	again, err := p.Conn(t.Context(), h)
	if err != nil || again != clients[0] {
		t.Fatalf("Conn again = %p, %v; want the pooled %p", again, err, clients[0])
	}
	if accepts, logins, _ := th.counts(); accepts != 1 || logins != 1 {
		t.Fatalf("host saw %d connections, %d logins; want 1, 1", accepts, logins)
	}
	if !p.Connected(h.Name) || p.Connected("web2") {
		t.Fatalf("Connected(web1, web2) = %v, %v; want true, false", p.Connected(h.Name), p.Connected("web2"))
	}
}

// TestPoolHostKeyMismatch: a host that presents another key than the enrolled one is sent
// nothing (it never sees a login) and is not pooled; the next call checks again at once.
func TestPoolHostKeyMismatch(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	h := th.enrolled()
	h.HostKey = testutil.NewSSHKey(t).Public() // enrolled: another key

	for i := range 2 {
		_, err := p.Conn(t.Context(), h)
		if !errors.Is(err, ErrHostKeyMismatch) {
			t.Fatalf("Conn %d = %v; want ErrHostKeyMismatch", i, err)
		}
		if !strings.Contains(err.Error(), gossh.FingerprintSHA256(th.key.Public())) || !strings.Contains(err.Error(), h.Fingerprint()) {
			t.Fatalf("error %q does not name both fingerprints", err)
		}
	}
	if p.Connected(h.Name) {
		t.Fatal("a mismatched host is pooled")
	}
	if accepts, logins, _ := th.counts(); accepts != 2 || logins != 0 {
		t.Fatalf("host saw %d connections, %d logins; want 2 (no backoff for a mismatch), 0", accepts, logins)
	}
}

// TestPoolReenrolledHost: a pooled connection made with the host's old key is not used for
// the host enrolled with another.
func TestPoolReenrolledHost(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	h := th.enrolled()
	old, err := p.Conn(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	h.HostKey = testutil.NewSSHKey(t).Public()
	if _, err := p.Conn(t.Context(), h); !errors.Is(err, ErrHostKeyMismatch) {
		t.Fatalf("Conn after re-enrollment = %v; want ErrHostKeyMismatch", err)
	}
	if !closed(old) {
		t.Fatal("the connection made with the old key is still open")
	}
	if p.Connected(h.Name) {
		t.Fatal("the old connection is still pooled")
	}
}

func TestPoolInvalidate(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	h := th.enrolled()
	first, err := p.Conn(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	p.Invalidate(h, first)
	if p.Connected(h.Name) || !closed(first) {
		t.Fatal("an invalidated connection is still pooled or open")
	}
	second, err := p.Conn(t.Context(), h)
	if err != nil || second == first {
		t.Fatalf("Conn after Invalidate = %p, %v; want a new connection", second, err)
	}
	if accepts, _, _ := th.counts(); accepts != 2 {
		t.Fatalf("host saw %d connections; want 2", accepts)
	}
	// A caller that still holds the old connection does not drop the new one.
	p.Invalidate(h, first)
	p.Invalidate(Host{Name: "web2"}, second)
	if !p.Connected(h.Name) {
		t.Fatal("invalidating a stale connection dropped the current one")
	}
}

// TestPoolKeyRefused: a host that answers and refuses the bastion's key is ErrKeyRefused,
// not unreachable: the agent is told what would help.
func TestPoolKeyRefused(t *testing.T) {
	th := newTestHost(t)
	stranger := testutil.NewSSHKey(t)
	p := th.newTestPool(t, func(o *PoolOptions) { o.Signer = stranger.Signer })
	_, err := p.Conn(t.Context(), th.enrolled())
	if !errors.Is(err, ErrKeyRefused) || errors.Is(err, ErrHostUnreachable) {
		t.Fatalf("Conn with a key the host does not admit = %v; want ErrKeyRefused only", err)
	}
}

// TestPoolRedialBackoff: a failed dial is ErrHostUnreachable; until the backoff passes,
// callers get that same error without a new dial (and nothing about when the next dial is);
// then the pool dials again, and a success ends the backoff.
func TestPoolRedialBackoff(t *testing.T) {
	th := newTestHost(t)
	th.set(func(th *testHost) { th.refuse = true })
	p := th.newTestPool(t)
	h := th.enrolled()

	start := time.Now()
	_, first := p.Conn(t.Context(), h)
	if !errors.Is(first, ErrHostUnreachable) {
		t.Fatalf("first Conn = %v; want ErrHostUnreachable", first)
	}
	_, err := p.Conn(t.Context(), h)
	// The pool's clock is the wall clock: the second call is inside the backoff only if it
	// came within its 250ms (on a machine that stalled longer, it may rightly dial again).
	if time.Since(start) < minRedialBackoff {
		if err != first {
			t.Fatalf("Conn within the backoff = %v; want the first dial's error again (%v)", err, first)
		}
		if accepts, _, _ := th.counts(); accepts != 1 {
			t.Fatalf("host saw %d connections within the backoff; want 1", accepts)
		}
	}

	th.set(func(th *testHost) { th.refuse = false })
	testutil.WaitFor(t, "a dial after the backoff", func() bool {
		_, err := p.Conn(t.Context(), h)
		return err == nil
	})
	p.mu.Lock()
	_, failing := p.failing[h.Name]
	p.mu.Unlock()
	if failing {
		t.Fatal("a successful dial left the host backing off")
	}
}

// TestPoolCancelledDialIsNoFailure: a dial the caller gave up on says nothing of the host.
func TestPoolCancelledDialIsNoFailure(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := p.Conn(ctx, th.enrolled()); err == nil {
		t.Fatal("Conn with an ended context succeeded")
	}
	if _, err := p.Conn(t.Context(), th.enrolled()); err != nil {
		t.Fatalf("Conn after a cancelled dial = %v; want no backoff", err)
	}
}

func TestPoolKeepalive(t *testing.T) {
	t.Run("answered", func(t *testing.T) {
		th := newTestHost(t)
		p := th.newTestPool(t, func(o *PoolOptions) {
			o.KeepaliveInterval, o.KeepaliveTimeout = time.Millisecond, time.Minute
		})
		c, err := p.Conn(t.Context(), th.enrolled())
		if err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "keepalives", func() bool {
			_, _, n := th.counts()
			return n >= 3
		})
		if again, err := p.Conn(t.Context(), th.enrolled()); err != nil || again != c {
			t.Fatalf("Conn after keepalives = %p, %v; want the same connection", again, err)
		}
	})
	t.Run("unanswered", func(t *testing.T) {
		th := newTestHost(t)
		p := th.newTestPool(t, func(o *PoolOptions) {
			o.KeepaliveInterval, o.KeepaliveTimeout = time.Millisecond, 20*time.Millisecond
		})
		th.set(func(th *testHost) { th.mute = true })
		c, err := p.Conn(t.Context(), th.enrolled())
		if err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the unanswered connection to be dropped", func() bool { return !p.Connected("web1") })
		if !closed(c) {
			t.Fatal("the dropped connection is still open")
		}
		th.set(func(th *testHost) { th.mute = false })
		if again, err := p.Conn(t.Context(), th.enrolled()); err != nil || again == c {
			t.Fatalf("Conn after the drop = %p, %v; want a new connection", again, err)
		}
	})
	t.Run("host hangs up", func(t *testing.T) {
		th := newTestHost(t)
		p := th.newTestPool(t)
		if _, err := p.Conn(t.Context(), th.enrolled()); err != nil {
			t.Fatal(err)
		}
		th.dropAll()
		testutil.WaitFor(t, "the ended connection to be dropped", func() bool { return !p.Connected("web1") })
	})
}

func TestPoolClose(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	c, err := p.Conn(t.Context(), th.enrolled())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !closed(c) {
		t.Fatal("Close left the connection open")
	}
	if p.Connected("web1") || p.Protocol("web1") != 0 {
		t.Fatal("a closed pool still holds the connection")
	}
	if _, err := p.Conn(t.Context(), th.enrolled()); err == nil || !strings.Contains(err.Error(), "pool closed") {
		t.Fatalf("Conn after Close = %v; want pool closed", err)
	}
}

// TestPoolProtocol: the hello's agreed version is recorded per connection; a host of the
// previous release (it does not know the hello) speaks version 1; a host outside the window,
// or one that never answers, is not connected.
func TestPoolProtocol(t *testing.T) {
	tests := []struct {
		name    string
		hello   helloMode
		want    int
		wantErr error
	}{
		{name: "this release", hello: helloAnswer, want: hostproto.Version},
		{name: "previous release", hello: helloRefuse, want: 1},
		{name: "outside the window", hello: helloBad, wantErr: hostproto.ErrVersion},
		{name: "no answer", hello: helloSilent, wantErr: errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newTestHost(t)
			th.set(func(th *testHost) { th.hello = tt.hello })
			p := th.newTestPool(t, func(o *PoolOptions) {
				if tt.hello == helloSilent {
					o.DialTimeout = 200 * time.Millisecond // the hello waits for it
				}
			})
			_, err := p.Conn(t.Context(), th.enrolled())
			if tt.wantErr != nil {
				if err == nil || (tt.wantErr != errAny && !errors.Is(err, tt.wantErr)) {
					t.Fatalf("Conn = %v; want %v", err, tt.wantErr)
				}
				if p.Connected("web1") {
					t.Fatal("a host without an agreed protocol is pooled")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Protocol("web1"); got != tt.want {
				t.Fatalf("Protocol = %d; want %d", got, tt.want)
			}
		})
	}
	if got := newTestHost(t).newTestPool(t).Protocol("web1"); got != 0 {
		t.Fatalf("Protocol without a connection = %d; want 0", got)
	}
}

// errAny stands for any error in a table.
var errAny = errors.New("any error")

func TestScanHostKey(t *testing.T) {
	th := newTestHost(t)
	key, err := ScanHostKey(t.Context(), th.addr())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := gossh.FingerprintSHA256(key), gossh.FingerprintSHA256(th.key.Public()); got != want {
		t.Fatalf("scanned %s; want %s", got, want)
	}
	if _, logins, _ := th.counts(); logins != 0 {
		t.Fatal("scanning logged in")
	}

	th.set(func(th *testHost) { th.refuse = true })
	if _, err := ScanHostKey(t.Context(), th.addr()); err == nil || !strings.Contains(err.Error(), "presented no host key") {
		t.Fatalf("scan of a host that hangs up = %v; want no host key", err)
	}
	addr, _ := testutil.ClosedAddr(t)
	if _, err := ScanHostKey(t.Context(), addr); err == nil || !strings.Contains(err.Error(), "dial") {
		t.Fatalf("scan of a closed port = %v; want a dial error", err)
	}
}

// TestPoolConnPerAccount: a host reached as another account (run-as) gets a connection of
// its own; the enrolled account's stays the host's (Connected), and invalidating one leaves
// the other.
func TestPoolConnPerAccount(t *testing.T) {
	th := newTestHost(t)
	p := th.newTestPool(t)
	h := th.enrolled()
	if h.As("").poolKey() != h.Name || h.As(h.Account).poolKey() != h.Name {
		t.Fatal("As of no account or the enrolled one is not the host itself")
	}
	pg := h.As("postgres")
	asPG, err := p.Conn(t.Context(), pg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Connected(h.Name) {
		t.Fatal("a run-as connection counts as the host's own")
	}
	own, err := p.Conn(t.Context(), h)
	if err != nil {
		t.Fatal(err)
	}
	if own == asPG {
		t.Fatal("the enrolled account shares the run-as account's connection")
	}
	if again, err := p.Conn(t.Context(), pg); err != nil || again != asPG {
		t.Fatalf("Conn as postgres again = %p, %v; want the pooled %p", again, err, asPG)
	}
	p.Invalidate(pg, asPG)
	if !closed(asPG) || closed(own) || !p.Connected(h.Name) {
		t.Fatal("invalidating the run-as connection touched the host's own")
	}
	if accepts, _, _ := th.counts(); accepts != 2 {
		t.Fatalf("host saw %d connections; want 2", accepts)
	}
}
