package delivery

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TCP states of include/net/tcp_states.h besides ESTABLISHED.
const (
	tcpFinWait1  = 4
	tcpClose     = 7
	tcpCloseWait = 8
	tcpLastAck   = 9
)

// TestJudgeDelivery is the evidence rule of docs/design.md, "Result delivery: what counts as evidence", one look at the
// kernel's facts at a time.
func TestJudgeDelivery(t *testing.T) {
	tests := []struct {
		name  string
		facts connFacts
		want  delivery
	}{
		{name: "kernel not asked", facts: connFacts{}, want: deliveryNotReceived},
		{name: "tcp established, all acknowledged", facts: connFacts{Asked: true, TCP: true, TCPState: tcpEstablished}, want: deliveryReceived},
		{name: "tcp established, segments unacknowledged", facts: connFacts{Asked: true, TCP: true, TCPState: tcpEstablished, Unacked: 2}, want: deliveryPending},
		{name: "tcp established, bytes not sent yet", facts: connFacts{Asked: true, TCP: true, TCPState: tcpEstablished, NotSent: 100}, want: deliveryPending},
		{name: "tcp reset by the peer: queue purged", facts: connFacts{Asked: true, TCP: true, TCPState: tcpClose}, want: deliveryNotReceived},
		{name: "tcp peer closed (FIN), queue empty", facts: connFacts{Asked: true, TCP: true, TCPState: tcpCloseWait}, want: deliveryNotReceived},
		{name: "tcp peer closed (FIN), bytes in flight", facts: connFacts{Asked: true, TCP: true, TCPState: tcpCloseWait, Unacked: 1}, want: deliveryNotReceived},
		{name: "tcp closing after the peer's FIN", facts: connFacts{Asked: true, TCP: true, TCPState: tcpLastAck}, want: deliveryNotReceived},
		{name: "tcp we are closing", facts: connFacts{Asked: true, TCP: true, TCPState: tcpFinWait1}, want: deliveryNotReceived},
		{name: "unix all read, peer connected", facts: connFacts{Asked: true}, want: deliveryReceived},
		{name: "unix bytes unread, peer connected", facts: connFacts{Asked: true, Unread: 10}, want: deliveryPending},
		{name: "unix peer gone: its unread bytes were freed", facts: connFacts{Asked: true, PeerGone: true}, want: deliveryNotReceived},
		{name: "unix peer gone with bytes unread", facts: connFacts{Asked: true, Unread: 10, PeerGone: true}, want: deliveryNotReceived},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := judgeDelivery(tt.facts); got != tt.want {
				t.Errorf("judgeDelivery(%+v) = %v; want %v", tt.facts, got, tt.want)
			}
		})
	}
}

// TestAskKernel reads real sockets. Only a peer that read every byte and is still connected
// has the result. A peer that closes without reading empties our queue (unix: its unread
// bytes are freed; TCP: its reset purges our send queue), so the queue alone would say
// "delivered"; the peer's state says otherwise.
func TestAskKernel(t *testing.T) {
	tests := []struct {
		name string
		// peer acts on the client end after the server wrote "result".
		peer func(t *testing.T, c net.Conn)
		want bool
	}{
		{name: "read everything, still connected", want: true, peer: func(t *testing.T, c net.Conn) {
			if _, err := io.ReadFull(c, make([]byte, len("result"))); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "closed without reading", want: false, peer: func(t *testing.T, c net.Conn) { c.Close() }},
		{name: "read everything, then closed", want: false, peer: func(t *testing.T, c net.Conn) {
			io.ReadFull(c, make([]byte, len("result")))
			c.Close()
		}},
	}
	for _, network := range []string{"tcp", "unix"} {
		for _, tt := range tests {
			t.Run(network+"/"+tt.name, func(t *testing.T) {
				server, client := socketPair(t, network)
				if _, err := server.Write([]byte("result")); err != nil {
					t.Fatal(err)
				}
				tt.peer(t, client)
				if !tt.want {
					// Let the peer's close reach our end (on loopback it already has, almost
					// always); a look before it would rightly wait, not decide.
					waitForPeerGone(t, server)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if got := received(context.WithValue(ctx, connKey{}, server)); got != tt.want {
					t.Fatalf("received = %v; want %v (kernel facts %+v)", got, tt.want, askKernel(server))
				}
			})
		}
	}
	if f := askKernel(nil); f.Asked {
		t.Errorf("askKernel(nil) = %+v; want not asked", f)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if judgeDelivery(askKernel(a)) != deliveryNotReceived {
		t.Errorf("an in-memory connection the kernel cannot be asked about counts as received")
	}
}

// waitForPeerGone waits until the kernel shows the peer of c closed.
func waitForPeerGone(t *testing.T, c net.Conn) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := askKernel(c)
		if (f.TCP && f.TCPState != tcpEstablished) || (!f.TCP && f.PeerGone) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer's close never showed: %+v", f)
		}
		time.Sleep(time.Millisecond)
	}
}

func socketPair(t *testing.T, network string) (server, client net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(sockdir.New(t), "s")
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial(network, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}
