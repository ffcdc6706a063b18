package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/durable"
)

// A reload (postern reload, SIGHUP) replaces the settings below while the bastion serves.
// It is all or nothing: the whole config is validated and everything built from it before
// anything changes, and a config that would change a setting only a restart applies is
// refused with those settings named. The change is written to the reload log, synced,
// before it takes effect — so no call is ever decided under settings the log does not show.
// Calls read the settings once per decision (current), so each sees one config; an execution
// already accepted keeps the decision journaled with it.

// settings are the reloadable part of the config and what is built from it.
type settings struct {
	cfg     config.Config
	policy  *policy.Policy
	classes *config.Classes
	// change is how this config came into force (the start, or a reload).
	change api.ConfigChange
}

func newSettings(cfg config.Config) (*settings, error) {
	pol, err := cfg.Policy()
	if err != nil {
		return nil, err
	}
	return &settings{cfg: cfg, policy: pol, classes: cfg.ResolveClasses()}, nil
}

// current is the settings in force.
func (co *core) current() *settings { return co.live.Load() }

// ErrRestartOnly is a reload refused because the new config changes what only a restart
// applies.
var ErrRestartOnly = errors.New("these settings change only with a restart")

// A Reload is a validated config, ready to apply.
type Reload struct {
	e    *Engine
	next *settings
}

// PrepareReload validates next against the config in force and builds what the engine needs
// from it. Nothing changes yet.
func (e *Engine) PrepareReload(next config.Config, digest string) (*Reload, error) {
	if e.readOnly {
		return nil, errReadOnly
	}
	if err := next.Validate(); err != nil {
		return nil, err
	}
	if keys := e.cfg.RestartOnly(next); len(keys) > 0 {
		return nil, fmt.Errorf("%w: %s; the running bastion keeps its config (restart it to apply them, or put them back and reload)", ErrRestartOnly, strings.Join(keys, ", "))
	}
	s, err := newSettings(next)
	if err != nil {
		return nil, err
	}
	cur := e.current()
	s.change = api.ConfigChange{Digest: digest, Previous: cur.change.Digest, Changes: cur.cfg.Changes(next), Replica: e.records.replica}
	if s.change.Changes == nil {
		s.change.Changes = []string{}
	}
	return &Reload{e: e, next: s}, nil
}

// Changes say what the reload changes (empty: nothing a reload applies).
func (r *Reload) Changes() []string { return r.next.change.Changes }

// Apply writes the change to the reload log (synced) and puts the settings in force. A
// failed write changes nothing. by names who asked.
func (r *Reload) Apply(by string) (*api.ConfigChange, error) {
	e := r.e
	e.reloads.Lock()
	defer e.reloads.Unlock()
	change := r.next.change
	change.At, change.By = e.now().UTC(), by
	change.Previous = e.current().change.Digest
	if len(change.Changes) > 0 {
		if err := appendReloadLog(e.cfg.ReloadLogPath(), change); err != nil {
			return nil, fmt.Errorf("reload: the config stays as it was: %w", err)
		}
	}
	next := *r.next
	next.change = change
	e.live.Store(&next)
	e.log.Info("config reloaded", "by", by, "digest", change.Digest, "changes", strings.Join(change.Changes, "; "))
	return &change, nil
}

// appendReloadLog appends change as one JSON line to the log at path (0600), synced.
func appendReloadLog(path string, change api.ConfigChange) error {
	line, err := json.Marshal(change)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return durable.AppendFile(path, append(line, '\n'))
}

// Reload answers postern reload when the files are read with the daemon down: there is
// nothing to reload (servingEngine answers it for a serving daemon).
func (e *Engine) Reload(api.Operator) (*api.ConfigChange, error) {
	return nil, &api.ToolError{Code: api.CodeBastionDown, Message: "the bastion is not running: a reload applies to a running daemon, and its next start reads the config anyway"}
}
