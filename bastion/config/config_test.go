package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		toml    string
		wantErr string
	}{
		{name: "minimal", toml: `state_dir = "/var/lib/postern"`},
		{name: "full", toml: `state_dir = "/var/lib/postern"
listen = "127.0.0.1:7410"
default_wait = "10s"
[[actors]]
name = "deploy-bot"
token_sha256 = "` + hash + `"
[[classes]]
name = "read_only"
attach_window = "1m"
[[rules]]
class = "read_only"
commands = ["df *"]`},
		{name: "unknown key", toml: "state_dir = \"/x\"\nlisten_addr = \"x\"", wantErr: "unknown key"},
		{name: "duration as number", toml: "state_dir = \"/x\"\ndefault_wait = 30", wantErr: "duration string"},
		{name: "relative state dir", toml: `state_dir = "state"`, wantErr: "absolute"},
		{name: "public listen without TLS", toml: "state_dir = \"/x\"\nlisten = \"0.0.0.0:7410\"", wantErr: "not a loopback"},
		{name: "plain token in config", toml: "state_dir = \"/x\"\n[[actors]]\nname = \"a\"\ntoken_sha256 = \"pst_secret\"", wantErr: "64 hex"},
		{name: "duplicate actor", toml: "state_dir = \"/x\"\n[[actors]]\nname = \"a\"\ntoken_sha256 = \"" + hash + "\"\n[[actors]]\nname = \"a\"\ntoken_sha256 = \"" + hash + "\"", wantErr: "duplicate"},
		{name: "rule with unknown class", toml: "state_dir = \"/x\"\n[[rules]]\nclass = \"yolo\"", wantErr: "unknown class"},
		{name: "local actor of another uid, socket in state_dir", toml: "state_dir = \"/x\"\n[[actors]]\nname = \"ci\"\nuid = 4242", wantErr: "set socket outside state_dir"},
		{name: "local actor of another uid, socket outside", toml: "state_dir = \"/x\"\nsocket = \"/run/postern/mcp.sock\"\n[[actors]]\nname = \"ci\"\nuid = 4242"},
		{name: "local actor of root, socket in state_dir", toml: "state_dir = \"/x\"\n[[actors]]\nname = \"admin\"\nuid = 0"},
		{name: "host CA", toml: "state_dir = \"/x\"\nrevoked_host_keys_file = \"/etc/postern/revoked\"\n[[host_cas]]\nname = \"prod\"\npublic_key = \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEtb1r1Hm7TR5cJ5Gm5S8dpt2Fq8d0I8ocV8v1E1v6hS host-ca\"\nhosts = [\"db-*\"]"},
		{name: "host CA without a key", toml: "state_dir = \"/x\"\n[[host_cas]]\nname = \"prod\"\npublic_key = \"ssh-ed25519 nope\"", wantErr: "host_cas[0]: public_key"},
		{name: "host CA with a bad pattern", toml: "state_dir = \"/x\"\n[[host_cas]]\npublic_key = \"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEtb1r1Hm7TR5cJ5Gm5S8dpt2Fq8d0I8ocV8v1E1v6hS host-ca\"\nhosts = [\"db-[\"]", wantErr: "not a pattern"},
		{name: "relative revocation list", toml: "state_dir = \"/x\"\nrevoked_host_keys_file = \"revoked\"", wantErr: "revoked_host_keys_file must be an absolute path"},
		{name: "too few local conns", toml: "state_dir = \"/x\"\nmax_local_conns = 4", wantErr: "max_local_conns must be"},
		{name: "per-uid above total", toml: "state_dir = \"/x\"\nmax_local_conns = 64\nmax_local_conns_per_uid = 65", wantErr: "max_local_conns_per_uid must be"},
		{name: "delivery revoke grace", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"45s\""},
		{name: "delivery revoke grace off", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"0s\""},
		{name: "negative delivery revoke grace", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"-1s\"", wantErr: "delivery_revoke_grace must be in"},
		{name: "delivery revoke grace too long", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"1h\"", wantErr: "delivery_revoke_grace must be in"},
		{name: "delivery revoke grace as number", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = 30", wantErr: "duration string"},
		{name: "delivery settle off", toml: "state_dir = \"/x\"\ndelivery_settle = \"0s\""},
		{name: "delivery settle too long", toml: "state_dir = \"/x\"\ndelivery_settle = \"1m\"", wantErr: "delivery_settle must be in"},
		{name: "event retention", toml: "state_dir = \"/x\"\nevent_retention = \"72h\""},
		{name: "negative event retention", toml: "state_dir = \"/x\"\nevent_retention = \"-1h\"", wantErr: "event_retention must not be negative"},
		{name: "principal of a token and the own user", toml: "state_dir = \"/x\"\n[[actors]]\nname = \"a\"\ntoken_sha256 = \"" + hash + "\"\n[[principals]]\nname = \"alice\"\nactors = [\"a\", \"self\"]"},
		{name: "principal of an unknown actor", toml: "state_dir = \"/x\"\n[[principals]]\nname = \"alice\"\nactors = [\"nobody\"]", wantErr: `unknown actor "nobody"`},
		{name: "actor in two principals", toml: "state_dir = \"/x\"\n[[principals]]\nname = \"p\"\nactors = [\"self\"]\n[[principals]]\nname = \"q\"\nactors = [\"self\"]", wantErr: "already in principal p"},
		{name: "principal without actors", toml: "state_dir = \"/x\"\n[[principals]]\nname = \"p\"", wantErr: "list its actors"},
		{name: "duplicate principal", toml: "state_dir = \"/x\"\n[[principals]]\nname = \"p\"\nactors = [\"self\"]\n[[principals]]\nname = \"p\"\nactors = []", wantErr: "duplicate name"},
		{name: "window longer than retention", toml: "state_dir = \"/x\"\n[[classes]]\nname = \"c\"\nattach_window = \"48h\"\nretention = \"1h\"", wantErr: "longer than retention"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig(strings.NewReader(tt.toml))
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestClassWindows(t *testing.T) {
	c := Config{Classes: []Class{{Name: ClassReadOnly, AttachWindow: time.Minute}, {Name: "batch"}}}.ResolveClasses()
	tests := []struct {
		name              string
		window, retention time.Duration
	}{
		{ClassReadOnly, time.Minute, 7 * day}, // configured window, built-in retention
		{ClassIrreversible, 7 * day, 90 * day},
		{"batch", day, 30 * day},              // a new class without windows
		{"from-an-old-config", day, 30 * day}, // unknown: remote_command's
	}
	for _, tt := range tests {
		if got := c.Get(tt.name); got.AttachWindow != tt.window || got.Retention != tt.retention {
			t.Errorf("class %s = %v / %v; want %v / %v", tt.name, got.AttachWindow, got.Retention, tt.window, tt.retention)
		}
	}
}

// TestInBandApproval: the agent's user may decide an approval in the client only for a
// class the config explicitly opens to it (operator_approval_only = false); every other
// class — built in, added without the key, or one the config no longer names (a record from
// an older config) — stays with operators.
func TestInBandApproval(t *testing.T) {
	c := Config{Classes: []Class{{Name: "batch"}, {Name: ClassIrreversible, OperatorApprovalOnly: new(false)}, {Name: "payments", OperatorApprovalOnly: new(true)}}}.ResolveClasses()
	for name, want := range map[string]bool{
		ClassRemoteCommand:   false,
		ClassReadOnly:        false,
		"batch":              false,
		ClassIrreversible:    true, // configured to allow it
		"payments":           false,
		"from-an-old-config": false,
	} {
		if got := c.InBandApproval(name); got != want {
			t.Errorf("InBandApproval(%s) = %v; want %v", name, got, want)
		}
	}
}

// TestApprovalsConfig: operators are local users by name or uid; a webhook is an http(s)
// URL without credentials, and a secret file needs one.
func TestApprovalsConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    Approvals
		want string // a phrase of the error; "" for none
	}{
		{"default", Approvals{}, ""},
		{"root by name and a uid", Approvals{Operators: []string{"root", "4242"}}, ""},
		{"unknown user", Approvals{Operators: []string{"no-such-user-here"}}, `no local user "no-such-user-here"`},
		{"webhook", Approvals{Webhook: "https://hooks.example/postern", WebhookSecretFile: "/etc/postern/hook.secret"}, ""},
		{"webhook scheme", Approvals{Webhook: "ftp://x"}, "want an http(s) URL"},
		{"webhook credentials", Approvals{Webhook: "https://u:p@hooks.example/"}, "no credentials in the URL"},
		{"secret without webhook", Approvals{WebhookSecretFile: "/x"}, "without a webhook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.a.validate()
			if tc.want == "" && len(errs) != 0 || tc.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want)) {
				t.Fatalf("validate = %v; want %q", errs, tc.want)
			}
		})
	}
	uids, err := Approvals{Operators: []string{"root", "4242"}}.OperatorUIDs()
	if err != nil || len(uids) != 2 || uids[0] != 0 || uids[1] != 4242 {
		t.Fatalf("OperatorUIDs = %v, %v; want [0 4242]", uids, err)
	}
}

// TestLoadConfigReportsEveryProblemAtOnce: an unknown key, a mistyped duration and invalid
// values are reported by one LoadConfig, not one pass each.
func TestLoadConfigReportsEveryProblemAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "postern.toml")
	body := "state_dir = \"/var/lib/postern\"\nlisten = \"0.0.0.0:7410\"\nmax_command_bytes = 0\nreconcile_interval = 5\nno_such_key = 1\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if err == nil {
		t.Fatal("LoadConfig accepted a config with four problems")
	}
	for _, want := range []string{"no_such_key: unknown key", "reconcile_interval: must be a duration string", "is not a loopback address", "max_command_bytes must be in"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("LoadConfig error:\n%v\nwant it to include %q", err, want)
		}
	}
}

// TestValidateAllowedOrigins: allowed_origins are http(s)://host[:port] (one trailing "/"
// tolerated); "null", paths, userinfo and bare hosts are reported with their index.
func TestValidateAllowedOrigins(t *testing.T) {
	tests := []struct {
		origin  string
		wantErr string
	}{
		{"https://console.example", ""},
		{"https://console.example/", ""},
		{"http://localhost:6274", ""},
		{"null", "cannot be allowed"},
		{"console.example", "scheme://host[:port]"},
		{"https://console.example/app", "no userinfo, path"},
		{"https://u@console.example", "no userinfo, path"},
	}
	for _, tt := range tests {
		c := DefaultConfig("/x")
		c.AllowedOrigins = []string{"https://ok.example", tt.origin}
		err := c.Validate()
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), "allowed_origins[1]") || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("allowed_origins %q: Validate = %v; want %q", tt.origin, err, tt.wantErr)
		}
	}
}

func TestValidateHTTPConfig(t *testing.T) {
	base := func() Config {
		c := DefaultConfig("/x")
		c.HTTPPlugin = Plugin{Path: "/usr/lib/postern/postern-plugin-http", SHA256: strings.Repeat("a", 64)}
		c.Credentials = []Credential{{Name: "api", Kind: "bearer", File: "/etc/postern/api"}}
		c.Endpoints = []Endpoint{{Name: "pay", BaseURL: "https://pay.example/api", Methods: []string{"POST"}, PathPrefixes: []string{"/v1"}, Class: ClassIrreversible, Credential: "api"}}
		return c
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"ok", func(*Config) {}, ""},
		{"endpoints without plugin", func(c *Config) { c.HTTPPlugin = Plugin{} }, "http_plugin"},
		{"credential in the URL", func(c *Config) { c.Endpoints[0].BaseURL = "https://u:p@pay.example" }, "without credentials"},
		{"unknown credential", func(c *Config) { c.Endpoints[0].Credential = "nope" }, "unknown credential"},
		{"secret in two places", func(c *Config) { c.Credentials[0].Env = "X" }, "exactly one"},
		{"conditional without status check", func(c *Config) { c.Endpoints[0].Class = ClassConditionalWrite }, "status_check"},
		{"lower-case method", func(c *Config) { c.Endpoints[0].Methods = []string{"post"} }, "upper-case"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Validate = %v; want %q", err, tt.wantErr)
			}
		})
	}
}

func TestJournalConfigValidation(t *testing.T) {
	dir := t.TempDir()
	pem := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(pem, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		j    Journal
		want string // "" valid, else a substring of the error
	}{
		{"default pebble", Journal{}, ""},
		{"pebble", Journal{Backend: "pebble"}, ""},
		{"unknown backend", Journal{Backend: "consul"}, `backend "consul": want "pebble" or "etcd"`},
		{"pebble with endpoints", Journal{Endpoints: []string{"http://127.0.0.1:2379"}}, `are for backend = "etcd"`},
		{"etcd", Journal{Backend: "etcd", Endpoints: []string{"http://127.0.0.1:2379"}}, ""},
		{"etcd without endpoints", Journal{Backend: "etcd"}, "needs endpoints"},
		{"bad endpoint", Journal{Backend: "etcd", Endpoints: []string{"127.0.0.1:2379"}}, `endpoint "127.0.0.1:2379": want http://host:port`},
		{"tls", Journal{Backend: "etcd", Endpoints: []string{"https://e1:2379"}, CAFile: pem, CertFile: pem, KeyFile: pem}, ""},
		{"cert without key", Journal{Backend: "etcd", Endpoints: []string{"https://e1:2379"}, CertFile: pem}, "cert_file and key_file go together"},
		{"tls on http", Journal{Backend: "etcd", Endpoints: []string{"http://e1:2379"}, CAFile: pem}, "need https endpoints"},
		{"missing ca", Journal{Backend: "etcd", Endpoints: []string{"https://e1:2379"}, CAFile: filepath.Join(dir, "none.pem")}, "none.pem"},
		{"short lease", Journal{Backend: "etcd", Endpoints: []string{"http://e1:2379"}, LeaseTTL: time.Second}, "lease_ttl must be whole seconds, at least 2s"},
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

// TestPrincipalOf: an actor's principal is the one that lists it; an actor in none has none.
func TestPrincipalOf(t *testing.T) {
	c := Config{Principals: []Principal{{Name: "alice", Actors: []string{"local-agent", SelfActor}}, {Name: "ci", Actors: []string{"deploy"}}}}
	for actor, want := range map[string]string{"local-agent": "alice", SelfActor: "alice", "deploy": "ci", "other": ""} {
		if got, ok := c.PrincipalOf(actor); got != want || ok != (want != "") {
			t.Errorf("PrincipalOf(%q) = %q, %v; want %q", actor, got, ok, want)
		}
	}
}
