// Package etcdtest starts a real etcd cluster for tests: members embedded in the test process
// (go.etcd.io/etcd/server/v3/embed), on 127.0.0.1 ports the kernel chose, with their data in
// the test's temp dir. Members can be stopped and started again, to take quorum away and give
// it back. Every member is stopped at the test's cleanup. With POSTERN_TEST_ETCD naming an
// etcd server binary (ExternalEnv), the members run as processes of that binary instead, to
// test against another etcd version.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is a running etcd cluster.
type Cluster struct {
	t       testing.TB
	mu      sync.Mutex // guards members and procs
	cfgs    []*embed.Config
	members []*embed.Etcd // nil: stopped
	// external is the server binary the members run as (ExternalEnv), "" when embedded;
	// procs are their processes (nil: stopped).
	external string
	procs    []*exec.Cmd
}

// Start starts an n-member cluster and waits until it serves.
func Start(t testing.TB, n int) *Cluster { return start(t, n, nil, 0) }

// StartQuota starts an n-member cluster whose members have a backend quota of quotaBytes
// (their --quota-backend-bytes): a write that would grow a member's database past it raises
// the NOSPACE alarm, and every write fails until it is disarmed.
func StartQuota(t testing.TB, n int, quotaBytes int64) *Cluster { return start(t, n, nil, quotaBytes) }

// StartTLS starts an n-member cluster serving its clients over TLS with the server
// certificate of f, and requiring client certificates issued by f's CA.
func StartTLS(t testing.TB, n int, f TLSFiles) *Cluster { return start(t, n, &f, 0) }

func start(t testing.TB, n int, tlsFiles *TLSFiles, quotaBytes int64) *Cluster {
	t.Helper()
	c := &Cluster{t: t, members: make([]*embed.Etcd, n), procs: make([]*exec.Cmd, n)}
	if tlsFiles == nil {
		c.external = externalBinary()
	}
	var initial []string
	urls := freeURLs(t, 2*n)
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		peer, client := urls[2*i], urls[2*i+1]
		if tlsFiles != nil {
			client.Scheme = "https"
			cfg.ClientTLSInfo = transport.TLSInfo{CertFile: tlsFiles.ServerCert, KeyFile: tlsFiles.ServerKey,
				TrustedCAFile: tlsFiles.CA, ClientCertAuth: true}
		}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.InitialClusterToken = "postern-test"
		cfg.LogLevel = "fatal"
		cfg.QuotaBackendBytes = quotaBytes // 0: etcd's default, 2 GiB
		// Short heartbeats: a stopped member's leadership moves on quickly.
		cfg.TickMs, cfg.ElectionMs = 50, 500
		initial = append(initial, cfg.Name+"="+peer.String())
		c.cfgs = append(c.cfgs, cfg)
	}
	for _, cfg := range c.cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = c.start(i) })
	}
	wg.Wait()
	t.Cleanup(c.stopAll)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// freeURLs returns n URLs on distinct free ports: each port's listener stays open until all
// are chosen, or the kernel may hand one port out twice.
func freeURLs(t testing.TB, n int) []url.URL {
	var urls []url.URL
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		urls = append(urls, url.URL{Scheme: "http", Host: l.Addr().String()})
	}
	return urls
}

func (c *Cluster) start(i int) error {
	if c.external != "" {
		if err := c.startProcess(i, false); err != nil {
			return err
		}
		return c.processReady(i)
	}
	e, err := embed.StartEtcd(c.cfgs[i])
	if err != nil {
		return fmt.Errorf("etcd member %d: %w", i, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcd member %d not ready", i)
	}
	c.mu.Lock()
	c.members[i] = e
	c.mu.Unlock()
	return nil
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, cfg := range c.cfgs {
		eps = append(eps, cfg.AdvertiseClientUrls[0].String())
	}
	return eps
}

// Client is a client of every member, closed at cleanup (plaintext clusters only).
func (c *Cluster) Client() *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// Stop stops member i.
func (c *Cluster) Stop(i int) {
	if c.external != "" {
		c.stopProcess(i)
		return
	}
	c.mu.Lock()
	e := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts stopped member i again on its data. It returns without waiting for it to
// serve (alone it cannot: without quorum no member is ready); Ready waits.
func (c *Cluster) Restart(i int) {
	c.cfgs[i].ClusterState = embed.ClusterStateFlagExisting
	if c.external != "" {
		if err := c.startProcess(i, true); err != nil {
			c.t.Fatalf("restart etcd member %d: %v", i, err)
		}
		return
	}
	e, err := embed.StartEtcd(c.cfgs[i])
	if err != nil {
		c.t.Fatalf("restart etcd member %d: %v", i, err)
	}
	c.mu.Lock()
	c.members[i] = e
	c.mu.Unlock()
}

// Ready waits until every running member serves.
func (c *Cluster) Ready() {
	if c.external != "" {
		for i := range c.procs {
			c.mu.Lock()
			running := c.procs[i] != nil
			c.mu.Unlock()
			if running {
				if err := c.processReady(i); err != nil {
					c.t.Fatal(err)
				}
			}
		}
		return
	}
	c.mu.Lock()
	ms := append([]*embed.Etcd(nil), c.members...)
	c.mu.Unlock()
	for i, e := range ms {
		if e == nil {
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(30 * time.Second):
			c.t.Fatalf("etcd member %d not ready", i)
		}
	}
}

func (c *Cluster) stopAll() {
	for i := range c.members {
		c.Stop(i)
	}
}
