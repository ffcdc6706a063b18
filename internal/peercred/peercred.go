// Package peercred reads who is at the other end of a unix socket as the kernel saw it when the
// peer connected (SO_PEERCRED): its pid, uid and gid, never what the peer claims.
package peercred

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Read returns the credentials c's peer had when it connected. c must be a unix socket.
func Read(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("peer credentials: %T is not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, fmt.Errorf("peer credentials: SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}
