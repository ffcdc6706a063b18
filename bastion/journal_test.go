package bastion

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
)

func TestJournalConfigValidation(t *testing.T) {
	dir := t.TempDir()
	pem := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(pem, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		j    JournalConfig
		want string // "" valid, else a substring of the error
	}{
		{"default pebble", JournalConfig{}, ""},
		{"pebble", JournalConfig{Backend: "pebble"}, ""},
		{"unknown backend", JournalConfig{Backend: "consul"}, `backend "consul": want "pebble" or "etcd"`},
		{"pebble with endpoints", JournalConfig{Endpoints: []string{"http://127.0.0.1:2379"}}, `are for backend = "etcd"`},
		{"etcd", JournalConfig{Backend: "etcd", Endpoints: []string{"http://127.0.0.1:2379"}}, ""},
		{"etcd without endpoints", JournalConfig{Backend: "etcd"}, "needs endpoints"},
		{"bad endpoint", JournalConfig{Backend: "etcd", Endpoints: []string{"127.0.0.1:2379"}}, `endpoint "127.0.0.1:2379": want http://host:port`},
		{"tls", JournalConfig{Backend: "etcd", Endpoints: []string{"https://e1:2379"}, CAFile: pem, CertFile: pem, KeyFile: pem}, ""},
		{"cert without key", JournalConfig{Backend: "etcd", Endpoints: []string{"https://e1:2379"}, CertFile: pem}, "cert_file and key_file go together"},
		{"tls on http", JournalConfig{Backend: "etcd", Endpoints: []string{"http://e1:2379"}, CAFile: pem}, "need https endpoints"},
		{"missing ca", JournalConfig{Backend: "etcd", Endpoints: []string{"https://e1:2379"}, CAFile: filepath.Join(dir, "none.pem")}, "none.pem"},
		{"short lease", JournalConfig{Backend: "etcd", Endpoints: []string{"http://e1:2379"}, LeaseTTL: time.Second}, "lease_ttl must be whole seconds, at least 2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig(dir)
			cfg.Journal = tc.j
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

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
	jc := JournalConfig{Backend: "etcd", Endpoints: c.Endpoints(), CAFile: files.CA, CertFile: files.ClientCert, KeyFile: files.ClientKey,
		Replica: "r0", LeaseTTL: 2 * time.Second, Timeout: 3 * time.Second}
	cfg := DefaultConfig(dir)
	cfg.Journal = jc
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	j, err := OpenEtcdJournal(jc, markers.Options{Graph: markers.JournalGraph, Signer: signer})
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
	if j, err := OpenEtcdJournal(noCert, markers.Options{Graph: markers.JournalGraph, Signer: signer}); err == nil {
		j.Close()
		t.Fatal("a client without a certificate opened the journal")
	}
}
