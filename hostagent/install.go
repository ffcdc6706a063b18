package hostagent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"

	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/internal/privdir"
)

// Default install locations (relative to InstallOptions.Root).
const (
	DefaultConfigPath         = "/etc/postern-hostagent/config.toml"
	DefaultAuthorizedKeysPath = "/etc/postern-hostagent/authorized_keys"
	// DefaultTrustedUserCAKeysPath is where install puts a bastion CA's lines (--trusted-user-ca).
	DefaultTrustedUserCAKeysPath = "/etc/postern-hostagent/user_ca.pub"
	DefaultUnitPath              = "/etc/systemd/system/postern-hostagent.service"
	DefaultBinaryPath            = "/usr/local/bin/postern-hostagent"
	DefaultControlSocketPath     = "/run/postern-hostagent/control.sock"
)

// InstallOptions says where Install puts things. Paths are as seen on the running system;
// Install writes each one under Root.
type InstallOptions struct {
	// Root is prefixed to every path written. Default "/".
	Root string
	// ConfigPath is the config file; an existing one is kept and used. Default DefaultConfigPath.
	ConfigPath string
	// UnitPath is the systemd unit; always rewritten. Default DefaultUnitPath.
	UnitPath string
	// BinaryPath is the hostagent binary the unit runs. Default DefaultBinaryPath.
	BinaryPath string
	// Listen is written into a new config file. Default DefaultConfig().Listen.
	Listen string
	// ReadWritePaths are extra paths commands may write besides the data dir: the unit uses
	// ProtectSystem=strict and commands inherit that sandbox. Default none.
	ReadWritePaths []string
	// TrustedUserCAKeys are the lines of the CAs whose user certificates log in (a bastion
	// with [ssh_ca]: `postern ca keys`). Given, a new config trusts them
	// (DefaultTrustedUserCAKeysPath) and authorizes no key at all; an existing config must
	// name a trusted_user_ca_keys_file, which is replaced with them. Default none.
	TrustedUserCAKeys []byte
}

func (o *InstallOptions) setDefaults() {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.ConfigPath == "" {
		o.ConfigPath = DefaultConfigPath
	}
	if o.UnitPath == "" {
		o.UnitPath = DefaultUnitPath
	}
	if o.BinaryPath == "" {
		o.BinaryPath = DefaultBinaryPath
	}
	if o.Listen == "" {
		o.Listen = DefaultConfig().Listen
	}
}

// Install sets the hostagent up on a machine: a default config file (if none exists), an empty
// authorized keys file (if none exists), the data dir (0700), the host key, and the systemd
// unit. It prints the host key fingerprint and how to enroll the host to w. It does not talk
// to systemd, so it can run (and be tested) against any root directory.
func Install(opts InstallOptions, w io.Writer) error {
	opts.setDefaults()
	for _, p := range append([]string{opts.ConfigPath, opts.UnitPath, opts.BinaryPath}, opts.ReadWritePaths...) {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("install: path %q must be absolute", p)
		}
	}
	under := func(p string) string { return filepath.Join(opts.Root, p) }
	if opts.TrustedUserCAKeys != nil {
		if err := checkCAKeys(opts.TrustedUserCAKeys); err != nil {
			return err
		}
	}

	cfg, created, err := installConfig(opts, under(opts.ConfigPath))
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("install: %s: %w", opts.ConfigPath, err)
	}
	// The checks serve makes at every start, made now so that a data dir serve would refuse
	// is reported by install.
	if err := privdir.Ensure(under(cfg.DataDir), "data dir", nil); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if opts.TrustedUserCAKeys != nil {
		if cfg.TrustedUserCAKeysFile == "" {
			return fmt.Errorf("install: %s names no trusted_user_ca_keys_file: add trusted_user_ca_keys_file = %q to it, then run install again", opts.ConfigPath, DefaultTrustedUserCAKeysPath)
		}
		if err := writeFileAtomic(under(cfg.TrustedUserCAKeysFile), opts.TrustedUserCAKeys, 0o644); err != nil {
			return fmt.Errorf("install: trusted user CA keys: %w", err)
		}
	}
	keysCreated := false
	if cfg.AuthorizedKeysFile != "" {
		if keysCreated, err = createIfAbsent(under(cfg.AuthorizedKeysFile), nil, 0o600); err != nil {
			return fmt.Errorf("install: authorized keys: %w", err)
		}
	}
	hostKey, err := LoadOrCreateHostKey(under(cfg.HostKeyPath()))
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	unit, err := renderUnit(opts, cfg)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(under(opts.UnitPath), unit, 0o644); err != nil {
		return fmt.Errorf("install: unit: %w", err)
	}

	// What is where on this disk: under --root, the files are not at the paths they name.
	if filepath.Clean(opts.Root) != "/" {
		fmt.Fprintf(w, "installed under %s for the machine whose / it becomes (an image, a chroot): the config and the unit\n"+
			"name that machine's paths (data_dir %s, not %s), so run them there, not from here\n",
			opts.Root, cfg.DataDir, under(cfg.DataDir))
	}
	if created {
		fmt.Fprintf(w, "wrote config          %s\n", under(opts.ConfigPath))
	} else {
		fmt.Fprintf(w, "kept existing config  %s\n", under(opts.ConfigPath))
	}
	if cfg.AuthorizedKeysFile != "" {
		if keysCreated {
			fmt.Fprintf(w, "wrote authorized keys %s (empty: nobody can log in yet)\n", under(cfg.AuthorizedKeysFile))
		} else {
			fmt.Fprintf(w, "kept authorized keys  %s\n", under(cfg.AuthorizedKeysFile))
		}
	}
	if opts.TrustedUserCAKeys != nil {
		fmt.Fprintf(w, "wrote trusted CA keys %s (the bastion's certificates log in)\n", under(cfg.TrustedUserCAKeysFile))
	}
	fmt.Fprintf(w, "data dir              %s (0700)\n", under(cfg.DataDir))
	fmt.Fprintf(w, "host key              %s\n", under(cfg.HostKeyPath()))
	fmt.Fprintf(w, "wrote unit            %s\n", under(opts.UnitPath))
	fmt.Fprintf(w, "host key fingerprint: %s\n", HostKeyFingerprint(hostKey))
	fmt.Fprintf(w, "\nNext steps:\n")
	switch {
	case opts.TrustedUserCAKeys != nil:
		fmt.Fprintf(w, "  1. nothing to authorize: %s trusts the bastion's CA (after a `postern ca rotate`, replace it with what `postern ca keys` prints)\n", cfg.TrustedUserCAKeysFile)
	case cfg.AuthorizedKeysFile != "":
		fmt.Fprintf(w, "  1. on the bastion, print its public key with `postern hosts key`, and append that line here to %s\n", cfg.AuthorizedKeysFile)
	default:
		fmt.Fprintf(w, "  1. let the bastion's key in through your SSH CA (trusted_user_ca_keys)\n")
	}
	fmt.Fprintf(w, "  2. systemctl daemon-reload && systemctl enable --now postern-hostagent\n")
	fmt.Fprintf(w, "  3. on the bastion, enroll this host (it checks that the host presents this key):\n")
	fmt.Fprintf(w, "     %s\n", EnrollCommand(cfg, HostKeyFingerprint(hostKey)))
	if host, port, err := net.SplitHostPort(cfg.Listen); err == nil {
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			fmt.Fprintf(w, "     (it listens on %s, this machine only: for a bastion elsewhere set listen = \"0.0.0.0:%s\" in %s,\n"+
				"     or install with --listen, and enroll the address the bastion reaches it at)\n", cfg.Listen, port, opts.ConfigPath)
		}
	}
	return nil
}

// EnrollCommand is the `postern hosts enroll` command that enrolls this host on the
// bastion: named after the machine, at its listen address (the machine's name when it
// listens on every address), as its first allowed account, pinned to its host key.
func EnrollCommand(cfg Config, fingerprint string) string {
	name, err := os.Hostname()
	if err != nil || !enrollName(name) {
		name = "HOSTNAME"
	}
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		host, port = "", listenPort(cfg.Listen)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = name
	}
	cmd := fmt.Sprintf("postern hosts enroll %s %s", name, net.JoinHostPort(host, port))
	if len(cfg.AllowedAccounts) > 0 {
		cmd += " --account " + cfg.AllowedAccounts[0]
	}
	return cmd + " --expect-host-key " + fingerprint
}

// enrollName reports whether name is a name `postern hosts enroll` takes (and needs no
// shell quoting): 1-64 of [A-Za-z0-9_.-], starting with a letter or digit.
func enrollName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case i > 0 && (r == '_' || r == '.' || r == '-'):
		default:
			return false
		}
	}
	return true
}

// installConfig loads the existing config file or writes a new default one.
func installConfig(opts InstallOptions, path string) (cfg Config, created bool, err error) {
	if _, err := os.Stat(path); err == nil {
		cfg, err := LoadConfig(path)
		if err != nil {
			return Config{}, false, fmt.Errorf("install: %w", err)
		}
		return cfg, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Config{}, false, fmt.Errorf("install: %w", err)
	}
	cfg = DefaultConfig()
	cfg.Listen = opts.Listen
	cfg.AuthorizedKeysFile = DefaultAuthorizedKeysPath
	if opts.TrustedUserCAKeys != nil {
		// The bastion logs in with certificates: no key is authorized, none can be left behind.
		cfg.AuthorizedKeysFile, cfg.TrustedUserCAKeysFile = "", DefaultTrustedUserCAKeysPath
	}
	cfg.ControlSocket = DefaultControlSocketPath
	var buf bytes.Buffer
	if err := configTemplate.Execute(&buf, cfg); err != nil {
		return Config{}, false, fmt.Errorf("install: render config: %w", err)
	}
	// Round-trip what we wrote so a template mistake cannot install a config serve rejects.
	if cfg, err = ParseConfig(bytes.NewReader(buf.Bytes())); err != nil {
		return Config{}, false, fmt.Errorf("install: generated config: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return Config{}, false, fmt.Errorf("install: %w", err)
	}
	if _, err := createIfAbsent(path, buf.Bytes(), 0o640); err != nil {
		return Config{}, false, fmt.Errorf("install: config: %w", err)
	}
	return cfg, true, nil
}

var configTemplate = template.Must(template.New("config").Funcs(template.FuncMap{"quote": strconv.Quote}).Parse(
	`# postern-hostagent configuration. Commented-out values are the defaults.

listen = {{quote .Listen}}
data_dir = {{quote .DataDir}}
# host_key_file = "<data_dir>/host_ed25519_key"
# An OpenSSH host certificate of that key (ssh-keygen -s CA -h -n NAME host_ed25519_key.pub),
# for a bastion that trusts the CA instead of pinning the key; re-read when it changes.
# host_certificate_file = ""

# The local control socket: operators' "postern-hostagent markers …" and the checkpoints
# commands report. The unit's RuntimeDirectory makes /run/postern-hostagent reachable by
# every account; peer credentials decide what each caller may do.
control_socket = {{quote .ControlSocket}}
# Connections to it at once: all peers; kept for operators (root, the agent's account); each
# other account.
# control_socket_max_conns = 64
# control_socket_operator_conns = 16
# control_socket_max_conns_per_uid = 8

# Public-key authentication only: an authorized_keys file (re-read when it changes) and/or
# CA keys whose OpenSSH user certificates are accepted (the SSH user must be a principal).
# Every key in authorized_keys_file may log in as every allowed account. To tie keys to
# accounts, put them in authorized_keys_dir/<account> instead (one file per account).
{{if .AuthorizedKeysFile}}authorized_keys_file = {{quote .AuthorizedKeysFile}}{{else}}# authorized_keys_file = "/etc/postern-hostagent/authorized_keys"{{end}}
# authorized_keys_dir = "/etc/postern-hostagent/authorized_keys.d"
{{if .TrustedUserCAKeysFile}}trusted_user_ca_keys_file = {{quote .TrustedUserCAKeysFile}}{{else}}# trusted_user_ca_keys_file = "/etc/postern-hostagent/user_ca.pub"{{end}}

# SSH user names commands may run as (switching accounts needs the agent to run as root).
allowed_accounts = [{{range $i, $a := .AllowedAccounts}}{{if $i}}, {{end}}{{quote $a}}{{end}}]

# Extra client environment variables accepted besides POSTERN_*, LANG and LC_*.
# accept_env = []

# "refuse" a command without POSTERN_EXECUTION_ID, or "assign" it one.
missing_execution_id = {{quote .MissingExecutionID}}
# retry_failed_operations = false

# handshake_timeout = "10s"
# idle_timeout = "10m"
# Session channels open at once on one SSH connection (the bastion's executions on this host).
# max_sessions = 128
# max_command_bytes = 65536
# max_env_vars = 64
# max_env_value_bytes = 4096
# output_cap = 67108864
# spool_cap = 4294967296
# kill_grace = "5s"
# marker_retention = "720h"
# shell = "/bin/sh"
`))

// The unit runs the agent as root so it can run commands as the allowed accounts.
//
// NoNewPrivileges=yes is kept even so: switching to a less privileged uid with setuid/setgid
// is not a privilege gain and still works. What it blocks is a command gaining privileges
// through setuid binaries or file capabilities (sudo, su, ping on some systems) — the
// accounts a command may use are decided by allowed_accounts, not by sudoers.
//
// KillMode=process: stopping or restarting the agent kills only the agent; commands run under
// the per-host supervisor and are re-adopted by the next agent, never re-run.
var unitTemplate = template.Must(template.New("unit").Parse(`[Unit]
Description=Postern hostagent (marker-guarded remote execution over SSH)
Documentation=https://github.com/postern-dev/postern
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={{.Binary}} serve --config {{.Config}}
# systemctl reload: the agent re-reads its config (keys, accounts, env; not listen or the data
# dir); a bad config changes nothing and fails the reload with the reason.
ExecReload={{.Binary}} reload --config {{.Config}}
Restart=always
RestartSec=1s
# Only the agent is stopped on restart; running commands (their supervisor) survive and are re-adopted.
KillMode=process
# Commands inherit this sandbox: they cannot gain privileges (no sudo/setuid) and can write
# only the paths listed in ReadWritePaths (install --read-write adds more).
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={{.ReadWritePaths}}
# Holds the control socket; kept across restarts so commands can checkpoint meanwhile.
RuntimeDirectory=postern-hostagent
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=restart
# No PrivateTmp: systemd tears an invocation's private /tmp down when the agent restarts,
# under the commands that survive the restart. They share the host's /tmp and /var/tmp.
ProtectKernelModules=yes
ProtectKernelTunables=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=~@cpu-emulation @module @obsolete @raw-io @reboot @swap
SystemCallErrorNumber=EPERM
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
UMask=0077

[Install]
WantedBy=multi-user.target
`))

func renderUnit(opts InstallOptions, cfg Config) ([]byte, error) {
	paths := append([]string{cfg.DataDir, "/tmp", "/var/tmp"}, opts.ReadWritePaths...)
	for _, p := range append(paths, opts.BinaryPath, opts.ConfigPath) {
		// systemd splits these lines on whitespace and expands % specifiers.
		if strings.ContainsAny(p, " \t\n%\"'\\") {
			return nil, fmt.Errorf("install: path %q contains characters the unit file cannot carry", p)
		}
	}
	var buf bytes.Buffer
	err := unitTemplate.Execute(&buf, map[string]string{
		"Binary":         opts.BinaryPath,
		"Config":         opts.ConfigPath,
		"ReadWritePaths": strings.Join(paths, " "),
	})
	if err != nil {
		return nil, fmt.Errorf("install: render unit: %w", err)
	}
	return buf.Bytes(), nil
}

func listenPort(listen string) string {
	if i := strings.LastIndexByte(listen, ':'); i >= 0 {
		return listen[i+1:]
	}
	return listen
}

// createIfAbsent writes data to path only if path does not exist yet, and says whether it did.
func createIfAbsent(path string, data []byte, perm os.FileMode) (created bool, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	err = durable.CreateFile(path, data, perm)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	return err == nil, err
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return durable.WriteFile(path, data, perm)
}

// checkCAKeys refuses CA lines the hostagent would skip (a file that trusts less than it
// shows), or none at all.
func checkCAKeys(data []byte) error {
	var problems []string
	keys := parseKeyFile(data, true, func(line int, reason string) {
		problems = append(problems, fmt.Sprintf("line %d: %s", line, reason))
	})
	if len(problems) > 0 {
		return fmt.Errorf("install: trusted user CA keys: %s (want the lines `postern ca keys` prints)", strings.Join(problems, "; "))
	}
	if len(keys) == 0 {
		return errors.New("install: trusted user CA keys: no key (want the lines `postern ca keys` prints)")
	}
	return nil
}
