package journal

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
)

// The journal reaches an etcd cluster that serves TLS and requires client certificates
// with the config's ca_file, cert_file and key_file; without a client certificate it is
// refused (and Open fails: nothing can be journaled).
func TestEtcdJournalOverTLS(t *testing.T) {
	dir := t.TempDir()
	files := etcdtest.WriteTLS(t, dir)
	c := etcdtest.StartTLS(t, 1, files)
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(dir, "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	jc := config.Journal{Backend: "etcd", Endpoints: c.Endpoints(), CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey,
		Replica: "r0", LeaseTTL: 2 * time.Second, Timeout: 3 * time.Second}
	cfg := config.DefaultConfig(dir)
	cfg.Journal = jc
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	j, err := OpenEtcd(jc, markers.Options{Graph: markers.JournalGraph, Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	rec := &markers.Record{ID: "ex_01JTLS00000000000000000001", Actor: "alice", IntentScope: "run:1", Fingerprint: "fp"}
	if _, err := j.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	noCert := jc
	noCert.CertFile, noCert.KeyFile = "", ""
	if j, err := OpenEtcd(noCert, markers.Options{Graph: markers.JournalGraph, Signer: signer}); err == nil {
		j.Close()
		t.Fatal("a client without a certificate opened the journal")
	}
}
