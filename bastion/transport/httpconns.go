package transport

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/ratelog"
)

// The HTTP listener's connections are bounded before any byte is read: in total (Accept waits
// for a free slot, so the rest wait in the kernel's backlog and the bastion's descriptors are
// never exhausted) and per peer address (one address cannot take every slot). A connection
// that has not authenticated is closed after each response, and one that sends no request
// within the header timeout is closed, so holding a slot for long takes a token; a peer at
// its share makes room by closing its oldest connection that has sent nothing and never
// authenticated, so a client with a token still gets in beside idle connections from its
// address. An authenticated connection is closed once idle for the idle timeout. The descriptors left are for the unix sockets, which bound
// their own connections (UnixAccess), the SSH pool and the journal.
//
// netutil.LimitListener (golang.org/x/net) bounds the total too, but it wraps every
// connection in a type of its own, which hides the *net.TCPConn the delivery evidence reads
// TCP_INFO from, and it knows no peers: here connections are returned as accepted, and
// their slots are released from http.Server.ConnState.

// Defaults of HTTPLimits.
const (
	DefaultMaxHTTPConns        = 4096
	DefaultMaxHTTPConnsPerPeer = 256
	DefaultHTTPHeaderTimeout   = 5 * time.Second
	DefaultHTTPIdleTimeout     = 2 * time.Minute
)

// minHTTPConns is the least FitHTTPConns leaves the HTTP listener, however low the
// descriptor limit.
const minHTTPConns = 16

// HTTPLimits bound the connections of the HTTP listener.
type HTTPLimits struct {
	// MaxConns bounds the open connections; Accept waits while they are all taken. Default
	// DefaultMaxHTTPConns (FitHTTPConns lowers it to the descriptors there are).
	MaxConns int
	// MaxConnsPerPeer bounds the open connections of one peer address — an IPv4 address, an
	// IPv6 /64, or loopback as a whole (a local user can send from any 127/8 address); the
	// connections past it are closed at accept. Default DefaultMaxHTTPConnsPerPeer.
	MaxConnsPerPeer int
	// HeaderTimeout bounds the wait for a request's headers, including a new connection's
	// first request (and its TLS handshake). Default DefaultHTTPHeaderTimeout.
	HeaderTimeout time.Duration
	// IdleTimeout closes an authenticated keep-alive connection idle this long; one that
	// never authenticated is closed after each response. Default DefaultHTTPIdleTimeout.
	IdleTimeout time.Duration
}

func (l HTTPLimits) withDefaults() HTTPLimits {
	l.MaxConns = orDefault(l.MaxConns, DefaultMaxHTTPConns)
	l.MaxConnsPerPeer = orDefault(l.MaxConnsPerPeer, DefaultMaxHTTPConnsPerPeer)
	l.HeaderTimeout = orDefault(l.HeaderTimeout, DefaultHTTPHeaderTimeout)
	l.IdleTimeout = orDefault(l.IdleTimeout, DefaultHTTPIdleTimeout)
	return l
}

// orDefault is v, or def when v is zero or negative (an option left unset).
func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// FitHTTPConns returns want (default DefaultMaxHTTPConns), lowered so that it and reserve
// descriptors fit under this process's descriptor limit (RLIMIT_NOFILE, which Go raises to
// the hard limit at start), but not below 16; limit is that limit.
func FitHTTPConns(want, reserve int) (conns int, limit uint64) {
	want = orDefault(want, DefaultMaxHTTPConns)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return want, rl.Cur
	}
	if room := int64(rl.Cur) - int64(reserve); room < int64(want) {
		want = int(max(room, minHTTPConns))
	}
	return want, rl.Cur
}

// HTTPServerOptions configure NewHTTPServer.
type HTTPServerOptions struct {
	Limits HTTPLimits
	// ConnContext, if set, is called for every connection after the transport's own.
	ConnContext func(context.Context, net.Conn) context.Context
	// Logger receives refusals (bounded, internal/ratelog). Default: discard.
	Logger *slog.Logger
	// CountRefusal is told of every refusal. Default: none.
	CountRefusal CountRefusal
}

// NewHTTPServer returns the http.Server for the Streamable HTTP endpoint and the listener to
// serve it on: l (TLS-wrapped already, if TLS is on) bounded by opts.Limits. handler is the
// mux; HTTPHandler marks the connections whose requests authenticate, every other response
// closes its connection.
func NewHTTPServer(l net.Listener, handler http.Handler, opts HTTPServerOptions) (*http.Server, net.Listener) {
	limits := opts.Limits.withDefaults()
	logger := loggerOrDiscard(opts.Logger)
	ll := &limitedListener{
		Listener: l,
		slots:    make(chan struct{}, limits.MaxConns),
		perPeer:  limits.MaxConnsPerPeer,
		refusals: newRefusalLog(logger, WhereHTTP, opts.CountRefusal),
		closed:   make(chan struct{}),
		conns:    map[net.Conn]*httpConn{},
		byPeer:   map[string]map[*httpConn]bool{},
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hc, ok := r.Context().Value(httpConnKey{}).(*httpConn); !ok || !hc.authenticated.Load() {
				// markAuthenticated takes this back once the request authenticates.
				w.Header().Set("Connection", "close")
			}
			handler.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: limits.HeaderTimeout,
		IdleTimeout:       limits.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          ServerErrorLog(logger, WhereHTTP, opts.CountRefusal),
		ConnState:         ll.connState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			ll.mu.Lock()
			hc := ll.conns[c]
			ll.mu.Unlock()
			if hc != nil {
				ctx = context.WithValue(ctx, httpConnKey{}, hc)
			}
			if opts.ConnContext != nil {
				ctx = opts.ConnContext(ctx, c)
			}
			return ctx
		},
	}
	return srv, ll
}

// httpConn is an open connection of the HTTP listener.
type httpConn struct {
	c     net.Conn
	peer  string
	since time.Time
	// authenticated: one of its requests carried a known token.
	authenticated atomic.Bool
	// state is its last http.ConnState.
	state atomic.Int32
	// evicted: closed by Accept to make room, no longer counted for its peer. Guarded by the
	// listener's mu.
	evicted bool
}

type httpConnKey struct{}

// markAuthenticated notes that r's connection authenticated: its responses keep it open
// (until IdleTimeout), and it is never closed to make room.
func markAuthenticated(w http.ResponseWriter, r *http.Request) {
	if hc, ok := r.Context().Value(httpConnKey{}).(*httpConn); ok {
		hc.authenticated.Store(true)
		w.Header().Del("Connection")
	}
}

// limitedListener bounds the connections it hands out (see above); connState releases them.
// A peer at its share makes room by closing its oldest connection that has neither
// authenticated nor sent a request yet; with none, the new connection is closed.
type limitedListener struct {
	net.Listener
	slots    chan struct{} // one per open connection
	perPeer  int
	refusals *ratelog.Logger
	closed   chan struct{}
	once     sync.Once

	mu     sync.Mutex // guards conns, byPeer and every httpConn.evicted
	conns  map[net.Conn]*httpConn
	byPeer map[string]map[*httpConn]bool // the connections counted for each peer
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		hc := &httpConn{c: c, peer: peerOf(c.RemoteAddr()), since: time.Now()}
		hc.state.Store(int32(http.StateNew))
		l.mu.Lock()
		mine := l.byPeer[hc.peer]
		open := len(mine)
		var victim *httpConn
		if open >= l.perPeer {
			if victim = oldestWaiting(mine); victim == nil {
				l.mu.Unlock()
				<-l.slots
				c.Close()
				l.refusals.Log(slog.LevelWarn, ReasonPeerConnLimit, "connection refused", "remote", c.RemoteAddr().String(), "peer", hc.peer, "open", open)
				continue
			}
			victim.evicted = true
			delete(mine, victim)
		}
		if mine == nil {
			mine = map[*httpConn]bool{}
			l.byPeer[hc.peer] = mine
		}
		mine[hc] = true
		l.conns[c] = hc
		l.mu.Unlock()
		if victim != nil {
			victim.c.Close() // its slot is released when the server sees it closed
			l.refusals.Log(slog.LevelWarn, ReasonPeerConnLimit, "closed a connection that sent nothing, to make room", "remote", victim.c.RemoteAddr().String(), "peer", hc.peer, "open", open)
		}
		return c, nil
	}
}

// oldestWaiting is the oldest of conns that has not authenticated and has no request under
// way (it sent nothing, or is idle between requests), or nil.
func oldestWaiting(conns map[*httpConn]bool) *httpConn {
	var oldest *httpConn
	for hc := range conns {
		st := http.ConnState(hc.state.Load())
		if hc.authenticated.Load() || st != http.StateNew && st != http.StateIdle {
			continue
		}
		if oldest == nil || hc.since.Before(oldest.since) {
			oldest = hc
		}
	}
	return oldest
}

// connState is the http.Server's ConnState hook: it follows each connection's state, and a
// closed or hijacked connection frees its slot.
func (l *limitedListener) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	hc := l.conns[c]
	if hc == nil {
		l.mu.Unlock()
		return
	}
	hc.state.Store(int32(st))
	if st != http.StateClosed && st != http.StateHijacked {
		l.mu.Unlock()
		return
	}
	delete(l.conns, c)
	if !hc.evicted {
		mine := l.byPeer[hc.peer]
		delete(mine, hc)
		if len(mine) == 0 {
			delete(l.byPeer, hc.peer)
		}
	}
	l.mu.Unlock()
	<-l.slots
}

// Close stops Accept, closes the listener and logs the summary of its refusals.
func (l *limitedListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	err := l.Listener.Close()
	l.refusals.Close()
	return err
}

// peerOf is the key a peer's connections are bounded by: loopback as a whole, an IPv4
// address, an IPv6 /64.
func peerOf(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.String()
	}
	switch ip := tcp.IP; {
	case ip.IsLoopback():
		return "loopback"
	case ip.To4() != nil:
		return ip.To4().String()
	default:
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
}
