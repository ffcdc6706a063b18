package bastion

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/transport"
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
		{name: "too few local conns", toml: "state_dir = \"/x\"\nmax_local_conns = 4", wantErr: "max_local_conns must be"},
		{name: "per-uid above total", toml: "state_dir = \"/x\"\nmax_local_conns = 64\nmax_local_conns_per_uid = 65", wantErr: "max_local_conns_per_uid must be"},
		{name: "delivery revoke grace", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"45s\""},
		{name: "delivery revoke grace off", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"0s\""},
		{name: "negative delivery revoke grace", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"-1s\"", wantErr: "delivery_revoke_grace must be in"},
		{name: "delivery revoke grace too long", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = \"1h\"", wantErr: "delivery_revoke_grace must be in"},
		{name: "delivery revoke grace as number", toml: "state_dir = \"/x\"\ndelivery_revoke_grace = 30", wantErr: "duration string"},
		{name: "delivery settle off", toml: "state_dir = \"/x\"\ndelivery_settle = \"0s\""},
		{name: "delivery settle too long", toml: "state_dir = \"/x\"\ndelivery_settle = \"1m\"", wantErr: "delivery_settle must be in"},
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

func TestValidateExecArgs(t *testing.T) {
	b := &Bastion{cfg: DefaultConfig("/x")}
	b.cfg.MaxCommandBytes = 32
	wait := func(n int) *int { return &n }
	tests := []struct {
		name    string
		args    ExecArgs
		wantErr string
	}{
		{name: "ok", args: ExecArgs{Host: "h", Command: "true", Cwd: "/srv", Env: map[string]string{"RAILS_ENV": "x"}, TimeoutS: 5, WaitS: wait(0)}},
		{name: "no host", args: ExecArgs{Command: "true"}, wantErr: "host is required"},
		{name: "blank command", args: ExecArgs{Host: "h", Command: "  "}, wantErr: "command is required"},
		{name: "oversized command", args: ExecArgs{Host: "h", Command: strings.Repeat("x", 33)}, wantErr: "limit is 32"},
		{name: "NUL in command", args: ExecArgs{Host: "h", Command: "a\x00b"}, wantErr: "NUL"},
		{name: "invalid UTF-8", args: ExecArgs{Host: "h", Command: "a\xffb"}, wantErr: "UTF-8"},
		{name: "relative cwd", args: ExecArgs{Host: "h", Command: "true", Cwd: "srv"}, wantErr: "cwd"},
		{name: "unclean cwd", args: ExecArgs{Host: "h", Command: "true", Cwd: "/srv/../etc"}, wantErr: "cwd"},
		{name: "env name", args: ExecArgs{Host: "h", Command: "true", Env: map[string]string{"A=B": "x"}}, wantErr: "variable name"},
		{name: "reserved env", args: ExecArgs{Host: "h", Command: "true", Env: map[string]string{"POSTERN_EXECUTION_ID": "ex_x"}}, wantErr: "set by the bastion"},
		{name: "LD_PRELOAD", args: ExecArgs{Host: "h", Command: "true", Env: map[string]string{"LD_PRELOAD": "/x.so"}}, wantErr: "no host accepts it"},
		{name: "PATH", args: ExecArgs{Host: "h", Command: "true", Env: map[string]string{"PATH": "/tmp"}}, wantErr: "no host accepts it"},
		{name: "negative timeout", args: ExecArgs{Host: "h", Command: "true", TimeoutS: -1}, wantErr: "timeout_s"},
		{name: "wait too long", args: ExecArgs{Host: "h", Command: "true", WaitS: wait(3600)}, wantErr: "wait_s"},
		{name: "run id with newline", args: ExecArgs{Host: "h", Command: "true", RunID: "a\nb"}, wantErr: "run_id"},
		{name: "idempotency key control char", args: ExecArgs{Host: "h", Command: "true", IdempotencyKey: "k\x01"}, wantErr: "idempotency_key"},
		{name: "operation key with space", args: ExecArgs{Host: "h", Command: "true", OperationKey: "a b"}, wantErr: "operation_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := b.validate(&tt.args)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCheckHostEnv(t *testing.T) {
	configured := Host{Name: "db-1", AcceptEnv: []string{"RAILS_ENV", "APP_*"}}
	bare := Host{Name: "web-1"}
	tests := []struct {
		name    string
		host    Host
		env     map[string]string
		wantErr string
	}{
		{name: "none", host: bare},
		{name: "locale everywhere", host: bare, env: map[string]string{"LANG": "C", "LC_ALL": "C"}},
		{name: "accept_env exact and prefix", host: configured, env: map[string]string{"RAILS_ENV": "production", "APP_X": "1"}},
		{name: "not on this host", host: bare, env: map[string]string{"RAILS_ENV": "production"}, wantErr: "env RAILS_ENV: host web-1 would drop it, since it accepts only POSTERN_*, LANG, LC_* (its accept_env is empty)"},
		{name: "every dropped name, sorted", host: configured, env: map[string]string{"ZED": "", "APP_OK": "", "ALPHA": ""}, wantErr: "env ALPHA, ZED: host db-1 would drop it, since it accepts only POSTERN_*, LANG, LC_* and its accept_env RAILS_ENV, APP_*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkHostEnv(tt.env, tt.host)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestInventoryAcceptEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.toml")
	key, err := gossh.NewPublicKey(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)))
	if err != nil {
		t.Fatal(err)
	}
	if err := Enroll(path, Host{Name: "db-1", Addr: "127.0.0.1:2222", Account: "deploy", HostKey: key, AcceptEnv: []string{"APP_*"}}); err != nil {
		t.Fatal(err)
	}
	inv, err := OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := inv.Host("db-1"); err != nil || !slices.Equal(h.AcceptEnv, []string{"APP_*"}) {
		t.Fatalf("Host = %+v, %v; want accept_env [APP_*]", h, err)
	}
	if err := Enroll(path, Host{Name: "db-2", Addr: "127.0.0.1:2222", Account: "deploy", HostKey: key, AcceptEnv: []string{"L*"}}); err == nil || !strings.Contains(err.Error(), "LD_*") {
		t.Fatalf("Enroll with accept_env L* = %v; want it refused (it would cover LD_*)", err)
	}
}

// FuzzExecArgs checks that whatever validate accepts can be fingerprinted, and that the
// fingerprint does not depend on map order or on fields outside the intent.
func FuzzExecArgs(f *testing.F) {
	f.Add("h", "true", "/srv", "LANG", "C", 5, "run-1", "key")
	f.Add("h", "migrate up; echo \"ok\"", "", "", "", 0, "", "")
	f.Fuzz(func(t *testing.T, host, command, cwd, envName, envValue string, timeout int, runID, idemKey string) {
		b := &Bastion{cfg: DefaultConfig("/x"), fp: &Fingerprinter{key: make([]byte, 32)}}
		a := ExecArgs{Host: host, Command: command, Cwd: cwd, TimeoutS: timeout, RunID: runID, IdempotencyKey: idemKey}
		if envName != "" {
			a.Env = map[string]string{envName: envValue}
		}
		if b.validate(&a) != nil {
			return
		}
		rec := ActionRecord{Actor: "token:a", Tool: "ssh_exec", Channel: "ssh", Target: "host:" + a.Host,
			Command: shellCommand(a.Command), Cwd: a.Cwd, Env: a.Env, IntentScope: scope(transport.Caller{Actor: "token:a"}, a.RunID)}
		fp1, err := b.fp.Fingerprint(rec)
		if err != nil {
			t.Fatalf("validated arguments cannot be fingerprinted: %v", err)
		}
		fp2, _ := b.fp.Fingerprint(rec)
		if fp1 != fp2 || !strings.HasPrefix(fp1, FingerprintPrefix) {
			t.Fatalf("fingerprint not deterministic: %s vs %s", fp1, fp2)
		}
	})
}

func TestClassWindows(t *testing.T) {
	c := newClasses(Config{Classes: []ClassConfig{{Name: ClassReadOnly, AttachWindow: time.Minute}, {Name: "batch"}}})
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
		if got := c.get(tt.name); got.AttachWindow != tt.window || got.Retention != tt.retention {
			t.Errorf("class %s = %v / %v; want %v / %v", tt.name, got.AttachWindow, got.Retention, tt.window, tt.retention)
		}
	}
}

// TestInBandApproval: the agent's user may decide an approval only for a class the config
// knows and does not keep with operators; a class the config no longer names (a record from
// an older config, whose class may have been operator-only) stays with operators.
func TestInBandApproval(t *testing.T) {
	no := false
	c := newClasses(Config{Classes: []ClassConfig{{Name: "batch"}, {Name: ClassIrreversible, OperatorApprovalOnly: &no}, {Name: "payments", OperatorApprovalOnly: boolPtr(true)}}})
	for name, want := range map[string]bool{
		ClassRemoteCommand:   true,
		"batch":              true,
		ClassIrreversible:    true, // configured to allow it
		"payments":           false,
		"from-an-old-config": false,
	} {
		if got := c.inBandApproval(name); got != want {
			t.Errorf("inBandApproval(%s) = %v; want %v", name, got, want)
		}
	}
	if newClasses(Config{}).inBandApproval(ClassIrreversible) {
		t.Error("irreversible approvals are in band by default; want operators only")
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
