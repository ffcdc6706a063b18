package bastion

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/bastion/mcpserver"
	"github.com/postern-dev/postern/bastion/oauth"
	"github.com/postern-dev/postern/bastion/operatorapi"
	"github.com/postern-dev/postern/bastion/tasks"
	"github.com/postern-dev/postern/bastion/transport"
)

// Endpoints are where a serving bastion listens.
type Endpoints struct {
	// HTTP is the address the Streamable HTTP listener is bound to ("" if HTTP is disabled);
	// URL its MCP endpoint.
	HTTP string
	URL  string
	// Socket is the local MCP endpoint (unix socket; `postern mcp` bridges stdio to it).
	Socket string
	// OperatorSocket serves the operator CLI.
	OperatorSocket string
	// Metrics is the Prometheus endpoint ("" if HTTP is disabled).
	Metrics string
}

// MCPPath is the URL path of the MCP endpoint on every transport.
const MCPPath = "/mcp"

// sessionIdleTimeout closes a stateful Streamable HTTP session (http_sessions) nobody used
// for this long; the client then initializes a new one.
const sessionIdleTimeout = 30 * time.Minute

// bySession serves a request of protocol 2026-07-28 or later (stateless by definition) with
// stateless, anything else — initialize, the session's requests, its GET stream and DELETE —
// with sessions.
func bySession(stateless, sessions http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= "2026-07-28" {
			stateless.ServeHTTP(w, r)
			return
		}
		sessions.ServeHTTP(w, r)
	})
}

// shutdownGrace bounds how long in-flight requests may finish when the bastion stops.
const shutdownGrace = 5 * time.Second

// fdReserve is how many descriptors the HTTP endpoint's connections leave, besides the unix
// sockets' (max_local_conns each), for the journal, the SSH pool, the plugin and the rest.
const fdReserve = 1024

// Serve serves the MCP endpoints and the operator API until ctx ends; ready is called once
// every listener is open. Call Recover first: nothing is served before the journal's
// executions in flight were reconciled.
func (b *Bastion) Serve(ctx context.Context, ready func(Endpoints)) error {
	var replicas delivery.Replicas
	if r := b.engine.Replicas(); r != nil {
		replicas = r
	}
	tracker := delivery.NewTracker(b.engine.DeliveryJournal(), replicas, b.cfg.DeliveryRevokeGrace, b.now, b.log)
	srv, err := mcpserver.New(b.engine, mcpserver.Options{Tracker: tracker, Logger: b.log.With("component", "mcp"), Now: b.now})
	if err != nil {
		return err
	}
	var streamable http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless: true,
		Logger:    b.log.With("component", "mcp"),
	})
	tracked := tracker.Handler(tasks.HTTPHandler(streamable))
	remote := tracked
	if b.cfg.HTTPSessions {
		sessions := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
			SessionTimeout: sessionIdleTimeout,
			Logger:         b.log.With("component", "mcp-sessions"),
		})
		remote = tracker.Handler(tasks.HTTPHandler(bySession(streamable, sessions)))
	}

	var servers []*http.Server
	var listeners []net.Listener
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	var ep Endpoints
	if b.cfg.Listen != "" {
		b.surfaces.Lock()
		actors, err := transport.NewActorSet(remoteActors(b.engine.Config()), issuedTokens(b.tokens.Tokens()), b.now)
		if err == nil {
			b.remoteActors = actors
		}
		b.surfaces.Unlock()
		if err != nil {
			return err
		}
		var verifier *oauth.Verifier
		if b.cfg.OAuth != nil {
			opts, err := b.cfg.OAuth.Options()
			if err != nil {
				return err
			}
			opts.Now = b.now
			if verifier, err = oauth.New(opts); err != nil {
				return err
			}
			b.surfaces.Lock()
			b.oauth = verifier
			b.surfaces.Unlock()
		}
		mcpHTTP, err := transport.HTTPHandler(remote, transport.HTTPOptions{
			ActorSet: actors, OAuth: verifier, MaxBodyBytes: b.cfg.MaxBodyBytes,
			AllowedHosts: b.cfg.AllowedHosts, AllowedOrigins: b.cfg.AllowedOrigins,
			Logger: b.log.With("component", "http"), CountRefusal: b.engine.CountRefusal,
		})
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle(MCPPath, mcpHTTP)
		if verifier != nil {
			for _, p := range verifier.MetadataPaths() {
				mux.Handle(p, transport.OAuthMetadataHandler(verifier))
			}
		}
		mux.Handle("/metrics", b.engine.MetricsHandler())
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		l := b.httpLn
		if l == nil {
			if l, err = net.Listen("tcp", b.cfg.Listen); err != nil {
				return fmt.Errorf("bastion: listen %s: %w", b.cfg.Listen, err)
			}
		}
		scheme := "http"
		if b.cfg.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(b.cfg.TLSCertFile, b.cfg.TLSKeyFile)
			if err != nil {
				l.Close()
				return fmt.Errorf("bastion: tls: %w", err)
			}
			l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
			scheme = "https"
		}
		// The descriptors the HTTP connections may not take: the unix sockets' connections
		// and the rest (journal, SSH pool, plugin).
		maxLocal := b.cfg.MaxLocalConns
		if maxLocal <= 0 {
			maxLocal = transport.DefaultMaxLocalConns
		}
		maxConns, nofile := transport.FitHTTPConns(0, 2*maxLocal+fdReserve)
		if maxConns < transport.DefaultMaxHTTPConns {
			b.log.Warn("the descriptor limit leaves the HTTP endpoint fewer connections; raise LimitNOFILE",
				"max_http_conns", maxConns, "nofile", nofile)
		}
		srv, hl := transport.NewHTTPServer(l, mux, transport.HTTPServerOptions{
			Limits:      transport.HTTPLimits{MaxConns: maxConns},
			ConnContext: delivery.RememberConn(nil),
			Logger:      b.log.With("component", "http"), CountRefusal: b.engine.CountRefusal,
		})
		listeners = append(listeners, hl)
		servers = append(servers, srv)
		ep.HTTP = hl.Addr().String()
		ep.URL = scheme + "://" + l.Addr().String() + MCPPath
		ep.Metrics = scheme + "://" + l.Addr().String() + "/metrics"
	}

	localAccess := b.cfg.SocketAccess(b.engine.Config().LocalUIDs(), b.log.With("component", "unix"))
	localAccess.Where, localAccess.CountRefusal = transport.WhereMCPSocket, b.engine.CountRefusal
	local, err := transport.ListenUnix(b.cfg.SocketPath(), localAccess)
	if err != nil {
		closeAll()
		return err
	}
	listeners = append(listeners, local)
	b.surfaces.Lock()
	b.mcpSocket = local
	b.surfaces.Unlock()
	localMux := http.NewServeMux()
	localMux.Handle(MCPPath, tracked)
	unixServer := transport.UnixServer(localMux, transport.UnixOptions{
		MaxBodyBytes: b.cfg.MaxBodyBytes, Logger: b.log.With("component", "unix"), CountRefusal: b.engine.CountRefusal,
	})
	unixServer.ConnContext = delivery.RememberConn(unixServer.ConnContext)
	servers = append(servers, unixServer)
	ep.Socket = b.cfg.SocketPath()

	opAccess := b.cfg.SocketAccess(nil, b.log.With("component", "operator"))
	opAccess.Where, opAccess.CountRefusal = transport.WhereOperatorSocket, b.engine.CountRefusal
	op, err := transport.ListenUnix(b.cfg.OperatorSocketPath(), opAccess)
	if err != nil {
		closeAll()
		return err
	}
	listeners = append(listeners, op)
	ep.OperatorSocket = b.cfg.OperatorSocketPath()
	operator := servingEngine{b, b.engine, api.Serving{HTTP: ep.HTTP, URL: ep.URL, MCPSocket: ep.Socket, OperatorSocket: ep.OperatorSocket}}
	servers = append(servers, &http.Server{
		Handler: operatorapi.Handler(operator, b.log.With("component", "operator")), ReadHeaderTimeout: 10 * time.Second,
		ConnContext: operatorapi.ConnContext,
		ErrorLog:    transport.ServerErrorLog(b.log.With("component", "operator"), transport.WhereOperatorSocket, b.engine.CountRefusal),
	})

	errs := make(chan error, len(servers))
	var wg sync.WaitGroup
	watchCtx, stopWatch := context.WithCancel(ctx)
	wg.Go(func() { tracker.WatchCancels(watchCtx) })
	b.surfaces.Lock()
	verifier := b.oauth
	b.surfaces.Unlock()
	if verifier != nil {
		wg.Go(func() { b.prefetchOAuthKeys(watchCtx, verifier) })
	}
	for i, s := range servers {
		wg.Go(func() {
			if err := s.Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		})
	}
	b.log.Info("serving", "mcp_http", ep.URL, "mcp_socket", ep.Socket, "operator_socket", ep.OperatorSocket)
	if ready != nil {
		ready(ep)
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(shutdownCtx)
	}
	stopWatch()
	wg.Wait()
	return serveErr
}

// prefetchOAuthKeys fetches the OAuth issuer's keys as the bastion starts serving, and says
// in the log whether it could: a provider that cannot be reached is an operator's problem to
// see at start, not at the first token (which is answered 503 until the keys come).
func (b *Bastion) prefetchOAuthKeys(ctx context.Context, v *oauth.Verifier) {
	n, err := v.Prefetch(ctx)
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("oauth: the issuer's keys could not be fetched; OAuth tokens are refused (503) until they can, Postern's own tokens work",
				"issuer", b.cfg.OAuth.Issuer, "err", err)
		}
		return
	}
	b.log.Info("oauth: the issuer's keys fetched", "issuer", b.cfg.OAuth.Issuer, "keys", n, "metadata", v.MetadataURL())
}

// servingEngine is the engine as the operator API of a serving daemon sees it: its doctor
// report says where the daemon listens, as bound (operatorapi.Handler serves the engine alone
// when the CLI reads the files with the daemon down).
type servingEngine struct {
	bastion *Bastion
	*engine.Engine
	serving api.Serving
}

// Reload is postern reload: the daemon reads its config again (Bastion.Reload).
func (s servingEngine) Reload(op api.Operator) (*api.ConfigChange, error) {
	return s.bastion.Reload(op.Name)
}

// Tokens, IssueToken and RevokeToken are postern token: the daemon's store and its HTTP
// endpoint's tokens (Bastion.IssueToken).
func (s servingEngine) Tokens() (*api.TokenList, error) { return s.bastion.Tokens(), nil }

func (s servingEngine) IssueToken(op api.Operator, req api.TokenRequest) (*api.IssuedToken, error) {
	return s.bastion.IssueToken(op.Name, req)
}

func (s servingEngine) RevokeToken(op api.Operator, id string) (*api.TokenRevocation, error) {
	return s.bastion.RevokeToken(op.Name, id)
}

func (s servingEngine) Doctor(ctx context.Context) (*api.DoctorReport, error) {
	rep, err := s.Engine.Doctor(ctx)
	if rep != nil {
		serving := s.serving
		rep.Serving = &serving
	}
	return rep, err
}
