package hostagent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/envpolicy"
)

// MissingExecutionID policies: what the server does with an exec request that carries no
// POSTERN_EXECUTION_ID.
const (
	// MissingIDRefuse refuses the command (exit status 255, "postern: …" on stderr).
	MissingIDRefuse = "refuse"
	// MissingIDAssign gives the command a fresh execution id and reports it as assigned.
	MissingIDAssign = "assign"
)

// Hard upper bounds on the configurable limits. They keep a typo in the config file from
// turning a bound into no bound at all.
const (
	maxMaxCommandBytes  = 256 << 10 // an SSH packet cannot carry much more anyway
	maxMaxEnvVars       = 1024
	maxMaxEnvValueBytes = 128 << 10
	maxMaxSessions      = 4096
	maxMaxLocalConns    = 4096
	minKeyCheckInterval = 100 * time.Millisecond
	maxKeyCheckInterval = 10 * time.Minute
)

// Config is the hostagent's configuration, read from one TOML file. Every field's default is
// the value DefaultConfig returns; TOML keys are the snake_case names in the struct tags.
// Durations are TOML strings in time.ParseDuration syntax ("10s", "720h").
type Config struct {
	// Listen is the TCP address the SSH server listens on. Default "127.0.0.1:2222".
	Listen string `toml:"listen"`
	// DataDir holds the host key, markers and output spools; created with mode 0700.
	// Default "/var/lib/postern-hostagent". Must be absolute.
	DataDir string `toml:"data_dir"`
	// HostKeyFile is the persistent ed25519 host key, created on first start.
	// Default "" meaning <DataDir>/host_ed25519_key (see HostKeyPath).
	HostKeyFile string `toml:"host_key_file"`
	// HostCertificateFile is an OpenSSH host certificate of the host key (ssh-keygen -s CA
	// -h), presented to a bastion that trusts the CA instead of pinning the key. Re-read when
	// it changes. Default "": none.
	HostCertificateFile string `toml:"host_certificate_file"`
	// ControlSocket is the local control socket: operators' `postern-hostagent markers …` and
	// commands' checkpoints. Default "" meaning <DataDir>/control.sock, which only root and
	// the agent's own account can reach (the data dir is 0700); to let commands running as
	// other accounts report checkpoints, put it in a world-searchable directory such as
	// /run/postern-hostagent/control.sock — peer credentials decide what each caller may do.
	ControlSocket string `toml:"control_socket"`
	// ControlSocketMaxConns bounds the local control socket's concurrent connections, of
	// every peer together. Default 64.
	ControlSocketMaxConns int `toml:"control_socket_max_conns"`
	// ControlSocketOperatorConns of ControlSocketMaxConns are kept for operators (root and
	// the hostagent's own account): the other local accounts together hold at most the rest,
	// so they cannot lock operators out. Default 16; less than ControlSocketMaxConns.
	ControlSocketOperatorConns int `toml:"control_socket_operator_conns"`
	// ControlSocketMaxConnsPerUID bounds the concurrent connections of each local account
	// that is not an operator, so one account cannot take every slot from the others'
	// checkpoints. Default 8; at most ControlSocketMaxConns - ControlSocketOperatorConns.
	ControlSocketMaxConnsPerUID int `toml:"control_socket_max_conns_per_uid"`
	// AuthorizedKeysFile lists the public keys allowed to log in (OpenSSH authorized_keys
	// format), re-read whenever it changes. Every key in it may log in as every account in
	// AllowedAccounts; use AuthorizedKeysDir to tie keys to accounts. Default "". At least
	// one of AuthorizedKeysFile, AuthorizedKeysDir and TrustedUserCAKeysFile is required.
	AuthorizedKeysFile string `toml:"authorized_keys_file"`
	// AuthorizedKeysDir holds one authorized_keys file per account, named after it: a key in
	// <AuthorizedKeysDir>/deploy may log in as deploy only. Files are re-read whenever they
	// change; a missing file means no keys of that account's own. Default "".
	AuthorizedKeysDir string `toml:"authorized_keys_dir"`
	// TrustedUserCAKeysFile lists CA public keys (one per line) whose OpenSSH user
	// certificates are accepted; the SSH user must be one of the certificate's principals.
	// Default "".
	TrustedUserCAKeysFile string `toml:"trusted_user_ca_keys_file"`
	// KeyCheckInterval is how often the key files are checked for the open connections: a
	// connection whose key (or certificate authority) is no longer in them is closed, its
	// running commands left to go on (see reload.go). A login always reads the files anew.
	// Default 2s; 100ms..10m.
	KeyCheckInterval time.Duration `toml:"key_check_interval"`
	// AllowedAccounts are the SSH user names (= local accounts) commands may run as.
	// Default: the account the hostagent runs as.
	AllowedAccounts []string `toml:"allowed_accounts"`
	// AcceptEnv names extra environment variables accepted from clients, beyond the
	// built-in POSTERN_*, LANG and LC_*. A trailing "*" matches a prefix. Variables that
	// make the dynamic linker or the shell run code (LD_*, BASH_ENV, …) are rejected.
	// Default empty.
	AcceptEnv []string `toml:"accept_env"`
	// MissingExecutionID is "refuse" (default) or "assign".
	MissingExecutionID string `toml:"missing_execution_id"`
	// RetryFailedOperations lets a new execution id run an operation key whose previous
	// execution provably failed. Default false.
	RetryFailedOperations bool `toml:"retry_failed_operations"`
	// HandshakeTimeout bounds the time from TCP accept to an authenticated SSH connection.
	// Default 10s.
	HandshakeTimeout time.Duration `toml:"handshake_timeout"`
	// IdleTimeout closes a connection with no traffic in either direction. Default 10m.
	IdleTimeout time.Duration `toml:"idle_timeout"`
	// MaxSessions bounds the session channels open at once on one SSH connection, like
	// OpenSSH's MaxSessions; one more is refused (resource-shortage, "too many sessions").
	// The bastion runs all its executions on a host over one connection, so this is also
	// the most it can run there at once. Default 128.
	MaxSessions int `toml:"max_sessions"`
	// MaxCommandBytes bounds the exec command string. Default 65536 (64 KiB).
	MaxCommandBytes int `toml:"max_command_bytes"`
	// MaxEnvVars bounds the number of env requests per session. Default 64.
	MaxEnvVars int `toml:"max_env_vars"`
	// MaxEnvValueBytes bounds each environment value. Default 4096 (4 KiB).
	MaxEnvValueBytes int `toml:"max_env_value_bytes"`
	// OutputCap bounds the spooled output of one command, in bytes. Default 67108864 (64 MiB).
	OutputCap int64 `toml:"output_cap"`
	// SpoolCap bounds the total size of the output spool (<DataDir>/spool), in bytes. Once
	// the stored output of all executions reaches it, a new command is refused before it
	// starts (its marker says not_started and why); running commands may still write up to
	// their output caps beyond it. Must be at least twice OutputCap (one execution's stdout
	// and stderr). Default 4294967296 (4 GiB).
	SpoolCap int64 `toml:"spool_cap"`
	// KillGrace is the time between SIGTERM and SIGKILL when a command is cancelled or
	// times out. Default 5s.
	KillGrace time.Duration `toml:"kill_grace"`
	// MarkerRetention is how long terminal markers are kept. Default 720h (30 days).
	MarkerRetention time.Duration `toml:"marker_retention"`
	// Shell runs commands as `Shell -c COMMAND`. Default "/bin/sh". Must be absolute.
	Shell string `toml:"shell"`
}

// durationKeys are the TOML keys that must be strings: BurntSushi/toml would silently read an
// integer as nanoseconds, so `idle_timeout = 600` would mean 600ns.
var durationKeys = []string{"handshake_timeout", "idle_timeout", "kill_grace", "marker_retention", "key_check_interval"}

// DefaultConfig returns the configuration used for every field the file leaves out.
func DefaultConfig() Config {
	cfg := Config{
		Listen:                      "127.0.0.1:2222",
		DataDir:                     "/var/lib/postern-hostagent",
		MissingExecutionID:          MissingIDRefuse,
		HandshakeTimeout:            10 * time.Second,
		KeyCheckInterval:            2 * time.Second,
		IdleTimeout:                 10 * time.Minute,
		MaxSessions:                 128,
		ControlSocketMaxConns:       defaultLocalLimits.MaxConns,
		ControlSocketOperatorConns:  defaultLocalLimits.OperatorConns,
		ControlSocketMaxConnsPerUID: defaultLocalLimits.MaxConnsPerUID,
		MaxCommandBytes:             64 << 10,
		MaxEnvVars:                  64,
		MaxEnvValueBytes:            4 << 10,
		OutputCap:                   64 << 20,
		SpoolCap:                    4 << 30,
		KillGrace:                   5 * time.Second,
		MarkerRetention:             720 * time.Hour,
		Shell:                       "/bin/sh",
	}
	if u, err := user.Current(); err == nil {
		cfg.AllowedAccounts = []string{u.Username}
	}
	return cfg
}

// ControlSocketPath is ControlSocket, or <DataDir>/control.sock when it is empty.
func (c Config) ControlSocketPath() string {
	if c.ControlSocket != "" {
		return c.ControlSocket
	}
	return filepath.Join(c.DataDir, "control.sock")
}

// LocalLimits are the local control socket's connection limits.
func (c Config) LocalLimits() LocalLimits {
	return LocalLimits{
		MaxConns:       c.ControlSocketMaxConns,
		OperatorConns:  c.ControlSocketOperatorConns,
		MaxConnsPerUID: c.ControlSocketMaxConnsPerUID,
	}
}

// MarkersDir is where the marker store lives.
func (c Config) MarkersDir() string { return filepath.Join(c.DataDir, "markers") }

// AuditKeyPath is the audit signing key; its verifier key is AuditKeyPath()+".pub".
func (c Config) AuditKeyPath() string { return filepath.Join(c.DataDir, "audit.key") }

// HostKeyPath is HostKeyFile, or <DataDir>/host_ed25519_key when HostKeyFile is empty.
func (c Config) HostKeyPath() string {
	if c.HostKeyFile != "" {
		return c.HostKeyFile
	}
	return filepath.Join(c.DataDir, "host_ed25519_key")
}

// ConfigError is one problem with one configuration field.
type ConfigError struct {
	Field string // TOML key
	Err   error
}

func (e *ConfigError) Error() string { return "config: " + e.Field + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// ParseConfig reads a TOML configuration on top of DefaultConfig. Unknown keys are errors (a
// misspelt limit must not silently fall back to its default). It does not validate: call
// Validate after applying any overrides.
func ParseConfig(r io.Reader) (Config, error) {
	cfg := DefaultConfig()
	md, err := toml.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&cfg)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	var errs []error
	for _, key := range md.Undecoded() {
		errs = append(errs, &ConfigError{Field: key.String(), Err: errors.New("unknown key")})
	}
	for _, key := range durationKeys {
		if md.IsDefined(key) && md.Type(key) != "String" {
			errs = append(errs, &ConfigError{Field: key, Err: errors.New(`must be a duration string such as "10s"`)})
		}
	}
	if len(errs) > 0 {
		// Returned with the config decoded from the rest, so a caller can report these
		// together with Validate's problems (see IsConfigProblem).
		return cfg, errors.Join(errs...)
	}
	return cfg, nil
}

// IsConfigProblem reports whether err, from ParseConfig or LoadConfig, names keys that
// decoded wrong (*ConfigError) — the config returned with it holds the rest — rather than a
// file that could not be read or decoded at all.
func IsConfigProblem(err error) bool {
	var ce *ConfigError
	return errors.As(err, &ce)
}

// LoadConfig reads and parses the file at path. It does not validate; on a problem with
// some keys (IsConfigProblem) it returns the rest of the config with the error.
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	cfg, err := ParseConfig(f)
	if err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Validate reports every problem at once, as errors.Join of *ConfigError.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "want host:port: %w", err)
	}
	if !filepath.IsAbs(c.DataDir) {
		bad("data_dir", "must be an absolute path, got %q", c.DataDir)
	}
	for field, path := range map[string]string{
		"host_key_file":             c.HostKeyFile,
		"host_certificate_file":     c.HostCertificateFile,
		"authorized_keys_file":      c.AuthorizedKeysFile,
		"authorized_keys_dir":       c.AuthorizedKeysDir,
		"trusted_user_ca_keys_file": c.TrustedUserCAKeysFile,
	} {
		if path != "" && !filepath.IsAbs(path) {
			bad(field, "must be an absolute path, got %q", path)
		}
	}
	if c.AuthorizedKeysFile == "" && c.AuthorizedKeysDir == "" && c.TrustedUserCAKeysFile == "" {
		bad("authorized_keys_file", "at least one of authorized_keys_file, authorized_keys_dir and trusted_user_ca_keys_file is required")
	}
	if len(c.AllowedAccounts) == 0 {
		bad("allowed_accounts", "at least one account is required")
	}
	for _, name := range c.AllowedAccounts {
		if !hostproto.ValidAccountName(name) {
			bad("allowed_accounts", "invalid account name %q", name)
		}
	}
	for _, pattern := range c.AcceptEnv {
		if err := envpolicy.CheckPattern(pattern); err != nil {
			bad("accept_env", "%q: %w", pattern, err)
		}
	}
	if c.MissingExecutionID != MissingIDRefuse && c.MissingExecutionID != MissingIDAssign {
		bad("missing_execution_id", "want %q or %q, got %q", MissingIDRefuse, MissingIDAssign, c.MissingExecutionID)
	}
	positive := func(field string, d time.Duration) {
		if d <= 0 {
			bad(field, "must be positive, got %v", d)
		}
	}
	positive("handshake_timeout", c.HandshakeTimeout)
	positive("idle_timeout", c.IdleTimeout)
	positive("kill_grace", c.KillGrace)
	positive("marker_retention", c.MarkerRetention)
	if c.KeyCheckInterval < minKeyCheckInterval || c.KeyCheckInterval > maxKeyCheckInterval {
		bad("key_check_interval", "must be in %v..%v, got %v", minKeyCheckInterval, maxKeyCheckInterval, c.KeyCheckInterval)
	}
	inRange := func(field string, v, max int64) {
		if v <= 0 || v > max {
			bad(field, "must be in 1..%d, got %d", max, v)
		}
	}
	inRange("max_command_bytes", int64(c.MaxCommandBytes), maxMaxCommandBytes)
	inRange("max_env_vars", int64(c.MaxEnvVars), maxMaxEnvVars)
	inRange("max_env_value_bytes", int64(c.MaxEnvValueBytes), maxMaxEnvValueBytes)
	inRange("output_cap", c.OutputCap, 1<<40)
	inRange("max_sessions", int64(c.MaxSessions), maxMaxSessions)
	inRange("control_socket_max_conns", int64(c.ControlSocketMaxConns), maxMaxLocalConns)
	if c.ControlSocketOperatorConns < 0 || c.ControlSocketOperatorConns >= c.ControlSocketMaxConns {
		bad("control_socket_operator_conns", "must be in 0..control_socket_max_conns-1 (%d), got %d",
			c.ControlSocketMaxConns-1, c.ControlSocketOperatorConns)
	}
	if others := c.ControlSocketMaxConns - c.ControlSocketOperatorConns; c.ControlSocketMaxConnsPerUID <= 0 || c.ControlSocketMaxConnsPerUID > max(others, 1) {
		bad("control_socket_max_conns_per_uid", "must be in 1..control_socket_max_conns-control_socket_operator_conns (%d), got %d",
			others, c.ControlSocketMaxConnsPerUID)
	}
	inRange("spool_cap", c.SpoolCap, 1<<50)
	if c.SpoolCap > 0 && c.OutputCap > 0 && c.SpoolCap < 2*c.OutputCap {
		bad("spool_cap", "must hold one execution's full output (2 × output_cap = %d), got %d", 2*c.OutputCap, c.SpoolCap)
	}
	if !filepath.IsAbs(c.Shell) {
		bad("shell", "must be an absolute path, got %q", c.Shell)
	}
	return errors.Join(errs...)
}
