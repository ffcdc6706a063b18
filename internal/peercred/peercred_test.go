package peercred

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestRead: both ends of a real unix socket see this process; a TCP connection has no peer
// credentials.
func TestRead(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	defer server.Close()
	for name, c := range map[string]net.Conn{"server side": server, "client side": client} {
		cred, err := Read(c)
		if err != nil || int(cred.Pid) != os.Getpid() || int(cred.Uid) != os.Geteuid() || int(cred.Gid) != os.Getegid() {
			t.Errorf("%s: Read = %+v, %v; want pid %d uid %d gid %d", name, cred, err, os.Getpid(), os.Geteuid(), os.Getegid())
		}
	}

	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	c, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := Read(c); err == nil {
		t.Error("Read of a TCP connection succeeded")
	}
}
