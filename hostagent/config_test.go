package hostagent_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostagent"
)

func TestParseConfig(t *testing.T) {
	cfg, err := hostagent.ParseConfig(strings.NewReader(`
listen = "0.0.0.0:2200"
data_dir = "/srv/postern"
authorized_keys_file = "/etc/postern/authorized_keys"
allowed_accounts = ["deploy", "root"]
accept_env = ["RAILS_ENV"]
missing_execution_id = "assign"
idle_timeout = "1h"
max_env_vars = 10
`))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if cfg.Listen != "0.0.0.0:2200" || cfg.IdleTimeout != time.Hour || cfg.MaxEnvVars != 10 ||
		cfg.MissingExecutionID != hostagent.MissingIDAssign || len(cfg.AllowedAccounts) != 2 {
		t.Errorf("parsed %+v", cfg)
	}
	// Unset fields keep their defaults.
	if cfg.HandshakeTimeout != 10*time.Second || cfg.MaxCommandBytes != 64<<10 || cfg.Shell != "/bin/sh" {
		t.Errorf("defaults lost: %+v", cfg)
	}
	if got, want := cfg.HostKeyPath(), "/srv/postern/host_ed25519_key"; got != want {
		t.Errorf("HostKeyPath = %q; want %q", got, want)
	}
}

func TestParseConfigRejects(t *testing.T) {
	tests := []struct {
		name, toml, wantField string
	}{
		{name: "unknown key", toml: `max_comand_bytes = 10`, wantField: "max_comand_bytes"},
		{name: "integer duration", toml: `idle_timeout = 600`, wantField: "idle_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := hostagent.ParseConfig(strings.NewReader(tt.toml))
			var cerr *hostagent.ConfigError
			if !errors.As(err, &cerr) || cerr.Field != tt.wantField {
				t.Errorf("err = %v; want ConfigError for %s", err, tt.wantField)
			}
		})
	}
	if _, err := hostagent.ParseConfig(strings.NewReader(`listen = `)); err == nil {
		t.Error("syntax error accepted")
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	cfg := hostagent.DefaultConfig()
	cfg.Listen = "nope"
	cfg.DataDir = "relative"
	cfg.AllowedAccounts = []string{"ok", "../etc"}
	cfg.AcceptEnv = []string{"LD_PRELOAD", "L*", "FINE"}
	cfg.MissingExecutionID = "maybe"
	cfg.IdleTimeout = 0
	cfg.MaxCommandBytes = 1 << 30
	cfg.MaxSessions = 0
	cfg.ControlSocketOperatorConns = cfg.ControlSocketMaxConns
	cfg.SpoolCap = cfg.OutputCap
	cfg.Shell = "sh"
	err := cfg.Validate()
	want := []string{"listen", "data_dir", "authorized_keys_file", "allowed_accounts", "accept_env", "accept_env",
		"missing_execution_id", "idle_timeout", "max_command_bytes", "max_sessions", "control_socket_operator_conns",
		"control_socket_max_conns_per_uid", "spool_cap", "shell"}
	var got []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var cerr *hostagent.ConfigError
		if !errors.As(e, &cerr) {
			t.Fatalf("not a ConfigError: %v", e)
		}
		got = append(got, cerr.Field)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("fields = %v; want %v\n%v", got, want, err)
	}
}

func TestLoadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(`listen = "127.0.0.1:1"`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := hostagent.LoadConfig(path)
	if err != nil || cfg.Listen != "127.0.0.1:1" {
		t.Errorf("LoadConfig = %+v, %v", cfg, err)
	}
	if _, err := hostagent.LoadConfig(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v; want ErrNotExist", err)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add(`listen = "127.0.0.1:2222"` + "\n" + `idle_timeout = "1m"`)
	f.Add(`allowed_accounts = ["a", 1]`)
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := hostagent.ParseConfig(strings.NewReader(text))
		if err == nil {
			_ = cfg.Validate()
		}
	})
}
