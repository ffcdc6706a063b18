// Package delivery decides when a result counts as delivered to the client that asked, and
// undoes that when the client gives up on it: the kernel's evidence that the peer has every
// byte (evidence.go), the registry that matches notifications/cancelled to calls
// (calls.go), and the HTTP middleware that carries both out for every MCP transport and
// journals the outcome through the engine (track.go). docs/design.md, "Result delivery: what
// counts as evidence".
//
// Invariant: delivery is recorded only on positive evidence; in doubt a result stays
// undelivered, so a retry replays it, which is always safe.
package delivery

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/internal/ctxtime"
)

// A result counts as delivered only on positive evidence that the client that asked has it
// (docs/design.md, "Result delivery: what counts as evidence"): the response was written and
// flushed, the request was not cancelled, and the kernel says the peer has every byte while
// it is still connected —
//
//   - TCP (and TLS, by its underlying connection): TCP_INFO shows the connection ESTABLISHED
//     with nothing unacknowledged and nothing unsent. A reset empties the send queue, so an
//     empty queue alone proves nothing: any other state (CLOSE_WAIT after the peer's FIN,
//     CLOSE after its reset, …) is not delivery.
//   - unix socket: SIOCOUTQ is 0 (the peer read every byte) and the peer has not hung up. A
//     peer that dies frees what it had not read, so again the queue alone proves nothing.
//
// A connection the kernel cannot be asked about is not delivered: when in doubt, a retry
// replays the result, which is always safe. What the bastion cannot see is a loss beyond the
// peer it talks to (a proxy that acknowledged the bytes and then died).

// ackTimeout bounds how long a response may take to be acknowledged.
const ackTimeout = 5 * time.Second

// tcpEstablished is TCP_ESTABLISHED of include/net/tcp_states.h: the only state in which
// an empty send queue means the peer acknowledged every byte.
const tcpEstablished = 1

// pollRDHUP is POLLRDHUP (the peer shut down its writing side or closed), which x/sys/unix
// does not define for poll(2); it has the value of EPOLLRDHUP on every Linux architecture.
const pollRDHUP = unix.EPOLLRDHUP

// connFacts is what the kernel says about the connection a response was flushed to.
type connFacts struct {
	// Asked is false when the kernel could not be asked (not a socket, already closed, an
	// unsupported query).
	Asked bool
	// TCP is true for a TCP connection (the TCP fields apply), false for a unix socket.
	TCP bool
	// TCPState is tcpi_state; Unacked the segments sent and not acknowledged; NotSent the
	// bytes written and not yet sent.
	TCPState uint8
	Unacked  uint32
	NotSent  uint32
	// Unread is the bytes of a unix socket the peer has not read yet (SIOCOUTQ); PeerGone
	// is true once the peer closed or shut down its end.
	Unread   int
	PeerGone bool
}

// delivery is the verdict on one look at a connection.
type delivery int

const (
	// deliveryPending: bytes are still on their way to a connected peer; look again.
	deliveryPending delivery = iota
	// deliveryReceived: the peer has every byte and is still connected.
	deliveryReceived
	// deliveryNotReceived: the peer is gone, or the kernel cannot say.
	deliveryNotReceived
)

func (d delivery) String() string {
	switch d {
	case deliveryPending:
		return "pending"
	case deliveryReceived:
		return "received"
	}
	return "not received"
}

// judgeDelivery is the evidence rule on one look at the kernel's facts.
func judgeDelivery(f connFacts) delivery {
	switch {
	case !f.Asked:
		return deliveryNotReceived
	case f.TCP && f.TCPState != tcpEstablished:
		return deliveryNotReceived
	case f.TCP && (f.Unacked > 0 || f.NotSent > 0):
		return deliveryPending
	case f.TCP:
		return deliveryReceived
	case f.PeerGone:
		return deliveryNotReceived
	case f.Unread > 0:
		return deliveryPending
	}
	return deliveryReceived
}

type connKey struct{}

// RememberConn is an http.Server ConnContext that keeps the connection for the delivery
// check, after prev (if any).
func RememberConn(prev func(context.Context, net.Conn) context.Context) func(context.Context, net.Conn) context.Context {
	return func(ctx context.Context, c net.Conn) context.Context {
		if prev != nil {
			ctx = prev(ctx, c)
		}
		return context.WithValue(ctx, connKey{}, c)
	}
}

// received waits until the kernel says whether the peer of ctx's connection has every byte
// written to it, up to ackTimeout or until ctx ends (then: not received).
func received(ctx context.Context) bool {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	deadline := time.Now().Add(ackTimeout)
	pause := 50 * time.Microsecond
	for {
		switch judgeDelivery(askKernel(c)) {
		case deliveryReceived:
			return true
		case deliveryNotReceived:
			return false
		}
		if time.Now().After(deadline) || !ctxtime.Sleep(ctx, pause) {
			return false
		}
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// askKernel reads the facts of c. The queue is read before the peer's state: a peer that
// goes away empties the queue after it is marked gone, so a look that sees an empty queue
// and a present peer is not fooled by a purge.
func askKernel(c net.Conn) connFacts {
	var sc syscall.Conn
	var isTCP bool
	switch c := c.(type) {
	case *net.TCPConn:
		sc, isTCP = c, true
	case *net.UnixConn:
		sc = c
	default:
		return connFacts{}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return connFacts{}
	}
	var f connFacts
	var askErr error
	ctrlErr := raw.Control(func(fd uintptr) {
		if isTCP {
			// One TCP_INFO read is one consistent snapshot (taken under the socket lock):
			// state and queue cannot disagree.
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				askErr = err
				return
			}
			f = connFacts{Asked: true, TCP: true, TCPState: info.State, Unacked: info.Unacked, NotSent: info.Notsent_bytes}
			return
		}
		unread, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		if err != nil {
			askErr = err
			return
		}
		gone, err := peerHungUp(int(fd))
		if err != nil {
			askErr = err
			return
		}
		f = connFacts{Asked: true, Unread: unread, PeerGone: gone}
	})
	if ctrlErr != nil || askErr != nil {
		return connFacts{}
	}
	return f
}

// peerHungUp reports whether the peer of a stream socket closed or shut down its end.
func peerHungUp(fd int) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: pollRDHUP}}
	for {
		_, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		return fds[0].Revents&(pollRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0, nil
	}
}
