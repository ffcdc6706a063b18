package bastion

import (
	"context"
	"crypto/tls"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A result counts as delivered only when the peer has it: after the response was flushed,
// the connection's send queue must drain — on TCP every byte acknowledged by the client's
// stack, on a unix socket every byte read by the client (SIOCOUTQ). A response still queued
// when the connection breaks is not delivered, and a retry replays it. What the bastion
// cannot see is a loss beyond the peer it talks to (a proxy that acknowledged the bytes and
// then died): there a retry is a new intent.

// ackTimeout bounds how long a response may take to be acknowledged.
const ackTimeout = 5 * time.Second

type connKey struct{}

// rememberConn is an http.Server ConnContext that keeps the connection for the delivery
// check, after prev (if any).
func rememberConn(prev func(context.Context, net.Conn) context.Context) func(context.Context, net.Conn) context.Context {
	return func(ctx context.Context, c net.Conn) context.Context {
		if prev != nil {
			ctx = prev(ctx, c)
		}
		return context.WithValue(ctx, connKey{}, c)
	}
}

// acknowledged waits until the connection of ctx has no unacknowledged bytes, up to
// ackTimeout or until the client goes away. A connection the kernel cannot be asked about
// counts the flush as delivery.
func acknowledged(ctx context.Context) bool {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	deadline := time.Now().Add(ackTimeout)
	pause := 50 * time.Microsecond
	for {
		queued := 0
		var ioctlErr error
		if err := raw.Control(func(fd uintptr) { queued, ioctlErr = unix.IoctlGetInt(int(fd), unix.TIOCOUTQ) }); err != nil || ioctlErr != nil {
			return err == nil // closed: unknown, so not delivered; ioctl unsupported: the flush is all we know
		}
		if queued == 0 {
			return true
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, pause) {
			return false
		}
		pause = min(2*pause, 10*time.Millisecond)
	}
}
