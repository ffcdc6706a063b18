package integration

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

func newPool(t *testing.T, h *harness.Hostagent) *fleet.Pool {
	t.Helper()
	p, err := fleet.NewPool(fleet.PoolOptions{Signer: h.ClientKey.Signer, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func hostOf(h *harness.Hostagent) fleet.Host {
	return fleet.Host{Name: "local", Addr: h.Addr, Account: h.Account, HostKey: h.HostKey}
}

func TestPoolSharesOneConnectionAndRedials(t *testing.T) {
	h := harness.StartHostagent(t)
	p := newPool(t, h)
	ctx := context.Background()
	first, err := p.Conn(ctx, hostOf(h))
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Conn(ctx, hostOf(h))
	if err != nil || again != first {
		t.Fatalf("second Conn = %p, %v; want the pooled %p", again, err, first)
	}
	if got := execOn(t, first, hostproto.Exec{ExecutionID: newID(t), Command: "echo pooled"}); got.err != nil || got.stdout != "pooled\n" {
		t.Fatalf("exec over the pool = %+v", got)
	}

	h.Kill(t)
	h.Start(t)
	var redialed *gossh.Client
	testutil.WaitFor(t, "a fresh connection after the agent restarted", func() bool {
		c, err := p.Conn(ctx, hostOf(h))
		if err != nil || c == first {
			return false
		}
		redialed = c
		return true
	})
	if got := execOn(t, redialed, hostproto.Exec{ExecutionID: newID(t), Command: "echo again"}); got.err != nil || got.stdout != "again\n" {
		t.Fatalf("exec after redial = %+v", got)
	}
}

func TestPoolRefusesAChangedHostKey(t *testing.T) {
	h := harness.StartHostagent(t)
	p := newPool(t, h)
	enrolled := hostOf(h)
	enrolled.HostKey = testutil.NewSSHKey(t).Public() // the host was re-keyed (or is an impostor)
	_, err := p.Conn(context.Background(), enrolled)
	if !errors.Is(err, fleet.ErrHostKeyMismatch) {
		t.Fatalf("Conn with a changed host key = %v; want ErrHostKeyMismatch", err)
	}
}

func TestPoolDropsASilentConnection(t *testing.T) {
	h := harness.StartHostagent(t)
	proxy := testutil.StartFaultProxy(t, h.Addr)
	p, err := fleet.NewPool(fleet.PoolOptions{
		Signer: h.ClientKey.Signer, Logger: slog.New(slog.DiscardHandler),
		KeepaliveInterval: 50 * time.Millisecond, KeepaliveTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	host := hostOf(h)
	host.Addr = proxy.Addr()
	ctx := context.Background()
	first, err := p.Conn(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Freeze() // a black hole: the TCP connection stays open, nothing answers
	testutil.WaitFor(t, "the keepalive to drop the silent connection", func() bool { return !p.Connected(host.Name) })
	proxy.Thaw()
	again, err := p.Conn(ctx, host)
	if err != nil || again == first {
		t.Fatalf("Conn after the drop = %p, %v; want a new connection", again, err)
	}
	if got := execOn(t, again, hostproto.Exec{ExecutionID: newID(t), Command: "echo back"}); got.err != nil || got.stdout != "back\n" {
		t.Fatalf("exec on the new connection = %+v", got)
	}
}

func TestPoolBacksOffAnUnreachableHost(t *testing.T) {
	h := harness.StartHostagent(t)
	p := newPool(t, h)
	host := hostOf(h)
	h.Kill(t)
	ctx := context.Background()
	_, first := p.Conn(ctx, host)
	if !errors.Is(first, fleet.ErrHostUnreachable) {
		t.Fatalf("first Conn to a stopped agent = %v; want ErrHostUnreachable", first)
	}
	if _, err := p.Conn(ctx, host); err != first {
		t.Fatalf("Conn right after a failed dial = %v; want the same error (%v), without a dial", err, first)
	}
	h.Start(t)
	testutil.WaitFor(t, "a connection once the backoff passed", func() bool {
		_, err := p.Conn(ctx, host)
		return err == nil
	})
}
