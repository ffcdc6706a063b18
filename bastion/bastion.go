package bastion

import (
	"context"
	"log/slog"
	"net"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
)

// Options configure Open.
type Options struct {
	Config config.Config
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Hold serves with nothing sent (engine.Options.Hold: serve --hold).
	Hold bool
	// HTTPListener, when set, is what the Streamable HTTP endpoint serves on, already bound
	// to Config.Listen: `postern up` binds its port before it writes anything, so a port in
	// use fails first. Serve closes it.
	HTTPListener net.Listener
}

// Bastion is the daemon: the engine, and its surfaces on their endpoints once it serves.
type Bastion struct {
	engine *engine.Engine
	cfg    config.Config
	log    *slog.Logger
	now    func() time.Time
	httpLn net.Listener
}

// Open opens the engine on the config's state dir; it does not serve yet: call Recover,
// then Serve.
func Open(opts Options) (*Bastion, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	e, err := engine.Open(engine.Options{Config: opts.Config, Logger: opts.Logger, Now: opts.Now, Hold: opts.Hold})
	if err != nil {
		return nil, err
	}
	return &Bastion{engine: e, cfg: e.Config(), log: opts.Logger, now: opts.Now, httpLn: opts.HTTPListener}, nil
}

// Recover reconciles the executions the journal shows in flight before the bastion serves
// (engine.Engine.Recover).
func (b *Bastion) Recover(ctx context.Context) error { return b.engine.Recover(ctx) }

// Close stops the engine; commands go on on their hosts and the next start reconciles them.
func (b *Bastion) Close() error { return b.engine.Close() }

// ClientPublicKey is the key hostagents must authorize (an authorized_keys line).
func (b *Bastion) ClientPublicKey() gossh.PublicKey { return b.engine.ClientPublicKey() }

// Engine is the engine the surfaces call, for in-process use (tests, benchmarks).
func (b *Bastion) Engine() *engine.Engine { return b.engine }
