package testutil

import (
	"net"
	"sync"
	"testing"
)

// FaultProxy forwards TCP connections from a 127.0.0.1 port to a target and injects network
// faults on command: a black hole (bytes held, connections open), or a cut of every
// connection. It stops at test cleanup.
type FaultProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex // guards frozen, conns; cond waits on it
	cond   *sync.Cond
	frozen bool
	conns  map[net.Conn]struct{}

	wg sync.WaitGroup // accept loop and copy loops
}

// StartFaultProxy listens on 127.0.0.1 and forwards to target.
func StartFaultProxy(t testing.TB, target string) *FaultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FaultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients connect to.
func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops forwarding in both directions; connections stay open, so peers see silence.
func (p *FaultProxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw resumes forwarding, held bytes included.
func (p *FaultProxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes every open connection (both sides see the connection drop).
func (p *FaultProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, holding bytes while frozen; it closes both when either side ends.
func (p *FaultProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.forget(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *FaultProxy) forget(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *FaultProxy) close() {
	p.ln.Close()
	p.Thaw()
	p.Cut()
	p.wg.Wait()
}
