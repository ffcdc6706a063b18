// Package config is the bastion's configuration file: the TOML it reads (DefaultConfig, then
// ParseConfig), the paths under the state dir, the action classes, the HTTP endpoints and
// credentials by reference, and the journal backend. Validate reports every problem at once; a
// config that does not validate is never served.
package config

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/markers"
)

// Config is the bastion's configuration file (TOML). Durations are strings in
// time.ParseDuration syntax ("30s", "24h"). Paths left empty live under StateDir.
type Config struct {
	// StateDir holds the journal, the keys, the inventory and the sockets. Required.
	StateDir string `toml:"state_dir"`
	// Listen is the Streamable HTTP address. Default "127.0.0.1:7410"; "" disables HTTP.
	Listen string `toml:"listen"`
	// HTTPSessions serves clients of protocol versions before 2026-07-28 on Listen with
	// stateful Streamable HTTP sessions (Mcp-Session-Id), so the bastion can ask their users
	// for approvals (elicitation); newer clients stay stateless. Default false: stateless.
	HTTPSessions bool `toml:"http_sessions"`
	// TLSCertFile and TLSKeyFile serve HTTPS; required when Listen is not a loopback address.
	TLSCertFile string `toml:"tls_cert_file"`
	TLSKeyFile  string `toml:"tls_key_file"`
	// AllowedHosts and AllowedOrigins guard against DNS rebinding: Host headers (on a listen
	// that is not loopback) and browser origins (http(s)://host[:port]) accepted besides the
	// loopback ones. "null" cannot be listed. See transport/origin.go.
	AllowedHosts   []string `toml:"allowed_hosts"`
	AllowedOrigins []string `toml:"allowed_origins"`
	// Socket is the local MCP endpoint, where the kernel names the caller. Default
	// <state_dir>/mcp.sock. Only root, the bastion's own user and the uids of [[actors]] may
	// connect (checked at accept); when actors name other uids it is made 0666 and must be
	// outside state_dir, in a directory they can search (e.g. /run/postern/mcp.sock).
	Socket string `toml:"socket"`
	// MaxLocalConns bounds the open connections of each local socket; the last 1/16 of them
	// are kept for root and the bastion's own user. Default 1024.
	MaxLocalConns int `toml:"max_local_conns"`
	// MaxLocalConnsPerUID bounds the open connections of one other uid on the MCP socket.
	// Default 128.
	MaxLocalConnsPerUID int `toml:"max_local_conns_per_uid"`
	// OperatorSocket serves the operator CLI (executions, hosts, markers, audit). Default
	// <state_dir>/operator.sock; only the bastion's own user and root may connect.
	OperatorSocket string `toml:"operator_socket"`
	// InventoryFile lists the enrolled hosts. Default <state_dir>/hosts.toml.
	InventoryFile string `toml:"inventory_file"`
	// ClientKeyFile is the bastion's SSH key for hostagents. Default
	// <state_dir>/bastion_ed25519 (generated on first start).
	ClientKeyFile string `toml:"client_key_file"`
	// HostCAs are the host certificate authorities whose certificates vouch for hosts
	// enrolled with host_key = "@cert-authority" instead of a pinned key.
	HostCAs []HostCA `toml:"host_cas"`
	// SSHCA makes the bastion its hosts' SSH user certificate authority (sshca.go).
	SSHCA SSHCA `toml:"ssh_ca"`
	// RevokedHostKeysFile lists revoked host keys, CA keys and certificate serials
	// (fleet.Revocations), re-read when it changes. Default "": none. A file that cannot be
	// read refuses every host.
	RevokedHostKeysFile string `toml:"revoked_host_keys_file"`

	// OAuth also admits remote callers by OAuth access tokens ([oauth], oauth.go); a reload
	// applies its mapping only. Default none.
	OAuth *OAuth `toml:"oauth"`

	// Actors are the callers: remote ones by bearer token (the config stores its SHA-256),
	// local ones by process (uid, executable), each with the hosts, tools and endpoints it
	// may use and its limits. Local callers of the bastion's own uid need no entry.
	Actors []policy.Actor `toml:"actors"`
	// Classes override the built-in action classes' windows and retention, or add classes.
	Classes []Class `toml:"classes"`
	// Principals group actors that are one party (one user's HTTP token and local agents):
	// an idempotency key is the principal's, whichever of its actors sends it.
	Principals []Principal `toml:"principals"`
	// Rules map actors, hosts and command patterns (or endpoints and methods) to action
	// classes, denials and approval requirements (bastion/policy: deny wins).
	Rules []policy.Rule `toml:"rules"`

	// HTTPPlugin is the plugin binary that performs http_request (pinned by its SHA-256).
	HTTPPlugin Plugin `toml:"http_plugin"`
	// Journal chooses the journal's backend (Pebble in the state dir, or etcd for replicas).
	Journal Journal `toml:"journal"`
	// Endpoints are the HTTP APIs agents may call, by name.
	Endpoints []Endpoint `toml:"endpoints"`
	// Credentials are the secrets endpoints use, by reference; their values are read at
	// dispatch from a file or an environment variable, never stored.
	Credentials []Credential `toml:"credentials"`
	// MaxRequestBodyBytes bounds an http_request body. Default 256 KiB.
	MaxRequestBodyBytes int `toml:"max_request_body_bytes"`

	// DefaultWait is how long a tool call waits for a command before returning it as
	// running. Default 30s; a call's wait_s may ask for up to MaxWait (default 5m).
	DefaultWait time.Duration `toml:"default_wait"`
	MaxWait     time.Duration `toml:"max_wait"`
	// MaxCommandBytes bounds a command string. Default 64 KiB.
	MaxCommandBytes int `toml:"max_command_bytes"`
	// OutputTailBytes is how much of each stream a result carries and the journal stores.
	// Default 64 KiB.
	OutputTailBytes int `toml:"output_tail_bytes"`
	// MaxBodyBytes bounds an MCP request body. Default 1 MiB.
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// ReconcileInterval is how often executions with an unknown outcome are reconciled
	// with their hosts again (and expired approvals rejected). Default 15s.
	ReconcileInterval time.Duration `toml:"reconcile_interval"`
	// RetentionInterval is how often the journal's retention pass runs (docs/design.md,
	// "Retention"; on etcd, on the elected replica). Default 1h; "0s" runs none (then
	// `postern journal gc` runs it).
	RetentionInterval time.Duration `toml:"retention_interval"`
	// EventRetention is how long the journal's hash chain keeps events: a retention pass
	// prunes the older ones, carrying forward first those of executions still held (each
	// copied once per event_retention while it is held). Default: the shortest class
	// retention, plus its removal margin (at most 10 minutes) and two retention intervals
	// (bastion/journal.Retention).
	// Longer carries less often but keeps removed executions' events longer; shorter the
	// reverse.
	EventRetention time.Duration `toml:"event_retention"`
	// ApprovalTimeout rejects an execution that waited this long for an operator's
	// decision. Default 1h; "0s" waits forever.
	ApprovalTimeout time.Duration `toml:"approval_timeout"`
	// Approvals says who decides approvals and reviews on the operator socket, and where
	// approval requests are announced.
	Approvals Approvals `toml:"approvals"`
	// DeliveryRevokeGrace is how long after a result was delivered a notifications/cancelled
	// for its request still revokes the delivery (the client gave up on it), so a re-issue
	// replays the result instead of running again. Default 30s; "0s" revokes nothing after
	// delivery (a cancel before delivery still prevents it). At most 10m.
	DeliveryRevokeGrace time.Duration `toml:"delivery_revoke_grace"`
	// DeliverySettle is how long after a result was delivered an identical call waits before
	// it counts as a new intent: over Streamable HTTP a client's notifications/cancelled is a
	// POST of its own, and the re-issue that follows an abort may overtake it. Calls through
	// the stdio bridge (postern mcp) never wait: it forwards a cancel before the next call.
	// Default 1s; "0s" decides at once. At most 10s.
	DeliverySettle time.Duration `toml:"delivery_settle"`
}

// Class sets an action class's attach window (how long a retry joins a prior
// execution of the same intent) and retention (how long a finished record is kept).
type Class struct {
	Name         string        `toml:"name"`
	AttachWindow time.Duration `toml:"attach_window"`
	Retention    time.Duration `toml:"retention"`
	// OperatorApprovalOnly: an approval of this class is decided by an operator
	// (`postern approve`/`deny`) only. Unset: true for every class. false also lets the
	// agent's client relay its user's answer (elicitation) — which any process of the
	// agent's uid could give as well, so set it only where that is acceptable.
	OperatorApprovalOnly *bool `toml:"operator_approval_only"`
}

// Approvals are the operators who may let an execution run (approve it, or review its
// outcome) and the webhook that announces approval requests (docs/policy.md, "Who approves").
type Approvals struct {
	// Operators are the local users (names or numeric uids) whose `postern approve` and
	// `postern review` count, and no other's: naming one vouches that no agent runs as it.
	// Default: anyone the operator socket admits (root and the bastion's user) except a uid
	// an agent may run as — the uid that made the execution's call, the bastion's own user,
	// the uids of local [[actors]] — since any process of that uid, the agent's own shell
	// included, could send the decision. Denials are taken from anyone the socket admits.
	Operators []string `toml:"operators"`
	// Webhook is an http(s) URL the bastion POSTs every new approval request to (JSON,
	// api.ApprovalRequest), so an operator hears of it. "" announces nothing.
	Webhook string `toml:"webhook"`
	// WebhookSecretFile holds a secret (a reference, never the value) with which each
	// webhook body is signed: header Postern-Signature: sha256=<hex HMAC-SHA256 of the body>.
	WebhookSecretFile string `toml:"webhook_secret_file"`
}

// Plugin locates a plugin binary and pins it.
type Plugin struct {
	Path   string `toml:"path"`
	SHA256 string `toml:"sha256"`
}

// Endpoint is one HTTP API agents may call through http_request.
type Endpoint struct {
	Name    string `toml:"name"`
	BaseURL string `toml:"base_url"`
	// Methods allowed (upper case). Default ["GET"].
	Methods []string `toml:"methods"`
	// PathPrefixes the request path must start with. Default ["/"].
	PathPrefixes []string `toml:"path_prefixes"`
	// Class decides what an unknown outcome allows (docs/design.md, "Action classes"). Default idempotent_write.
	Class string `toml:"class"`
	// Credential names a [[credentials]] entry ("" = none).
	Credential string `toml:"credential"`
	// Timeout bounds one request. Default 30s.
	Timeout time.Duration `toml:"timeout"`
	// KeepHeaders are the response headers results carry. Default Content-Type, Location,
	// Idempotent-Replayed, Retry-After.
	KeepHeaders []string `toml:"keep_headers"`
	// StatusCheck is the path (under BaseURL) a conditional_write endpoint answers "did
	// execution {execution_id} take effect?" on: 2xx yes, 404 no.
	StatusCheck string `toml:"status_check"`
	// MaxResponseBytes bounds a stored response body. Default 256 KiB.
	MaxResponseBytes int64 `toml:"max_response_bytes"`
}

// Credential is a secret by reference.
type Credential struct {
	Name string `toml:"name"`
	// Kind is bearer (Authorization: Bearer), basic (with Username) or header (Header: value).
	Kind     string `toml:"kind"`
	Header   string `toml:"header"`
	Username string `toml:"username"`
	// File or Env holds the secret; exactly one.
	File string `toml:"file"`
	Env  string `toml:"env"`
}

// Policy compiles the actors and rules, with the implicit local actor of the bastion's own
// user (its agents reach the 0600 socket anyway) when no configured local actor claims that
// uid.
func (c Config) Policy() (*policy.Policy, error) {
	actors := append([]policy.Actor(nil), c.Actors...)
	uid := os.Geteuid()
	claimed := false
	for _, a := range actors {
		if a.UID != nil && *a.UID == uid {
			claimed = true
		}
	}
	if !claimed {
		actors = append(actors, policy.Actor{Name: SelfActor, UID: &uid})
	}
	classes := make([]string, 0, len(builtinClasses)+len(c.Classes))
	for _, cl := range builtinClasses {
		classes = append(classes, cl.Name)
	}
	for _, cl := range c.Classes {
		classes = append(classes, cl.Name)
	}
	return policy.New(actors, c.Rules, classes)
}

// maxDeliveryRevokeGrace bounds delivery_revoke_grace: a cancel arrives within moments of the
// response it abandons, and every delivered call is remembered for the grace window.
const maxDeliveryRevokeGrace = 10 * time.Minute

// maxDeliverySettle bounds delivery_settle: an identical call waits at most this long.
const maxDeliverySettle = 10 * time.Second

// SelfActor is the policy name of local callers running as the bastion's own user, when no
// configured local actor claims its uid.
const SelfActor = "self"

// DefaultConfig returns the defaults for state dir dir.
func DefaultConfig(dir string) Config {
	return Config{
		StateDir:            dir,
		Listen:              "127.0.0.1:7410",
		DefaultWait:         30 * time.Second,
		MaxWait:             5 * time.Minute,
		MaxCommandBytes:     64 << 10,
		OutputTailBytes:     64 << 10,
		MaxBodyBytes:        1 << 20,
		ReconcileInterval:   15 * time.Second,
		RetentionInterval:   time.Hour,
		MaxRequestBodyBytes: 256 << 10,
		ApprovalTimeout:     time.Hour,
		MaxLocalConns:       transport.DefaultMaxLocalConns,
		MaxLocalConnsPerUID: transport.DefaultMaxLocalConnsPerUID,
		DeliveryRevokeGrace: 30 * time.Second,
		DeliverySettle:      time.Second,
		SSHCA:               SSHCA{CertLifetime: defaultCertLifetime, RotationOverlap: defaultRotationOverlap},
	}
}

// LocalUIDs are the uids of the configured local actors: they may connect to the MCP socket.
func (c Config) LocalUIDs() []int {
	var uids []int
	for _, a := range c.Actors {
		if a.UID != nil && !slices.Contains(uids, *a.UID) {
			uids = append(uids, *a.UID)
		}
	}
	return uids
}

// SocketAccess is who may connect to the MCP socket (uids = the local actors' uids) or to
// the operator socket (uids = nil: the owners only).
func (c Config) SocketAccess(uids []int, log *slog.Logger) transport.UnixAccess {
	return transport.UnixAccess{UIDs: uids, MaxConns: c.MaxLocalConns, MaxConnsPerUID: c.MaxLocalConnsPerUID, Logger: log}
}

// SocketPath is where the local MCP endpoint listens (what `postern mcp` connects to).
func (c Config) SocketPath() string { return c.orState(c.Socket, "mcp.sock") }

// OperatorSocketPath is where the operator API listens.
func (c Config) OperatorSocketPath() string { return c.orState(c.OperatorSocket, "operator.sock") }

// InventoryPath is the enrolled-hosts file.
func (c Config) InventoryPath() string { return c.orState(c.InventoryFile, "hosts.toml") }

// ClientKeyPath is the bastion's SSH private key.
func (c Config) ClientKeyPath() string { return c.orState(c.ClientKeyFile, "bastion_ed25519") }

// ClientPublicKeyPath is its public key, an authorized_keys line (written by
// fleet.LoadOrCreateClientKey): what `postern hosts key` prints.
func (c Config) ClientPublicKeyPath() string { return c.ClientKeyPath() + ".pub" }

// JournalDir is the journal's Pebble data dir.
func (c Config) JournalDir() string { return filepath.Join(c.StateDir, "journal") }

// ReloadLogPath is where each reload's change is logged (api.ConfigChange, one JSON line).
func (c Config) ReloadLogPath() string { return filepath.Join(c.StateDir, "reloads.jsonl") }

// AuditKeyPath is the journal's Ed25519 audit key.
func (c Config) AuditKeyPath() string { return filepath.Join(c.StateDir, "audit.key") }

// FingerprintKeyPath is the per-installation secret of intent fingerprints.
func (c Config) FingerprintKeyPath() string { return filepath.Join(c.StateDir, "fingerprint.key") }

func (c Config) orState(p, name string) string {
	if p != "" {
		return p
	}
	return filepath.Join(c.StateDir, name)
}

var durationKeys = []string{"default_wait", "max_wait", "reconcile_interval", "approval_timeout", "delivery_revoke_grace", "delivery_settle"}

// ParseConfig reads TOML on top of DefaultConfig(""). Unknown keys are errors: a misspelt
// limit must not fall back to its default silently.
func ParseConfig(r io.Reader) (Config, error) {
	cfg, problems, err := parseConfig(r)
	if err != nil {
		return Config{}, err
	}
	if problems != nil {
		return Config{}, problems
	}
	return cfg, nil
}

// parseConfig decodes a config. err is a file that does not decode; problems are the keys
// that decoded wrong (unknown, or a duration that is not a string), with cfg decoded from the
// rest, so that LoadConfig reports them together with Validate's.
func parseConfig(r io.Reader) (cfg Config, problems, err error) {
	cfg = DefaultConfig("")
	md, err := toml.NewDecoder(io.LimitReader(r, maxConfigBytes)).Decode(&cfg)
	if err != nil {
		return Config{}, nil, fmt.Errorf("config: %w", err)
	}
	var errs []error
	for _, key := range md.Undecoded() {
		errs = append(errs, fmt.Errorf("config: %s: unknown key", key))
	}
	for _, key := range durationKeys {
		if md.IsDefined(key) && md.Type(key) != "String" {
			errs = append(errs, fmt.Errorf(`config: %s: must be a duration string such as "30s"`, key))
		}
	}
	errs = append(errs, sshCADurationProblems(md)...)
	return cfg, errors.Join(errs...), nil
}

// LoadConfig reads, parses and validates the file at path, reporting every problem at once.
func LoadConfig(path string) (Config, error) {
	cfg, _, err := ReadConfig(path)
	return cfg, err
}

// ReadConfig is LoadConfig that also returns the file's digest (Digest), which names the
// config in the reload log and postern status.
func ReadConfig(path string) (Config, string, error) {
	data, err := readBounded(path)
	if err != nil {
		return Config{}, "", fmt.Errorf("config: %w", err)
	}
	cfg, err := loadConfig(path, data)
	if err != nil {
		return Config{}, "", err
	}
	return cfg, Digest(data), nil
}

// maxConfigBytes bounds a config file.
const maxConfigBytes = 1 << 20

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxConfigBytes)
	}
	return data, nil
}

func loadConfig(path string, data []byte) (Config, error) {
	cfg, problems, err := parseConfig(bytes.NewReader(data))
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if err := errors.Join(problems, cfg.Validate()); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

var actorName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// ValidName reports whether s is a valid name of an actor, class, endpoint, credential or host:
// 1-64 of [A-Za-z0-9_.-], starting with a letter or digit.
func ValidName(s string) bool { return actorName.MatchString(s) }

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: "+format, args...)) }
	if !filepath.IsAbs(c.StateDir) {
		bad("state_dir must be an absolute path, got %q", c.StateDir)
	}
	if c.Listen != "" {
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			bad("listen: want host:port: %v", err)
		} else if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
			bad("listen: %s is not a loopback address; set tls_cert_file and tls_key_file to serve it", c.Listen)
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("tls_cert_file and tls_key_file go together")
	}
	for i, o := range c.AllowedOrigins {
		if _, err := transport.ParseAllowedOrigin(o); err != nil {
			bad("allowed_origins[%d]: %v", i, err)
		}
	}
	seen := map[string]bool{}
	for i, a := range c.Actors {
		if !actorName.MatchString(a.Name) {
			bad("actors[%d]: name %q: want 1-64 of [A-Za-z0-9_.-]", i, a.Name)
		}
		if seen[a.Name] {
			bad("actors[%d]: duplicate name %q", i, a.Name)
		}
		seen[a.Name] = true
		switch {
		case a.TokenSHA256 == "" && !a.Remote && a.UID == nil && a.Exe == "":
			bad("actors[%d] (%s): give token_sha256 or remote = true (a remote actor) or uid/exe (a local one)", i, a.Name)
		case (a.TokenSHA256 != "" || a.Remote) && (a.UID != nil || a.Exe != ""):
			bad("actors[%d] (%s): an actor is remote (token_sha256, remote) or local (uid/exe), not both", i, a.Name)
		case a.TokenSHA256 != "":
			if b, err := hex.DecodeString(a.TokenSHA256); err != nil || len(b) != 32 {
				bad("actors[%d] (%s): token_sha256 must be 64 hex characters (the token itself never goes in the config)", i, a.Name)
			}
		}
	}
	classes := map[string]bool{}
	for _, cl := range builtinClasses {
		classes[cl.Name] = true
	}
	for i, cl := range c.Classes {
		if !actorName.MatchString(cl.Name) {
			bad("classes[%d]: invalid name %q", i, cl.Name)
		}
		if cl.AttachWindow < 0 || cl.Retention < 0 {
			bad("classes[%d] (%s): attach_window and retention must not be negative", i, cl.Name)
		}
		if cl.Retention != 0 && cl.AttachWindow > cl.Retention {
			bad("classes[%d] (%s): attach_window %v is longer than retention %v", i, cl.Name, cl.AttachWindow, cl.Retention)
		}
		classes[cl.Name] = true
	}
	if pol, err := c.Policy(); err != nil {
		errs = append(errs, fmt.Errorf("config: %w", err))
	} else {
		errs = append(errs, c.validatePrincipals(pol)...)
	}
	errs = append(errs, c.Approvals.validate()...)
	if c.DefaultWait < 0 || c.MaxWait <= 0 || c.DefaultWait > c.MaxWait {
		bad("default_wait (%v) must be in 0..max_wait (%v)", c.DefaultWait, c.MaxWait)
	}
	if c.MaxCommandBytes <= 0 || c.MaxCommandBytes > 1<<20 {
		bad("max_command_bytes must be in 1..1048576, got %d", c.MaxCommandBytes)
	}
	if c.OutputTailBytes <= 0 || c.OutputTailBytes > 256<<10 {
		bad("output_tail_bytes must be in 1..262144, got %d", c.OutputTailBytes)
	}
	if c.MaxBodyBytes < 4<<10 || c.MaxBodyBytes > 64<<20 {
		bad("max_body_bytes must be in 4096..67108864, got %d", c.MaxBodyBytes)
	}
	if c.ReconcileInterval <= 0 {
		bad("reconcile_interval must be positive")
	}
	if c.ApprovalTimeout < 0 {
		bad("approval_timeout must not be negative")
	}
	if c.RetentionInterval < 0 {
		bad("retention_interval must not be negative (\"0s\" runs no scheduled retention pass)")
	}
	if c.EventRetention < 0 {
		bad("event_retention must not be negative")
	}
	if c.MaxLocalConns < 16 || c.MaxLocalConns > 1<<16 {
		bad("max_local_conns must be in 16..65536, got %d", c.MaxLocalConns)
	}
	if c.MaxLocalConnsPerUID <= 0 || c.MaxLocalConnsPerUID > c.MaxLocalConns {
		bad("max_local_conns_per_uid must be in 1..max_local_conns (%d), got %d", c.MaxLocalConns, c.MaxLocalConnsPerUID)
	}
	if c.SocketAccess(c.LocalUIDs(), nil).Shared() && filepath.Clean(filepath.Dir(c.SocketPath())) == filepath.Clean(c.StateDir) {
		bad("actors name other uids, who must reach the MCP socket: set socket outside state_dir (which stays 0700), e.g. socket = \"/run/postern/mcp.sock\"")
	}
	if c.DeliveryRevokeGrace < 0 || c.DeliveryRevokeGrace > maxDeliveryRevokeGrace {
		bad("delivery_revoke_grace must be in 0s..%v, got %v", maxDeliveryRevokeGrace, c.DeliveryRevokeGrace)
	}
	if c.DeliverySettle < 0 || c.DeliverySettle > maxDeliverySettle {
		bad("delivery_settle must be in 0s..%v, got %v", maxDeliverySettle, c.DeliverySettle)
	}
	if c.MaxRequestBodyBytes <= 0 || c.MaxRequestBodyBytes > markers.MaxResultBytes/2 {
		bad("max_request_body_bytes must be in 1..%d, got %d", markers.MaxResultBytes/2, c.MaxRequestBodyBytes)
	}
	errs = append(errs, c.validateHostCAs()...)
	errs = append(errs, c.SSHCA.validate()...)
	errs = append(errs, c.validateOAuth()...)
	if c.RevokedHostKeysFile != "" && !filepath.IsAbs(c.RevokedHostKeysFile) {
		bad("revoked_host_keys_file must be an absolute path, got %q", c.RevokedHostKeysFile)
	}
	errs = append(errs, c.validateHTTP(classes)...)
	errs = append(errs, c.Journal.validate()...)
	return errors.Join(errs...)
}
