package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// ManagerOptions configures a Manager.
type ManagerOptions struct {
	// Path is the plugin binary. Required.
	Path string
	// SHA256 is the hex SHA-256 the binary must have, checked before every start (and again by
	// go-plugin's SecureConfig right before exec). Required.
	SHA256 string
	// Logger receives the manager's and the plugin's log lines. Default: slog.Default().
	Logger *slog.Logger
	// StartTimeout bounds the plugin's handshake. Default: 10s.
	StartTimeout time.Duration
}

// Manager runs the HTTP channel plugin process on behalf of the bastion: it starts it on
// demand, verifies its checksum, and replaces it after a crash. Safe for concurrent use; all
// concurrent Performs share one plugin process.
type Manager struct {
	opts     ManagerOptions
	checksum []byte
	logger   *slog.Logger

	// mu guards client and channel: the running plugin, nil when none.
	mu      sync.Mutex
	client  *plugin.Client
	channel Channel
	closed  bool
}

// NewManager validates opts and checks the binary's checksum now, so a misconfiguration is
// reported at startup. It starts no process.
func NewManager(opts ManagerOptions) (*Manager, error) {
	var problems []string
	if opts.Path == "" {
		problems = append(problems, "Path is empty")
	}
	checksum, err := hex.DecodeString(strings.TrimSpace(opts.SHA256))
	if err != nil || len(checksum) != sha256.Size {
		problems = append(problems, fmt.Sprintf("SHA256 %q is not a hex SHA-256", opts.SHA256))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("plugins: invalid manager options: %s", strings.Join(problems, "; "))
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 10 * time.Second
	}
	m := &Manager{opts: opts, checksum: checksum, logger: opts.Logger.With("component", "plugin-manager", "plugin", opts.Path)}
	if err := m.verifyChecksum(); err != nil {
		return nil, err
	}
	return m, nil
}

// FileSHA256 returns the hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("plugins: checksum %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("plugins: checksum %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (m *Manager) verifyChecksum() error {
	got, err := FileSHA256(m.opts.Path)
	if err != nil {
		return err
	}
	if want := hex.EncodeToString(m.checksum); got != want {
		return fmt.Errorf("%w: %s has sha256 %s, configured sha256 %s", ErrChecksumMismatch, m.opts.Path, got, want)
	}
	return nil
}

// Perform runs action on the plugin, starting it if none is running, with journal served to
// the plugin over the broker for this call. If the plugin dies or the connection breaks during
// the call, the error wraps ErrPluginCrashed and the next Perform starts a new process; the
// caller decides the outcome from what journal recorded (dispatched → unknown, else failed).
// If ctx ends first the error wraps ctx.Err() and the same rule applies.
func (m *Manager) Perform(ctx context.Context, action HTTPAction, journal Journal) (Outcome, error) {
	client, channel, err := m.running()
	if err != nil {
		return Outcome{}, err
	}
	out, err := channel.Perform(ctx, action, journal)
	if err != nil && (errors.Is(err, ErrPluginCrashed) || client.Exited()) {
		m.logger.Warn("plugin crashed during a call; it will be restarted", "execution_id", action.ExecutionID, "error", err)
		m.discard(client)
		if !errors.Is(err, ErrPluginCrashed) {
			err = fmt.Errorf("%w: %w", ErrPluginCrashed, err)
		}
	}
	return out, err
}

// running returns the live plugin, starting one if there is none or the last one exited.
func (m *Manager) running() (*plugin.Client, Channel, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, errors.New("plugins: manager is closed")
	}
	if m.client != nil && !m.client.Exited() {
		return m.client, m.channel, nil
	}
	if m.client != nil {
		kill(m.client, m.channel) // reap and clean up the exited one
		m.client, m.channel = nil, nil
	}
	client, channel, err := m.startLocked()
	if err != nil {
		return nil, nil, err
	}
	m.client, m.channel = client, channel
	return client, channel, nil
}

func (m *Manager) startLocked() (*plugin.Client, Channel, error) {
	if err := m.verifyChecksum(); err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(m.opts.Path)
	// The plugin must not outlive the bastion: the kernel kills it when the bastion dies.
	// Pdeathsig follows the thread that started it; the Go runtime does not retire threads
	// that are not locked, so in practice this is the bastion's lifetime.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          PluginMap,
		Cmd:              cmd,
		SecureConfig:     &plugin.SecureConfig{Checksum: m.checksum, Hash: sha256.New()},
		AutoMTLS:         true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		// The bastion's environment holds credential variables; the plugin gets only what
		// go-plugin itself sets.
		SkipHostEnv:  true,
		StartTimeout: m.opts.StartTimeout,
		Logger:       newHCLogAdapter(m.opts.Logger.With("component", "plugin"), "plugin"),
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return nil, nil, fmt.Errorf("%w: %s changed while starting: %w", ErrChecksumMismatch, m.opts.Path, err)
		}
		return nil, nil, fmt.Errorf("plugins: start %s: %w", m.opts.Path, err)
	}
	raw, err := rpc.Dispense(ChannelHTTP)
	if err != nil {
		client.Kill()
		return nil, nil, fmt.Errorf("plugins: dispense %q from %s: %w", ChannelHTTP, m.opts.Path, err)
	}
	channel, ok := raw.(Channel)
	if !ok {
		client.Kill()
		return nil, nil, fmt.Errorf("plugins: %s dispensed %T, not a Channel", m.opts.Path, raw)
	}
	m.logger.Info("plugin started", "pid", client.ReattachConfig().Pid)
	return client, channel, nil
}

// discard kills client if it is still the current plugin (a concurrent call may already have
// replaced it).
func (m *Manager) discard(client *plugin.Client) {
	m.mu.Lock()
	var channel Channel
	if m.client == client {
		channel = m.channel
		m.client, m.channel = nil, nil
	}
	m.mu.Unlock()
	kill(client, channel)
}

// kill stops a plugin process and the journal server its calls reported to.
func kill(client *plugin.Client, channel Channel) {
	client.Kill()
	if cc, ok := channel.(*channelClient); ok {
		cc.close()
	}
}

// PID returns the running plugin's process id, 0 if none.
func (m *Manager) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client == nil || m.client.Exited() {
		return 0
	}
	if rc := m.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// Close kills the plugin and refuses further Performs.
func (m *Manager) Close() error {
	m.mu.Lock()
	client, channel := m.client, m.channel
	m.client, m.channel, m.closed = nil, nil, true
	m.mu.Unlock()
	if client != nil {
		kill(client, channel)
	}
	return nil
}

// hclogAdapter routes go-plugin's hclog output (including the plugin's stderr lines, which
// go-plugin parses and re-logs) into slog.
type hclogAdapter struct {
	hclog.Logger // a null logger supplies the methods go-plugin does not use for output
	logger       *slog.Logger
	name         string
	args         []any
}

func newHCLogAdapter(logger *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{Logger: hclog.NewNullLogger(), logger: logger, name: name}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	var l slog.Level
	switch level {
	case hclog.Trace, hclog.Debug, hclog.NoLevel:
		l = slog.LevelDebug
	case hclog.Info:
		l = slog.LevelInfo
	case hclog.Warn:
		l = slog.LevelWarn
	case hclog.Off:
		return
	default:
		l = slog.LevelError
	}
	a.logger.Log(context.Background(), l, msg, append(append([]any{"logger", a.name}, a.args...), args...)...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l slog.Level) bool {
	return a.logger.Enabled(context.Background(), l)
}
func (a *hclogAdapter) IsTrace() bool { return a.enabled(slog.LevelDebug) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(slog.LevelDebug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(slog.LevelInfo) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(slog.LevelWarn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(slog.LevelError) }

func (a *hclogAdapter) GetLevel() hclog.Level {
	if a.enabled(slog.LevelDebug) {
		return hclog.Trace
	}
	return hclog.Info
}

func (a *hclogAdapter) ImpliedArgs() []any { return a.args }
func (a *hclogAdapter) Name() string       { return a.name }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	c := *a
	c.args = append(append([]any{}, a.args...), args...)
	return &c
}

func (a *hclogAdapter) Named(name string) hclog.Logger {
	c := *a
	c.name = a.name + "." + name
	return &c
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	return &c
}
