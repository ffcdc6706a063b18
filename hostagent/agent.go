package hostagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	gliderssh "github.com/gliderlabs/ssh"

	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/internal/privdir"
	"github.com/postern-dev/postern/markers"
)

// gcInterval is how often retention runs.
const gcInterval = time.Hour

// Agent is a whole hostagent: the marker store, the executor, the SSH server and the local
// control socket, with the data dir laid out under Config.DataDir.
type Agent struct {
	cfg      Config // as it started; what a reload changes is in running
	log      *slog.Logger
	store    *markers.Store
	executor *Executor
	server   *Server

	configFile string                       // AgentOptions.ConfigFile
	load       func([]byte) (Config, error) // AgentOptions.Load

	reloadMu sync.Mutex // serializes reloads; guards running and digest
	running  Config     // the config in force: cfg and the reloads since
	digest   string     // ConfigDigest of the file running was read from
}

// AgentOptions tune OpenAgent.
type AgentOptions struct {
	// SupervisorExe is the binary started as the per-host supervisor; see
	// ExecutorOptions.SupervisorExe.
	SupervisorExe string
	Logger        *slog.Logger
	// ConfigFile is the file the config was read from, ConfigDigest the ConfigDigest of
	// what was read, and Load makes the config of the file's content again, validated, with
	// the same overrides as at start (flags); Reload uses them. Without Load, a reload is
	// refused.
	ConfigFile   string
	ConfigDigest string
	Load         func(data []byte) (Config, error)
}

// OpenAgent opens the marker store (creating the data dir and audit key on first start),
// after making the data dir private (see privdir) and every descriptor this process
// inherited close-on-exec; it re-adopts or resolves the executions a previous process left,
// and prepares the server.
func OpenAgent(ctx context.Context, cfg Config, opts AgentOptions) (*Agent, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	// Commands inherit only stdin, stdout and stderr: nothing this process was handed.
	if err := supervisor.CloseInheritedOnExec(); err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	if err := privdir.Ensure(cfg.DataDir, "data dir", logger); err != nil {
		return nil, fmt.Errorf("hostagent: %w", err)
	}
	host, _ := os.Hostname()
	signer, _, err := markers.LoadOrCreateAuditKey(cfg.AuditKeyPath(), "postern-hostagent-"+validKeyName(host))
	if err != nil {
		return nil, err
	}
	store, err := markers.Open(cfg.MarkersDir(), markers.Options{
		Graph: markers.HostGraph, Signer: signer, Origin: "postern hostagent " + host,
		DefaultRetention: cfg.MarkerRetention, Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: logger, store: store, configFile: opts.ConfigFile, load: opts.Load, running: cfg, digest: opts.ConfigDigest}
	a.executor, err = NewExecutor(ExecutorOptions{
		Config: cfg, Store: store, SupervisorExe: opts.SupervisorExe, Logger: logger,
		SocketPath: cfg.ControlSocketPath(),
	})
	if err == nil {
		// The spool root's entry in the data dir, made on first start, must outlast a power
		// loss like every spool dir in it.
		err = durable.SyncDir(cfg.DataDir)
	}
	if err == nil {
		err = a.executor.Recover(ctx)
	}
	if err == nil {
		err = a.executor.logSpoolUsage()
	}
	if err == nil {
		a.server, err = NewServer(cfg, a.executor, logger)
	}
	if err != nil {
		if a.executor != nil {
			a.executor.Close()
		}
		store.Close()
		return nil, err
	}
	return a, nil
}

// validKeyName keeps the characters a note key name allows.
func validKeyName(s string) string {
	out := []rune{}
	for _, r := range s {
		if r > ' ' && r < 0x7f && r != '+' {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return "host"
	}
	return string(out)
}

// HostKeyFingerprint is the SSH host key's SHA256 fingerprint, to enroll with the bastion.
func (a *Agent) HostKeyFingerprint() string { return a.server.HostKeyFingerprint() }

// Server is the agent's SSH server.
func (a *Agent) Server() *Server { return a.server }

// Serve runs the SSH server on ln, the local control socket and retention until ctx ends,
// then lets sessions finish for up to grace and closes everything. Commands keep running.
func (a *Agent) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	local, err := ListenLocal(a.cfg.ControlSocketPath())
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := ServeLocal(runCtx, local, reloadingBackend{Executor: a.executor, agent: a}, a.cfg.LocalLimits(), a.log); err != nil && runCtx.Err() == nil {
			a.log.Error("local control socket stopped", "err", err)
		}
	})
	wg.Go(func() { a.collectGarbage(runCtx) })
	served := make(chan error, 1)
	go func() { served <- a.server.Serve(runCtx, ln) }()

	select {
	case err = <-served:
	case <-ctx.Done():
		shutCtx, cancel := context.WithTimeout(context.Background(), grace)
		a.server.Shutdown(shutCtx)
		cancel()
		stop()
		err = <-served
	}
	stop()
	wg.Wait()
	return err
}

// Close stops watching commands and closes the store. Running commands keep running.
func (a *Agent) Close() error {
	a.server.Close()
	a.executor.Close()
	return a.store.Close()
}

// collectGarbage applies retention every gcInterval: terminal markers older than
// MarkerRetention go, then spool dirs without a marker. Running executions are never touched.
func (a *Agent) collectGarbage(ctx context.Context) {
	ticker := time.NewTicker(gcInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		res, err := a.store.GC(ctx, markers.GCOptions{})
		if err != nil {
			a.log.Error("marker retention failed", "err", err)
			continue
		}
		removed, err := a.executor.removeOrphanSpools(time.Now().Add(-a.cfg.MarkerRetention))
		if err != nil {
			a.log.Error("spool retention failed", "err", err)
		}
		a.log.Info("retention", "markers_removed", res.Records, "events_pruned", res.Events, "spools_removed", removed)
	}
}

// logSpoolUsage measures the spool once at start (so the first command does not pay for it)
// and says how full it is.
func (e *Executor) logSpoolUsage() error {
	used, err := e.quota.Measure()
	if err != nil {
		return fmt.Errorf("hostagent: %w", err)
	}
	if used >= e.cfg.SpoolCap {
		e.log.Warn("the spool is full: new commands are refused until stored output expires or spool_cap is raised",
			"spool_bytes", used, "spool_cap", e.cfg.SpoolCap)
		return nil
	}
	e.log.Info("spool", "spool_bytes", used, "spool_cap", e.cfg.SpoolCap)
	return nil
}

// removeOrphanSpools deletes spool dirs that have no marker and were last touched before
// cutoff.
func (e *Executor) removeOrphanSpools(cutoff time.Time) (int, error) {
	entries, err := os.ReadDir(e.spool)
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, ent := range entries {
		if supervisor.IsSpare(ent.Name()) {
			continue // the executor's own
		}
		// A restarted execution's spool dir is named <id>.<attempt>.
		id, _, _ := strings.Cut(ent.Name(), ".")
		if _, err := e.store.Get(id); !errors.Is(err, markers.ErrNotFound) {
			continue
		}
		info, err := ent.Info()
		if err != nil || info.ModTime().After(cutoff) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(e.spool, ent.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		e.quota.Forget(ent.Name())
		removed++
	}
	return removed, errors.Join(errs...)
}

// Control serves the postern-control subsystem.
func (e *Executor) Control(ctx context.Context, s gliderssh.Session, caller Identity) {
	ServeControlSession(ctx, s, caller, e, e.log)
}
