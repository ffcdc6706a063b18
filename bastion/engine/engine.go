package engine

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/journal"
	"github.com/postern-dev/postern/bastion/notify"
	"github.com/postern-dev/postern/bastion/sshca"
	"github.com/postern-dev/postern/internal/privdir"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/plugins"
)

// Options configure Open.
type Options struct {
	Config config.Config
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// ReadOnly opens the engine to read while the daemon is down: the journal read-only,
	// nothing in the state dir created or changed, no driver ever started (nothing is
	// reconciled or dispatched), decisions refused. Hosts are still asked, with the
	// bastion's key when it can be read.
	ReadOnly bool
	// ConfigDigest names the config file the engine starts with (config.Digest; "" for none),
	// in postern status and the first reload's log line.
	ConfigDigest string
	// Hold starts the engine with nothing sent (serve --hold): Recover reconciles nothing,
	// no driver starts, new calls and approvals are refused with CodeHeld; reads, denials,
	// reviews and cancels of what never left the bastion work. An operator looks with the
	// daemon up, then restarts it without Hold.
	Hold bool
}

// Engine turns tool calls into executions: it owns the journal's writes (through records),
// the SSH pool, and the drivers that carry each execution across the dispatch boundary. Its
// methods are what the surfaces call; the work is done by its parts — intake (matching and
// acceptance), drivers (one per execution in flight), records (every journal write of an
// execution), views and hosts — which share core.
//
// Invariants: a lifecycle step is journaled (synced) before the next boundary is crossed; a
// failed journal write stops the execution where it is (nothing is dispatched); at most one
// driver acts on an execution at a time; nothing is dispatched twice except an execution
// whose host marker is absent, under the same execution id (the host refuses duplicates).
type Engine struct {
	*core

	intake *intake
	// taskWaits counts each actor's tasks/result requests waiting for an execution to end
	// (taskstate.go).
	taskWaits waitSlots

	drivers *drivers
	views   *views
	// retention runs the journal's retention passes (retention.go).
	retention retention
	// backups lets one backup run at a time (backup.go).
	backups sync.Mutex
	// reloads lets one reload apply at a time (reload.go).
	reloads sync.Mutex
}

// core is what every part of the engine shares. Its fields are set by Open and never
// change; what they point to guards itself.
type core struct {
	// cfg is the config the engine started with: read it for what a reload cannot change
	// (paths, the journal, the sockets). What a reload changes — actors, rules, classes,
	// approvals, the bounds of a call — is read through current().
	cfg config.Config
	// live holds the reloadable settings (reload.go); never nil after Open.
	live atomic.Pointer[settings]
	log  *slog.Logger
	now  func() time.Time
	// journal is read here; an execution's writes go through records.
	journal markers.JournalStore
	records *records
	fp      *intent.Fingerprinter
	inv     *fleet.Inventory
	pool    *fleet.Pool
	hosts   *hosts
	metrics *metrics
	clientK gossh.Signer
	plugin  *plugins.Manager // nil when no HTTP plugin is configured
	// announcer tells operators of new approval requests; nil without [approvals] webhook.
	announcer *notify.Notifier
	// judging are the results whose delivery is being judged now (delivered.go); it guards
	// itself.
	judging judgments

	// readOnly: opened to read while the daemon is down (Options.ReadOnly).
	readOnly bool
	// held: started with nothing sent (Options.Hold).
	held bool
	// recovered: the journal holds executions rebuilt from host markers that await review
	// (seen by Recover): a call whose own lookup finds nothing is looked up by its
	// fingerprint alone as well (recover.go).
	recovered atomic.Bool

	ctx    context.Context // ended by Close: drivers stop waiting, the hosts go on
	cancel context.CancelFunc
	wg     sync.WaitGroup // drivers and the reconcile loop
}

// Open opens the state dir (journal, keys, inventory), made private first (see privdir), and
// returns a bastion that does not serve yet: call Recover, then hand it to the transports.
func Open(opts Options) (*Engine, error) {
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ReadOnly {
		return openReadOnly(cfg, opts)
	}
	if err := privdir.Ensure(cfg.StateDir, "state dir", opts.Logger); err != nil {
		return nil, fmt.Errorf("bastion: %w", err)
	}
	fp, err := intent.LoadOrCreateFingerprintKey(cfg.FingerprintKeyPath())
	if err != nil {
		return nil, err
	}
	clientKey, err := fleet.LoadOrCreateClientKey(cfg.ClientKeyPath())
	if err != nil {
		return nil, err
	}
	inv, err := fleet.OpenInventory(cfg.InventoryPath())
	if err != nil {
		return nil, err
	}
	signer, verifier, err := markers.LoadOrCreateAuditKey(cfg.AuditKeyPath(), "postern-bastion")
	if err != nil {
		return nil, err
	}
	live, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	// The retention pass reads the classes in force: a reload that changes a class's windows
	// or retention applies to what the pass removes as it does to matching (b is set before
	// the first pass runs).
	var b *Engine
	classes := func() *config.Classes {
		if b == nil {
			return live.classes
		}
		return b.current().classes
	}
	jl, err := journal.Open(cfg, signer, classes, opts.Logger, opts.Now)
	if err != nil {
		return nil, fmt.Errorf("bastion: open journal: %w", err)
	}
	if err := agreeKeys(jl, fp, verifier); err != nil {
		jl.Close()
		return nil, err
	}
	cas, revoked, err := hostTrust(cfg)
	if err != nil {
		jl.Close()
		return nil, err
	}
	var replica string
	if r, ok := jl.(markers.Replicated); ok {
		replica = r.Name()
	}
	certs, err := openSSHCA(cfg, inv, func() config.Config { return b.current().cfg }, replica, false, opts.Logger, opts.Now)
	if err != nil {
		jl.Close()
		return nil, err
	}
	pool, err := fleet.NewPool(poolOptions(clientKey, certs, opts.Logger, cas, revoked))
	if err != nil {
		jl.Close()
		return nil, err
	}
	var plugin *plugins.Manager
	if cfg.HTTPPlugin.Path != "" {
		plugin, err = plugins.NewManager(plugins.ManagerOptions{Path: cfg.HTTPPlugin.Path, SHA256: cfg.HTTPPlugin.SHA256, Logger: opts.Logger.With("component", "http-plugin")})
		if err != nil {
			pool.Close()
			jl.Close()
			return nil, fmt.Errorf("bastion: http plugin: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b = &Engine{
		core: &core{
			cfg: cfg, log: opts.Logger, now: opts.Now, journal: jl, fp: fp, inv: inv, pool: pool,
			metrics: newMetrics(), clientK: clientKey, plugin: plugin,
			held: opts.Hold, ctx: ctx, cancel: cancel,
			hosts: &hosts{pool: pool, inv: inv, ctx: ctx, sshCA: certs != nil},
		},
	}
	if cfg.Approvals.Webhook != "" {
		b.announcer = notify.New(notify.Options{
			URL: cfg.Approvals.Webhook, SecretFile: cfg.Approvals.WebhookSecretFile,
			Logger: opts.Logger.With("component", "approval-webhook"),
			Result: func(r string) { b.metrics.announced.WithLabelValues(r).Inc() },
		})
	}
	b.records = &records{journal: jl, now: opts.Now, metrics: b.metrics}
	if r := b.replicas(); r != nil {
		b.records.replica = r.Name()
	}
	live.change = api.ConfigChange{At: opts.Now().UTC(), By: "start", Digest: opts.ConfigDigest, Replica: b.records.replica}
	b.live.Store(live)
	b.drivers = newDrivers(b.core)
	if opts.Hold {
		b.drivers.close() // nothing is reconciled or dispatched
	}
	b.views = &views{core: b.core, drivers: b.drivers}
	b.intake = &intake{core: b.core, drivers: b.drivers, views: b.views}
	b.metrics.registry.MustRegister(inFlight{b}, journalBackend{b})
	if certs != nil {
		// Renewed in the background until Close (b.wg), so a dial rarely waits for a signing.
		b.wg.Go(func() { certs.Run(ctx) })
	}
	return b, nil
}

// poolOptions: the pool logs in with the CA's certificates when [ssh_ca] is enabled, and
// then with nothing else; with the static key otherwise.
func poolOptions(key gossh.Signer, certs *sshca.Issuer, log *slog.Logger, cas []fleet.HostCA, revoked *fleet.Revocations) fleet.PoolOptions {
	o := fleet.PoolOptions{Signer: key, Logger: log, HostCAs: cas, Revoked: revoked}
	if certs != nil {
		o.Signer, o.Certs = nil, certs.Signer
	}
	return o
}

// openReadOnly is Open for Options.ReadOnly.
func openReadOnly(cfg config.Config, opts Options) (*Engine, error) {
	if _, err := os.Stat(cfg.JournalDir()); !cfg.Journal.Etcd() && err != nil {
		return nil, fmt.Errorf("%s holds no journal (has a bastion run with this state dir? --state-dir or --config names the one it uses)", cfg.StateDir)
	}
	inv, err := fleet.OpenInventory(cfg.InventoryPath())
	if err != nil {
		return nil, err
	}
	live, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	jl, err := journal.OpenReadOnly(cfg, opts.Logger.With("component", "journal"))
	if err != nil {
		return nil, fmt.Errorf("bastion: open the journal read-only: %w", err)
	}
	// Without the bastion's key the hosts cannot be asked; everything else still reads.
	signer, keyErr := fleet.ReadClientKey(cfg.ClientKeyPath())
	if keyErr != nil {
		opts.Logger.Info("the hosts cannot be asked", "why", keyErr)
		if signer, err = newUnreadableKey(keyErr); err != nil {
			jl.Close()
			return nil, err
		}
	}
	cas, revoked, err := hostTrust(cfg)
	if err != nil {
		// Read-only: the list refuses every host until it can be read; the rest still reads.
		opts.Logger.Info("hosts trusted through a CA cannot be asked", "why", err)
	}
	// Read-only the certificate is signed when a host is asked, not renewed ahead.
	certs, err := openSSHCA(cfg, inv, func() config.Config { return live.cfg }, "", true, opts.Logger, opts.Now)
	if err != nil {
		jl.Close()
		return nil, err
	}
	pool, err := fleet.NewPool(poolOptions(signer, certs, opts.Logger, cas, revoked))
	if err != nil {
		jl.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	// The fingerprint key finds a fleet run's executions; without it the rest still reads.
	fp, err := intent.ReadFingerprintKey(cfg.FingerprintKeyPath())
	if err != nil {
		opts.Logger.Info("a fleet run's hosts cannot be read", "why", err)
	}
	b := &Engine{core: &core{
		cfg: cfg, log: opts.Logger, now: opts.Now, journal: jl, fp: fp, inv: inv, pool: pool,
		metrics: newMetrics(), readOnly: true,
		ctx: ctx, cancel: cancel, hosts: &hosts{pool: pool, inv: inv, ctx: ctx, sshCA: certs != nil},
	}}
	b.live.Store(live)
	b.records = &records{journal: jl, now: opts.Now, metrics: b.metrics}
	b.drivers = newDrivers(b.core)
	b.drivers.close() // nothing is reconciled or dispatched
	b.views = &views{core: b.core, drivers: b.drivers}
	b.intake = &intake{core: b.core, drivers: b.drivers, views: b.views}
	return b, nil
}

// errReadOnly is the answer to a decision asked of an engine opened read-only.
var errReadOnly = &api.ToolError{Code: api.CodeBastionDown, Message: "the bastion is not running, and decisions (approve, deny, review) are journaled by it: start it (postern serve; with --hold it reconciles and sends nothing), then decide"}

// errHeld is the answer to a call that would send something, asked of a held engine.
func errHeld(what string) error {
	return &api.ToolError{Code: api.CodeHeld, Message: what + ", and this bastion was started with --hold: it sends nothing to hosts or endpoints until an operator restarts it without --hold; nothing was journaled"}
}

// unreadableKey is the signer of a read-only engine that could not read the bastion's key:
// it offers a throwaway public key (kept in memory, written nowhere) and fails to sign with
// why, so every host it would ask answers with that reason.
type unreadableKey struct {
	pub gossh.PublicKey
	err error
}

func newUnreadableKey(why error) (unreadableKey, error) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return unreadableKey{}, err
	}
	sshPub, err := gossh.NewPublicKey(pub)
	return unreadableKey{pub: sshPub, err: why}, err
}

func (k unreadableKey) PublicKey() gossh.PublicKey { return k.pub }

func (k unreadableKey) Sign(io.Reader, []byte) (*gossh.Signature, error) { return nil, k.err }

// Replicas is the journal's coordination of bastion replicas, nil on a single node.
func (b *Engine) Replicas() markers.Replicated { return b.replicas() }

// Config is the configuration in force: the one the engine was opened with, with what a
// reload changed since (reload.go).
func (b *Engine) Config() config.Config { return b.current().cfg }

// ClientPublicKey is the key hostagents must authorize (authorized_keys line).
func (b *Engine) ClientPublicKey() gossh.PublicKey { return b.clientK.PublicKey() }

// Journal exposes the journal to the operator API (reads, export).
func (b *Engine) Journal() markers.JournalStore { return b.journal }

// Close stops the drivers (commands go on on their hosts; the next start reconciles them),
// closes the SSH connections and the journal.
func (b *Engine) Close() error {
	b.drivers.close()
	b.cancel()
	b.wg.Wait()
	if b.announcer != nil {
		b.announcer.Close()
	}
	b.pool.Close()
	if b.plugin != nil {
		b.plugin.Close()
	}
	return b.journal.Close()
}

// Recover reconciles every execution the journal shows in flight (dispatched, running,
// unknown — and accepted or authorized ones a crash stopped before dispatch) with its host,
// before the bastion serves. It waits until each has been asked about once (or ctx ends);
// commands still running stay attached in the background. It never re-dispatches except an
// execution whose host has no marker for it and that is younger than the host's marker
// retention (verdict.ReconcileOn).
func (b *Engine) Recover(ctx context.Context) error {
	if b.held {
		o, err := b.Overview()
		if err != nil {
			return err
		}
		b.log.Warn("held: nothing is reconciled or sent until the bastion is restarted without --hold (postern status shows what a start will do)",
			"in_flight", len(o.InFlight), "awaiting_review", len(o.AwaitingReview), "awaiting_approval", len(o.AwaitingApproval))
		return nil
	}
	var pending []*driver
	// The executions on their hosts first: their drivers hold their actors' concurrency
	// slots, which an accepted or authorized one about to be dispatched must count
	// (awaitSlot), or it would be dispatched past its actor's max_concurrent.
	for _, st := range []markers.State{markers.Dispatched, markers.Running, markers.Unknown, markers.Accepted, markers.Authorized} {
		cursor := ""
		for {
			recs, next, err := b.journal.List(markers.Query{State: st, Limit: 500, Cursor: cursor})
			if err != nil {
				return fmt.Errorf("bastion: list %s executions: %w", st, err)
			}
			for _, r := range recs {
				if r.RecoveredFrom != "" {
					b.recovered.Store(true) // never driven: it waits for review
					continue
				}
				if d := b.drivers.start(r); d != nil {
					pending = append(pending, d)
				}
			}
			if next == "" {
				break
			}
			cursor = next
		}
	}
	if len(pending) > 0 {
		b.log.Info("reconciling executions in flight", "count", len(pending))
	}
	for _, d := range pending {
		select {
		case <-d.asked:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.wg.Go(b.drivers.reconcileLoop)
	b.wg.Go(b.retentionLoop)
	if r := b.replicas(); r != nil {
		b.wg.Go(func() { b.drivers.watchHandovers(r) })
	}
	return nil
}

// hostTrust is what the pool trusts besides pinned keys: the configured host CAs and the
// revocation list (docs/inventory.md, "Host certificates"). A revocation list that cannot be
// read is an error, returned with the list (which refuses every host until it can be read).
func hostTrust(cfg config.Config) ([]fleet.HostCA, *fleet.Revocations, error) {
	var cas []fleet.HostCA
	for i, c := range cfg.HostCAs {
		key, err := c.Key()
		if err != nil {
			return nil, nil, fmt.Errorf("bastion: host_cas[%d]: %w", i, err)
		}
		cas = append(cas, fleet.HostCA{Name: c.DisplayName(), Key: key, Hosts: c.Hosts})
	}
	revoked, err := fleet.OpenRevocations(cfg.RevokedHostKeysFile)
	return cas, revoked, err
}
