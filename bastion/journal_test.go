package bastion

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
