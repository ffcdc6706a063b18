package testutil

import (
	"fmt"
	"net"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// ClosedAddr returns a 127.0.0.1 address where connections are refused until release is
// called: a socket bound to it but not listening holds the port, so no server started
// meanwhile (the test's own, on port 0) can be given it, as one could a FreeAddr's. Call
// release just before something is to listen there.
func ClosedAddr(t testing.TB) (addr string, release func()) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { unix.Close(fd) }) }
	t.Cleanup(release)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port), release
}
