package hostagent

// Changing the config without a restart, and revoking keys on open connections.
//
// A reload (SIGHUP, or `postern-hostagent reload` over the local control socket) re-reads
// the config file and validates all of it before anything changes: a file with a problem, or
// one that changes a setting only a start can apply (liveKeys says which can change), is
// refused whole, with the reason, and the agent runs on as it was. A change is written to the
// reload log (<data_dir>/reloads.jsonl, synced) before it takes effect. What a reload
// applies, the server and the executor read when a connection, a session or a command begins
// (Server.live, Executor.settings): an execution already running keeps the account,
// environment and limits it started with.
//
// The key files are re-read at every login. Every key_check_interval, and at once after a
// reload, the server also checks the key of every open connection against them
// (Server.checkKeys): a connection whose key was removed (or whose certificate authority is
// no longer trusted) gets no new channel and is closed. Closing it is a disconnect like any
// other: the commands it started go on under the supervisor, their markers record how they
// end, and the bastion learns their outcome from the markers when it connects again.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/durable"
)

// liveKeys are the config keys (TOML names) a reload applies. Every other key is read once,
// at start (the listen address, the data dir and what lives in it, the host key, the control
// socket and its limits, idle_timeout, shell, spool_cap, marker_retention); a reload that
// changes one is refused. A key added to Config is restart-only until it is listed here and
// read from Server.live or Executor.settings.
var liveKeys = map[string]bool{
	"authorized_keys_file":      true,
	"authorized_keys_dir":       true,
	"trusted_user_ca_keys_file": true,
	"key_check_interval":        true,
	"allowed_accounts":          true,
	"accept_env":                true,
	"missing_execution_id":      true,
	"handshake_timeout":         true,
	"max_sessions":              true,
	"max_command_bytes":         true,
	"max_env_vars":              true,
	"max_env_value_bytes":       true,
	// The executor's, taken by each command when it starts (Executor.settings).
	"retry_failed_operations": true,
	"kill_grace":              true,
	"output_cap":              true,
}

// configChanges compares the config in force with the one read: the keys whose value
// differs, and those of them a reload cannot apply, each sorted by name.
func configChanges(running, next Config) (changed, needRestart []string) {
	rv, nv := reflect.ValueOf(running), reflect.ValueOf(next)
	for i := range rv.NumField() {
		key := configKey(rv.Type().Field(i))
		if reflect.DeepEqual(rv.Field(i).Interface(), nv.Field(i).Interface()) {
			continue
		}
		changed = append(changed, key)
		if !liveKeys[key] {
			needRestart = append(needRestart, key)
		}
	}
	slices.Sort(changed)
	slices.Sort(needRestart)
	return changed, needRestart
}

// configKey is a Config field's TOML key.
func configKey(f reflect.StructField) string {
	key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return key
}

// configValue is the value of key in cfg, for the log of a reload.
func configValue(cfg Config, key string) any {
	v := reflect.ValueOf(cfg)
	for i := range v.NumField() {
		if configKey(v.Type().Field(i)) == key {
			return v.Field(i).Interface()
		}
	}
	return nil
}

// liveSettings are the parts of the server a reload replaces, made from one validated config.
type liveSettings struct {
	cfg      Config
	auth     *authenticator
	accounts *accountResolver
	env      envFilter
}

func newLiveSettings(cfg Config, logger *slog.Logger) (*liveSettings, error) {
	accounts, err := newAccountResolver(cfg)
	if err != nil {
		return nil, err
	}
	return &liveSettings{cfg: cfg, auth: newAuthenticator(cfg, logger), accounts: accounts, env: newEnvFilter(cfg)}, nil
}

// connLogin is who logged in on a connection, with which key.
type connLogin struct {
	user string
	key  gossh.PublicKey
}

// errKeyRevoked refuses a channel on a connection whose key was revoked.
var errKeyRevoked = errors.New("the key of this connection is no longer authorized on this host")

// checkKeys closes every connection whose login the key files no longer admit: it gets no
// new channel from now on and is closed; the commands it started go on (Handler.Exec's
// contexts end, not the commands).
func (srv *Server) checkKeys() {
	keys := srv.live.Load().auth.current()
	srv.mu.Lock()
	conns := make([]*serverConn, 0, len(srv.conns))
	for sc := range srv.conns {
		conns = append(conns, sc)
	}
	srv.mu.Unlock()
	for _, sc := range conns {
		login := sc.login.Load()
		if login == nil || sc.revoked.Load() {
			continue
		}
		if err := keys.admits(login.user, login.key); err != nil {
			sc.revoked.Store(true)
			srv.logger.Warn("closing connection: its key is no longer authorized; the commands it started go on",
				"remote", sc.RemoteAddr(), "user", boundForLog(login.user), "key", gossh.FingerprintSHA256(signingKey(login.key)),
				"running_sessions", sc.sessions.Load(), "err", err)
			sc.Close()
		}
	}
}

// startKeyChecks starts the loop of checkKeys once, for the first Serve.
func (srv *Server) startKeyChecks() {
	srv.keyChecks.Do(func() {
		if !srv.startGoroutine(false) {
			return
		}
		go func() {
			defer srv.wg.Done()
			for {
				timer := time.NewTimer(srv.live.Load().cfg.KeyCheckInterval)
				select {
				case <-srv.ctx.Done():
					timer.Stop()
					return
				case <-timer.C:
				}
				srv.checkKeys()
			}
		}()
	})
}

// ConfigDigest is the hex SHA-256 of a config file's content, as a reload records it.
func ConfigDigest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// ReloadLogName, in the data dir, is the log of the reloads that changed something: one JSON
// line each (reloadRecord), appended and synced before the change takes effect.
const ReloadLogName = "reloads.jsonl"

// reloadRecord is one line of the reload log.
type reloadRecord struct {
	At time.Time `json:"at"`
	// By is who asked: "signal:SIGHUP", or "control socket: uid U, pid P".
	By     string `json:"by"`
	Config string `json:"config"`
	// Digest is ConfigDigest of the file now in force, Previous of the one before.
	Digest   string      `json:"digest"`
	Previous string      `json:"previous"`
	Changes  []keyChange `json:"changes"`
}

type keyChange struct {
	Key  string `json:"key"`
	From any    `json:"from"`
	To   any    `json:"to"`
}

// maxConfigBytes bounds the config file a reload reads (ParseConfig reads no more).
const maxConfigBytes = 1 << 20

// Reload re-reads the agent's config file (AgentOptions.Load) and applies it: all of it
// checked first, then the change written to the reload log (synced), then what may change
// live (liveKeys) applied, and logged key by key. A file with problems, one that changes a
// setting only a restart applies, or a reload log that cannot be written, changes nothing
// and is hostproto.ErrReloadRefused saying why (also logged). by says who asked: SIGHUP and
// the local control socket's reload call it.
func (a *Agent) Reload(ctx context.Context, by string) (hostproto.ReloadResult, error) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	res := hostproto.ReloadResult{Config: a.configFile, Changed: []string{}}
	refuse := func(err error) (hostproto.ReloadResult, error) {
		err = fmt.Errorf("%w: nothing changed: %w", hostproto.ErrReloadRefused, err)
		a.log.Error("config reload refused; the agent runs on as it was", "by", by, "config", a.configFile, "err", err)
		return res, err
	}
	if a.load == nil {
		return refuse(errors.New("this agent was not started from a config file (postern up runs its own hostagent and writes its config): restart what runs it"))
	}
	data, err := readBounded(a.configFile, maxConfigBytes)
	if err != nil {
		return refuse(fmt.Errorf("config: %w", err))
	}
	res.Digest = ConfigDigest(data)
	next, err := a.load(data)
	if err != nil {
		return refuse(err)
	}
	changed, needRestart := configChanges(a.running, next)
	if len(needRestart) > 0 {
		return refuse(fmt.Errorf("%s cannot change while the agent runs: restart it to apply (systemctl restart postern-hostagent), or put back the value it runs with",
			strings.Join(needRestart, ", ")))
	}
	if err := ctx.Err(); err != nil {
		return refuse(err)
	}
	if len(changed) > 0 {
		live, err := newLiveSettings(next, a.server.logger)
		if err != nil {
			return refuse(err)
		}
		rec := reloadRecord{At: time.Now().UTC(), By: by, Config: a.configFile, Digest: res.Digest, Previous: a.digest}
		for _, key := range changed {
			rec.Changes = append(rec.Changes, keyChange{Key: key, From: configValue(a.running, key), To: configValue(next, key)})
		}
		line, err := json.Marshal(rec)
		if err == nil {
			err = durable.AppendFile(filepath.Join(a.cfg.DataDir, ReloadLogName), append(line, '\n'))
		}
		if err != nil {
			return refuse(fmt.Errorf("the reload log could not be written: %w", err))
		}
		// Nothing can fail from here: the executor and the server take the config, and the
		// open connections' keys are checked against it at once.
		a.executor.settings.Store(&next)
		a.server.live.Store(live)
		a.server.checkKeys()
		for _, c := range rec.Changes {
			a.log.Info("config changed", "key", c.Key, "from", c.From, "to", c.To)
		}
	}
	a.running, a.digest = next, res.Digest
	res.Changed = append(res.Changed, changed...)
	a.log.Info("config reloaded", "by", by, "config", a.configFile, "digest", res.Digest, "changed", res.Changed)
	if len(changed) > 0 && AuthorizedKeyCount(next) == 0 {
		a.log.Warn("no authorized keys: nobody can log in any more, not even the bastion, until a key is added",
			"authorized_keys_file", next.AuthorizedKeysFile, "authorized_keys_dir", next.AuthorizedKeysDir,
			"trusted_user_ca_keys_file", next.TrustedUserCAKeysFile)
	}
	return res, nil
}

// reloadingBackend is the local control socket's backend: the executor, and the agent's
// Reload (which the SSH subsystem's backend does not have).
type reloadingBackend struct {
	*Executor
	agent *Agent
}

func (b reloadingBackend) Reload(ctx context.Context, by string) (hostproto.ReloadResult, error) {
	return b.agent.Reload(ctx, by)
}
