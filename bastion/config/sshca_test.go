package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSSHCAConfig: [ssh_ca] is off by default with a 1h lifetime and a 24h overlap; the
// lifetime is bounded to 1m..24h, durations must be strings, source addresses IPs or CIDR
// blocks, the key dir absolute.
func TestSSHCAConfig(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string // a phrase of the error; "" for none
	}{
		{"off", "", ""},
		{"on with defaults", "[ssh_ca]\nenabled = true\n", ""},
		{"everything", "[ssh_ca]\nenabled = true\nkey_dir = \"/srv/postern-ca\"\ncert_lifetime = \"30m\"\nrotation_overlap = \"0s\"\nsource_addresses = [\"10.0.0.5\", \"10.1.0.0/16\"]\n", ""},
		{"too short", "[ssh_ca]\ncert_lifetime = \"30s\"\n", "cert_lifetime must be in 1m0s..24h0m0s"},
		{"too long", "[ssh_ca]\ncert_lifetime = \"48h\"\n", "cert_lifetime must be in"},
		{"integer duration", "[ssh_ca]\ncert_lifetime = 3600\n", "ssh_ca.cert_lifetime: must be a duration string"},
		{"negative overlap", "[ssh_ca]\nrotation_overlap = \"-1h\"\n", "rotation_overlap must be in"},
		{"bad address", "[ssh_ca]\nsource_addresses = [\"bastion.example\"]\n", "neither an IP address nor a CIDR block"},
		{"relative dir", "[ssh_ca]\nkey_dir = \"ca\"\n", "key_dir must be an absolute path"},
		{"unknown key", "[ssh_ca]\nlifetime = \"1h\"\n", "ssh_ca.lifetime: unknown key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "postern.toml")
			if err := os.WriteFile(path, []byte("state_dir = \"/var/lib/postern\"\n"+tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(path)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("LoadConfig = %v; want %q", err, tc.want)
			}
			if tc.name == "on with defaults" && (cfg.SSHCA.CertLifetime.String() != "1h0m0s" || cfg.SSHCADir() != "/var/lib/postern/ssh_ca") {
				t.Fatalf("defaults: %+v, dir %s", cfg.SSHCA, cfg.SSHCADir())
			}
		})
	}
}
