package bastion

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/bastion/transport"
)

// Options configure Open.
type Options struct {
	Config config.Config
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Hold serves with nothing sent (engine.Options.Hold: serve --hold).
	Hold bool
	// Load reads the config again, as the start read it (the same file, the same flags over
	// it), with the file's digest (config.Digest): what a reload applies (Reload). Without
	// it, a reload is refused.
	Load func() (config.Config, string, error)
	// ConfigDigest is the digest of the config file the start read ("" for none).
	ConfigDigest string
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
	load   func() (config.Config, string, error)

	// surfaces guards remoteActors and mcpSocket, set by Serve and replaced in place by a
	// reload (nil before Serve or without HTTP).
	surfaces     sync.Mutex
	remoteActors *transport.ActorSet
	mcpSocket    *transport.UnixListener
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
	e, err := engine.Open(engine.Options{Config: opts.Config, Logger: opts.Logger, Now: opts.Now, Hold: opts.Hold, ConfigDigest: opts.ConfigDigest})
	if err != nil {
		return nil, err
	}
	return &Bastion{engine: e, cfg: e.Config(), log: opts.Logger, now: opts.Now, httpLn: opts.HTTPListener, load: opts.Load}, nil
}

// Reload reads the config again (Options.Load) and applies what a reload may change
// (engine.PrepareReload): the engine's settings, the HTTP actors, the uids the MCP socket
// admits. The whole config is checked first, by all of them; a config any refuses changes
// nothing, and the error says why. by names who asked (the reload log's "by").
func (b *Bastion) Reload(by string) (*api.ConfigChange, error) {
	if b.load == nil {
		return nil, api.Invalid("this bastion was started without a config file to read again; restart it to change its config")
	}
	next, digest, err := b.load()
	if err != nil {
		return nil, api.Invalid("the config does not load, and the running bastion keeps its own: %v", err)
	}
	prepared, err := b.engine.PrepareReload(next, digest)
	if err != nil {
		return nil, reloadRefused(err)
	}
	b.surfaces.Lock()
	defer b.surfaces.Unlock()
	remote := remoteActors(next)
	if err := transport.CheckActors(remote); err != nil {
		return nil, reloadRefused(err)
	}
	if b.mcpSocket != nil {
		if err := b.mcpSocket.CheckUIDs(next.LocalUIDs()); err != nil {
			return nil, reloadRefused(err)
		}
	}
	change, err := prepared.Apply(by)
	if err != nil {
		return nil, err
	}
	if b.remoteActors != nil {
		if err := b.remoteActors.Replace(remote); err != nil { // checked above
			b.log.Error("reload: the HTTP actors stay as they were", "err", err)
		}
	}
	if b.mcpSocket != nil {
		if err := b.mcpSocket.AllowUIDs(next.LocalUIDs()); err != nil { // checked above
			b.log.Error("reload: the MCP socket admits the uids it did", "err", err)
		}
	}
	return change, nil
}

// reloadRefused is a reload's refusal as the operator reads it.
func reloadRefused(err error) error {
	var te *api.ToolError
	if errors.As(err, &te) {
		return err
	}
	return api.Invalid("reload refused, nothing changed: %v", err)
}

// remoteActors are cfg's token actors, as the HTTP endpoint authenticates them.
func remoteActors(cfg config.Config) []transport.Actor {
	actors := make([]transport.Actor, 0, len(cfg.Actors))
	for _, a := range cfg.Actors {
		if !a.Local() {
			actors = append(actors, transport.Actor{Name: a.Name, TokenSHA256: a.TokenSHA256})
		}
	}
	return actors
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
