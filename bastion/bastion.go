package bastion

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/bastion/oauth"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/tokens"
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

	// tokens is the store of issued tokens (bastion/tokens); it guards itself.
	tokens *tokens.Store

	// surfaces guards remoteActors, oauth and mcpSocket, set by Serve and replaced in place
	// by a reload or a token issued or revoked (nil before Serve or without HTTP; oauth also
	// without [oauth]). Lock order: surfaces before the token store's own lock.
	surfaces     sync.Mutex
	remoteActors *transport.ActorSet
	oauth        *oauth.Verifier
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
	store, err := tokens.Open(e.Config().StateDir)
	if err != nil {
		e.Close()
		return nil, err
	}
	return &Bastion{engine: e, cfg: e.Config(), log: opts.Logger, now: opts.Now, httpLn: opts.HTTPListener, load: opts.Load, tokens: store}, nil
}

// Reload reads the config again (Options.Load) and applies what a reload may change
// (engine.PrepareReload): the engine's settings, the HTTP actors, the OAuth mapping, the
// uids the MCP socket admits. The whole config is checked first, by all of them; a config any
// refuses changes nothing, and the error says why. by names who asked (the reload log's
// "by").
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
	if b.remoteActors != nil {
		if err := b.remoteActors.CheckActors(remote); err != nil {
			return nil, reloadRefused(err)
		}
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
	warn := func(what string, err error) {
		b.log.Error("reload: "+what, "err", err)
		change.Warnings = append(change.Warnings, fmt.Sprintf("%s: %v; restart the bastion to apply the config whole", what, err))
	}
	if b.remoteActors != nil {
		if err := b.remoteActors.Replace(remote); err != nil { // checked above
			warn("the HTTP actors stay as they were", err)
		}
	}
	if b.oauth != nil && next.OAuth != nil { // adding or removing [oauth] is restart-only
		if err := b.oauth.SetRules(next.OAuth.Rules()); err != nil { // validated with next
			warn("the OAuth mapping stays as it was", err)
		}
	}
	if b.mcpSocket != nil {
		if err := b.mcpSocket.AllowUIDs(next.LocalUIDs()); err != nil { // checked above
			warn("the MCP socket admits the uids it did", err)
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

// issuedTokens are the store's tokens as the HTTP endpoint checks them.
func issuedTokens(toks []tokens.Token) []transport.IssuedToken {
	out := make([]transport.IssuedToken, 0, len(toks))
	for _, t := range toks {
		out = append(out, transport.IssuedToken{ID: t.ID, Actor: t.Actor, SHA256: t.SHA256, Expires: t.Expires, Revoked: !t.Revoked.IsZero()})
	}
	return out
}

// IssueToken is postern token NAME: a new token for a remote actor of the config in force,
// with the expiry req asks for, logged and stored before it is returned (bastion/tokens) and
// accepted by the HTTP endpoint from then on. by names the operator.
func (b *Bastion) IssueToken(by string, req api.TokenRequest) (*api.IssuedToken, error) {
	if b.cfg.Listen == "" {
		return nil, api.Invalid("this bastion serves no HTTP endpoint (listen is empty): tokens are for HTTP clients; local agents are actors by uid or exe")
	}
	now := b.now()
	expires, err := tokens.ParseExpiry(req.Expires, now)
	if err != nil {
		return nil, api.Invalid("%v", err)
	}
	if !slices.ContainsFunc(b.engine.Config().Actors, func(a policy.Actor) bool { return a.Name == req.Actor && !a.Local() }) {
		return nil, api.Invalid("the config in force has no remote actor %q: add\n\n[[actors]]\nname = %q\nremote = true\n\nto the config (with what it may do), run postern reload, then issue its token", req.Actor, req.Actor)
	}
	token, err := transport.NewToken()
	if err != nil {
		return nil, err
	}
	b.surfaces.Lock()
	defer b.surfaces.Unlock()
	t, err := b.tokens.Issue(req.Actor, transport.HashToken(token), expires, by, now)
	if err != nil {
		return nil, err
	}
	b.applyTokens()
	b.log.Info("token issued", "id", t.ID, "actor", t.Actor, "expires", t.Expires, "by", by)
	return &api.IssuedToken{Token: token, View: engine.IssuedTokenView(t, now)}, nil
}

// RevokeToken is postern token revoke ID: the token is refused from the HTTP endpoint's
// next request on, on every connection and session; the revocation is logged and stored
// first. by names the operator.
func (b *Bastion) RevokeToken(by, id string) (*api.TokenRevocation, error) {
	if !tokens.ValidID(id) {
		return nil, api.Invalid("%q is not a token id (tok_ and 16 letters and digits; postern token list shows them). A config token is revoked by removing its actor's token_sha256 and running postern reload", id)
	}
	b.surfaces.Lock()
	defer b.surfaces.Unlock()
	now := b.now()
	t, changed, err := b.tokens.Revoke(id, by, now)
	if errors.Is(err, tokens.ErrNotFound) {
		return nil, &api.ToolError{Code: api.CodeNotFound, Message: fmt.Sprintf("no token %s: postern token list shows the tokens (one ended more than %v ago is no longer listed)", id, tokens.Retain)}
	}
	if err != nil {
		return nil, err
	}
	if changed {
		b.applyTokens()
		b.log.Warn("token revoked", "id", t.ID, "actor", t.Actor, "by", by)
	}
	return &api.TokenRevocation{View: engine.IssuedTokenView(t, now), Changed: changed}, nil
}

// applyTokens puts the store's tokens in force on the HTTP endpoint. Called with b.surfaces
// held, after the store changed.
func (b *Bastion) applyTokens() {
	if b.remoteActors == nil {
		return // not serving HTTP yet: Serve reads the store
	}
	if err := b.remoteActors.SetIssued(issuedTokens(b.tokens.Tokens())); err != nil {
		// The store's tokens are fresh random hashes: a collision with another token is
		// not a thing to expect. The set in force stays; a revocation must not.
		b.log.Error("tokens: the HTTP endpoint's tokens stay as they were", "err", err)
	}
}

// Tokens is postern token list: the issued tokens and the config's, with their last use.
func (b *Bastion) Tokens() *api.TokenList {
	b.surfaces.Lock()
	set := b.remoteActors
	b.surfaces.Unlock()
	var lastUsed func(string) time.Time
	if set != nil {
		lastUsed = set.LastUsed
	}
	return engine.TokenViews(b.engine.Config(), b.tokens.Tokens(), b.now(), lastUsed)
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
