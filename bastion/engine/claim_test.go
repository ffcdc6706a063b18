package engine

import (
	"crypto/ed25519"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/hostproto"
)

func TestValidateExecArgs(t *testing.T) {
	cfg := config.DefaultConfig("/x")
	cfg.MaxCommandBytes = 32
	b := &intake{core: testCore(&core{cfg: cfg})}
	wait := func(n int) *int { return &n }
	tests := []struct {
		name    string
		args    api.ExecArgs
		wantErr string
	}{
		{name: "ok", args: api.ExecArgs{Host: "h", Command: "true", Cwd: "/srv", Env: map[string]string{"RAILS_ENV": "x"}, TimeoutS: 5, CallOptions: api.CallOptions{WaitS: wait(0)}}},
		{name: "no host", args: api.ExecArgs{Command: "true"}, wantErr: "host is required"},
		{name: "blank command", args: api.ExecArgs{Host: "h", Command: "  "}, wantErr: "command is required"},
		{name: "oversized command", args: api.ExecArgs{Host: "h", Command: strings.Repeat("x", 33)}, wantErr: "limit is 32"},
		{name: "NUL in command", args: api.ExecArgs{Host: "h", Command: "a\x00b"}, wantErr: "NUL"},
		{name: "invalid UTF-8", args: api.ExecArgs{Host: "h", Command: "a\xffb"}, wantErr: "UTF-8"},
		{name: "relative cwd", args: api.ExecArgs{Host: "h", Command: "true", Cwd: "srv"}, wantErr: "cwd"},
		{name: "unclean cwd", args: api.ExecArgs{Host: "h", Command: "true", Cwd: "/srv/../etc"}, wantErr: "cwd"},
		{name: "NUL in cwd", args: api.ExecArgs{Host: "h", Command: "true", Cwd: "/srv/a\x00b"}, wantErr: "cwd must be UTF-8 text without control characters"},
		{name: "newline in cwd", args: api.ExecArgs{Host: "h", Command: "true", Cwd: "/srv/a\nb"}, wantErr: "cwd must be UTF-8 text without control characters"},
		{name: "long cwd", args: api.ExecArgs{Host: "h", Command: "true", Cwd: "/" + strings.Repeat("a", 64<<10)}, wantErr: "cwd is 65537 bytes"},
		{name: "NUL in env value", args: api.ExecArgs{Host: "h", Command: "true", Env: map[string]string{"LANG": "C\x00"}}, wantErr: "without NUL"},
		{name: "newline in env name", args: api.ExecArgs{Host: "h", Command: "true", Env: map[string]string{"LC_A\nB": "x"}}, wantErr: "variable name"},
		{name: "env name", args: api.ExecArgs{Host: "h", Command: "true", Env: map[string]string{"A=B": "x"}}, wantErr: "variable name"},
		{name: "reserved env", args: api.ExecArgs{Host: "h", Command: "true", Env: map[string]string{"POSTERN_EXECUTION_ID": "ex_x"}}, wantErr: "set by the bastion"},
		{name: "LD_PRELOAD", args: api.ExecArgs{Host: "h", Command: "true", Env: map[string]string{"LD_PRELOAD": "/x.so"}}, wantErr: "no host accepts it"},
		{name: "PATH", args: api.ExecArgs{Host: "h", Command: "true", Env: map[string]string{"PATH": "/tmp"}}, wantErr: "no host accepts it"},
		{name: "negative timeout", args: api.ExecArgs{Host: "h", Command: "true", TimeoutS: -1}, wantErr: "timeout_s"},
		{name: "wait too long", args: api.ExecArgs{Host: "h", Command: "true", CallOptions: api.CallOptions{WaitS: wait(3600)}}, wantErr: "wait_s"},
		{name: "run id with newline", args: api.ExecArgs{Host: "h", Command: "true", CallOptions: api.CallOptions{RunID: "a\nb"}}, wantErr: "run_id"},
		{name: "idempotency key control char", args: api.ExecArgs{Host: "h", Command: "true", CallOptions: api.CallOptions{IdempotencyKey: "k\x01"}}, wantErr: "idempotency_key"},
		{name: "account", args: api.ExecArgs{Host: "h", Command: "true", Account: "postgres"}},
		{name: "account like an option", args: api.ExecArgs{Host: "h", Command: "true", Account: "-oProxyCommand=x"}, wantErr: "account must be a user name"},
		{name: "account with a slash", args: api.ExecArgs{Host: "h", Command: "true", Account: "../root"}, wantErr: "account must be a user name"},
		{name: "operation key with space", args: api.ExecArgs{Host: "h", Command: "true", OperationKey: "a b"}, wantErr: "operation_key"},
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

// TestValidateCommandForTheWire: a command the configuration allows but one SSH request
// cannot carry is refused.
func TestValidateCommandForTheWire(t *testing.T) {
	cfg := config.DefaultConfig("/x")
	cfg.MaxCommandBytes = 1 << 20
	b := &intake{core: testCore(&core{cfg: cfg})}
	err := b.validate(&api.ExecArgs{Host: "h", Command: strings.Repeat("x", hostproto.MaxCommandBytes+1)})
	if err == nil || !strings.Contains(err.Error(), "a host is sent at most") {
		t.Fatalf("error = %v; want the request's bound", err)
	}
	if err := b.validate(&api.ExecArgs{Host: "h", Command: strings.Repeat("x", hostproto.MaxCommandBytes)}); err != nil {
		t.Fatalf("a command of exactly the bound: %v", err)
	}
}

func TestCheckHostEnv(t *testing.T) {
	configured := fleet.Host{Name: "db-1", AcceptEnv: []string{"RAILS_ENV", "APP_*"}}
	bare := fleet.Host{Name: "web-1"}
	tests := []struct {
		name    string
		host    fleet.Host
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
	if err := fleet.Enroll(path, fleet.Host{Name: "db-1", Addr: "127.0.0.1:2222", Account: "deploy", HostKey: key, AcceptEnv: []string{"APP_*"}}); err != nil {
		t.Fatal(err)
	}
	inv, err := fleet.OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := inv.Host("db-1"); err != nil || !slices.Equal(h.AcceptEnv, []string{"APP_*"}) {
		t.Fatalf("Host = %+v, %v; want accept_env [APP_*]", h, err)
	}
	if err := fleet.Enroll(path, fleet.Host{Name: "db-2", Addr: "127.0.0.1:2222", Account: "deploy", HostKey: key, AcceptEnv: []string{"L*"}}); err == nil || !strings.Contains(err.Error(), "LD_*") {
		t.Fatalf("Enroll with accept_env L* = %v; want it refused (it would cover LD_*)", err)
	}
}

// FuzzExecArgs checks that whatever validate accepts can be fingerprinted, and that the
// fingerprint does not depend on map order or on fields outside the intent.
func FuzzExecArgs(f *testing.F) {
	f.Add("h", "true", "/srv", "LANG", "C", 5, "run-1", "key")
	f.Add("h", "migrate up; echo \"ok\"", "", "", "", 0, "", "")
	fp, err := intent.LoadOrCreateFingerprintKey(filepath.Join(f.TempDir(), "fingerprint.key"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host, command, cwd, envName, envValue string, timeout int, runID, idemKey string) {
		b := &intake{core: testCore(&core{cfg: config.DefaultConfig("/x"), fp: fp})}
		a := api.ExecArgs{Host: host, Command: command, Cwd: cwd, TimeoutS: timeout, CallOptions: api.CallOptions{RunID: runID, IdempotencyKey: idemKey}}
		if envName != "" {
			a.Env = map[string]string{envName: envValue}
		}
		if b.validate(&a) != nil {
			return
		}
		rec := intent.ActionRecord{Actor: "token:a", Tool: "ssh_exec", Channel: "ssh", Target: "host:" + a.Host,
			Command: shellCommand(a.Command), Cwd: a.Cwd, Env: a.Env, IntentScope: intent.Scope(transport.Caller{Actor: "token:a"}, a.RunID)}
		fp1, err := b.fp.Fingerprint(rec)
		if err != nil {
			t.Fatalf("validated arguments cannot be fingerprinted: %v", err)
		}
		fp2, _ := b.fp.Fingerprint(rec)
		if fp1 != fp2 || !strings.HasPrefix(fp1, intent.FingerprintPrefix) {
			t.Fatalf("fingerprint not deterministic: %s vs %s", fp1, fp2)
		}
	})
}

func TestCheckPath(t *testing.T) {
	prefixes := []string{"/v1/payments", "/v1/refunds/"}
	tests := []struct {
		path    string
		wantErr string
	}{
		{"/v1/payments", ""},
		{"/v1/payments/p_1", ""},
		{"/v1/refunds/r_1", ""},
		{"/v1/paymentsX", "not under"},
		{"/v2/payments", "not under"},
		{"/v1/payments/../admin", "clean"},
		{"/v1/payments/./x", "clean"},
		{"/v1/payments?x=1", "clean"},
		{"/v1/payments#f", "clean"},
		{"v1/payments", "clean"},
		{"/v1/payments/a\r\nX: y", "clean"},
		{"", "clean"},
	}
	for _, tt := range tests {
		err := checkPath(tt.path, prefixes)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("checkPath(%q) = %v; want %q", tt.path, err, tt.wantErr)
		}
	}
}

func TestCheckHeaders(t *testing.T) {
	b := &intake{core: testCore(&core{cfg: config.Config{Credentials: []config.Credential{{Name: "api", Kind: "header", Header: "X-Api-Key", Env: "K"}}}})}
	ep := config.Endpoint{Name: "e", Credential: "api"}
	tests := []struct {
		name    string
		headers map[string]string
		wantErr string
	}{
		{"plain", map[string]string{"X-Request-Source": "agent", "accept": "application/json"}, ""},
		{"authorization", map[string]string{"authorization": "Bearer mine"}, "set by the bastion"},
		{"credential header", map[string]string{"x-api-key": "mine"}, "set by the bastion"},
		{"idempotency key", map[string]string{"Idempotency-Key": "k"}, "set by the bastion"},
		{"host", map[string]string{"Host": "evil"}, "set by the bastion"},
		{"CRLF injection", map[string]string{"X-A": "v\r\nAuthorization: Bearer x"}, "one line"},
		{"bad name", map[string]string{"X A": "v"}, "not a valid token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.checkHeaders(tt.headers, ep)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("checkHeaders = %v; want %q", err, tt.wantErr)
			}
		})
	}
}

func TestRequestBodyIsCanonical(t *testing.T) {
	b := &intake{core: testCore(&core{cfg: config.DefaultConfig("/x")})}
	one, _, ct, err := b.requestBody(api.HTTPArgs{JSON: map[string]any{"b": 1.0, "a": []any{"x", true}}})
	if err != nil || ct != "application/json" {
		t.Fatal(err, ct)
	}
	if string(one) != `{"a":["x",true],"b":1}` {
		t.Fatalf("body = %s; want RFC 8785 canonical JSON", one)
	}
	text := "hi"
	if _, _, _, err := b.requestBody(api.HTTPArgs{JSON: map[string]any{}, Text: &text}); err == nil {
		t.Fatal("json and text together were accepted")
	}
	b.cfg.MaxRequestBodyBytes = 4
	testCore(b.core)
	if _, _, _, err := b.requestBody(api.HTTPArgs{Text: &[]string{"12345"}[0]}); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversize body: %v", err)
	}
}

// FuzzHTTPArgs: whatever the checks accept cannot split a header or leave the prefixes.
func FuzzHTTPArgs(f *testing.F) {
	f.Add("/v1/x", "X-A", "v", "k", "v")
	f.Add("/v1/../x", "Authorization", "Bearer a\r\nB: c", "a&b", "c=d")
	b := &intake{core: testCore(&core{cfg: config.DefaultConfig("/x")})}
	f.Fuzz(func(t *testing.T, p, hName, hValue, qKey, qValue string) {
		if checkPath(p, []string{"/v1"}) == nil && (!strings.HasPrefix(p, "/v1") || strings.Contains(p, "..") || strings.ContainsAny(p, "?#\r\n")) {
			t.Fatalf("path %q accepted", p)
		}
		if h, err := b.checkHeaders(map[string]string{hName: hValue}, config.Endpoint{}); err == nil {
			for k, vs := range h {
				if strings.ContainsAny(k+strings.Join(vs, ""), "\r\n\x00") || k == "Authorization" {
					t.Fatalf("header %q: %q accepted", k, vs)
				}
			}
		}
		if q, err := normalizeQuery(map[string][]string{qKey: {qValue}}); err == nil && strings.ContainsAny(q.Encode(), "\r\n ") {
			t.Fatalf("query encodes to %q", q.Encode())
		}
	})
}
