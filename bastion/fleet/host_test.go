package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
)

// helloMode is how a test host answers the protocol hello.
type helloMode int

const (
	helloAnswer helloMode = iota // this release: answers with its Hello
	helloRefuse                  // the previous release: does not know the request
	helloSilent                  // never answers
	helloBad                     // answers a version outside the window
)

// testHost is an SSH server on 127.0.0.1 standing for a hostagent: it admits the bastion's
// key only, answers the hello and keepalives as told, and runs exec requests with /bin/sh
// under a HOME of its own when it has one.
type testHost struct {
	ln  net.Listener
	key testutil.SSHKey
	// bastion is the key the host admits.
	bastion testutil.SSHKey
	// cert, when set, is a host certificate of key the host presents besides it.
	cert gossh.Signer
	// userCA, when set, is a user CA whose certificates the host admits too (for the
	// principal logging in); certSerials are the serials of those that logged in.
	userCA      gossh.PublicKey
	certSerials []uint64
	home        string // "" refuses sessions

	mu sync.Mutex // guards the fields below
	// hello is how the hello is answered; mute stops answering keepalives; refuse closes
	// each connection before the SSH handshake.
	hello  helloMode
	mute   bool
	refuse bool
	// accepts counts TCP connections, logins authentications, keepalives the probes seen.
	accepts, logins, keepalives int
	conns                       []*gossh.ServerConn

	wg sync.WaitGroup
}

// newTestHost starts a host that admits a bastion key of its own. It stops at cleanup.
func newTestHost(t testing.TB) *testHost {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	th := &testHost{ln: ln, key: testutil.NewSSHKey(t), bastion: testutil.NewSSHKey(t)}
	th.wg.Go(th.acceptLoop)
	t.Cleanup(th.stop)
	return th
}

// newTestPool is a pool with the key th admits; adjust sets options. It is closed at cleanup.
func (th *testHost) newTestPool(t testing.TB, adjust ...func(*PoolOptions)) *Pool {
	t.Helper()
	opts := PoolOptions{Signer: th.bastion.Signer, Logger: slog.New(slog.DiscardHandler)}
	for _, f := range adjust {
		f(&opts)
	}
	p, err := NewPool(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func (th *testHost) addr() string { return th.ln.Addr().String() }

// enrolled is the host as the inventory records it, with the key it presents.
func (th *testHost) enrolled() Host {
	return Host{Name: "web1", Addr: th.addr(), Account: "postern", HostKey: th.key.Public()}
}

func (th *testHost) set(f func(th *testHost)) {
	th.mu.Lock()
	defer th.mu.Unlock()
	f(th)
}

// counts returns the TCP connections, logins and keepalives seen so far.
func (th *testHost) counts() (accepts, logins, keepalives int) {
	th.mu.Lock()
	defer th.mu.Unlock()
	return th.accepts, th.logins, th.keepalives
}

// dropAll closes every connection from the host's side.
func (th *testHost) dropAll() {
	th.mu.Lock()
	conns := th.conns
	th.conns = nil
	th.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (th *testHost) stop() {
	th.ln.Close()
	th.dropAll()
	th.wg.Wait()
}

func (th *testHost) acceptLoop() {
	for {
		c, err := th.ln.Accept()
		if err != nil {
			return
		}
		th.mu.Lock()
		th.accepts++
		refuse := th.refuse
		th.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		th.wg.Go(func() { th.serve(c) })
	}
}

func (th *testHost) serve(c net.Conn) {
	cfg := &gossh.ServerConfig{
		PublicKeyCallback: func(meta gossh.ConnMetadata, key gossh.PublicKey) (*gossh.Permissions, error) {
			th.mu.Lock()
			ca := th.userCA
			th.mu.Unlock()
			if cert, ok := key.(*gossh.Certificate); ok && ca != nil {
				checker := gossh.CertChecker{IsUserAuthority: func(k gossh.PublicKey) bool { return bytes.Equal(k.Marshal(), ca.Marshal()) }}
				if err := checker.CheckCert(meta.User(), cert); err != nil || !checker.IsUserAuthority(cert.SignatureKey) {
					return nil, fmt.Errorf("certificate refused: %v", err)
				}
				th.mu.Lock()
				th.logins++
				th.certSerials = append(th.certSerials, cert.Serial)
				th.mu.Unlock()
				return nil, nil
			}
			if !bytes.Equal(key.Marshal(), th.bastion.Public().Marshal()) {
				return nil, errors.New("unknown key")
			}
			th.mu.Lock()
			th.logins++
			th.mu.Unlock()
			return nil, nil
		},
	}
	cfg.AddHostKey(th.key.Signer)
	th.mu.Lock()
	if th.cert != nil {
		cfg.AddHostKey(th.cert)
	}
	th.mu.Unlock()
	sconn, chans, reqs, err := gossh.NewServerConn(c, cfg)
	if err != nil {
		c.Close()
		return
	}
	th.mu.Lock()
	th.conns = append(th.conns, sconn)
	home := th.home
	th.mu.Unlock()
	th.wg.Go(func() { th.globalRequests(reqs) })
	for nc := range chans {
		if nc.ChannelType() != "session" || home == "" {
			nc.Reject(gossh.Prohibited, "no sessions here")
			continue
		}
		th.wg.Go(func() { th.session(nc, home) })
	}
}

func (th *testHost) globalRequests(reqs <-chan *gossh.Request) {
	for req := range reqs {
		th.mu.Lock()
		hello, mute := th.hello, th.mute
		if req.Type == "keepalive@openssh.com" {
			th.keepalives++
		}
		th.mu.Unlock()
		switch {
		case req.Type == hostproto.HelloRequest && hello == helloAnswer:
			_, reply, _ := hostproto.AnswerHello(req.Payload, "test")
			req.Reply(true, reply)
		case req.Type == hostproto.HelloRequest && hello == helloSilent:
		case req.Type == hostproto.HelloRequest && hello == helloBad:
			req.Reply(true, []byte(`{"version":0}`))
		case req.Type == "keepalive@openssh.com" && mute:
		case req.Type == "keepalive@openssh.com":
			req.Reply(true, nil)
		default:
			req.Reply(false, nil)
		}
	}
}

// session runs one exec request with /bin/sh -c under home.
func (th *testHost) session(nc gossh.NewChannel, home string) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	for req := range reqs {
		var x struct{ Command string }
		if req.Type != "exec" || gossh.Unmarshal(req.Payload, &x) != nil {
			req.Reply(false, nil)
			continue
		}
		req.Reply(true, nil)
		cmd := exec.Command("/bin/sh", "-c", x.Command)
		cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
		status := 0
		if err := cmd.Run(); err != nil {
			status = 255
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				status = ee.ExitCode()
			}
		}
		ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{uint32(status)}))
		return
	}
}
