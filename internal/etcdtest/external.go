package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ExternalEnv names an etcd server binary (e.g. /usr/bin/etcd of Debian's etcd-server) that
// Start runs its members with, as processes, instead of the embedded server: the replica tests
// then run against that etcd version. TLS clusters (StartTLS) stay embedded.
const ExternalEnv = "POSTERN_TEST_ETCD"

// externalBinary is the server binary of ExternalEnv, "" when unset.
func externalBinary() string { return os.Getenv(ExternalEnv) }

// startProcess runs member i as an external etcd process; existing: it rejoins its cluster
// on its data.
func (c *Cluster) startProcess(i int, existing bool) error {
	cfg := c.cfgs[i]
	state := "new"
	if existing {
		state = "existing"
	}
	cmd := exec.Command(c.external,
		"--name", cfg.Name, "--data-dir", cfg.Dir,
		"--listen-peer-urls", cfg.ListenPeerUrls[0].String(), "--initial-advertise-peer-urls", cfg.AdvertisePeerUrls[0].String(),
		"--listen-client-urls", cfg.ListenClientUrls[0].String(), "--advertise-client-urls", cfg.AdvertiseClientUrls[0].String(),
		"--initial-cluster", cfg.InitialCluster, "--initial-cluster-state", state, "--initial-cluster-token", cfg.InitialClusterToken,
		"--heartbeat-interval", strconv.Itoa(int(cfg.TickMs)), "--election-timeout", strconv.Itoa(int(cfg.ElectionMs)),
		"--log-level", "error", "--quota-backend-bytes", strconv.FormatInt(cfg.QuotaBackendBytes, 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcd member %d: %w", i, err)
	}
	c.mu.Lock()
	c.procs[i] = cmd
	c.mu.Unlock()
	return nil
}

// stopProcess kills member i's process and waits for it.
func (c *Cluster) stopProcess(i int) {
	c.mu.Lock()
	cmd := c.procs[i]
	c.procs[i] = nil
	c.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// processReady waits until member i answers a linearizable read (which needs a quorum).
func (c *Cluster) processReady(i int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.cfgs[i].AdvertiseClientUrls[0].String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "etcdtest-ready")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd member %d not ready: %w", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
