package transport

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// Caller is who is calling, as proven by the transport.
type Caller struct {
	// Actor is "token:<actor name>" for HTTP bearer tokens and "local:<user name or uid>" for
	// the unix socket.
	Actor string
	// Scope is the default intent scope. Local callers: "run:<pid>-<start time ticks>" of the
	// agent process. Remote callers: "" (the bastion derives it from RunID or actor+window).
	Scope string
	// RunID is the Postern-Run header of a remote caller, if present (validated by
	// ValidRunID); "" otherwise and always for local callers.
	RunID string
	// Subject is the sub claim of an OAuth access token (the person or service behind the
	// actor it maps to); "" for Postern's own tokens and local callers.
	Subject string
	// Local is true for callers on the unix socket (directly or through the stdio bridge).
	Local bool
	// PID is the agent process (the bridge's parent when the peer is our stdio bridge) and
	// UID the peer's uid; local callers only.
	PID, UID int
	// Exe is the /proc/<pid>/exe target of the agent process, Cmdline its command line
	// (NUL-separated arguments, as /proc has it) and StartTicks its start time after boot in
	// clock ticks; local callers only.
	Exe        string
	Cmdline    string
	StartTicks uint64
	// Bridged: the call came through the stdio bridge (`postern mcp`), which named the agent.
	// The kernel confirms the parent, whatever program the peer is.
	Bridged bool
	// BridgeBinary: the bridge runs the daemon's own executable file. Only such a bridge is
	// offered approvals to ask its client's user: any program the agent starts can name the
	// agent as its parent.
	BridgeBinary bool
}

// callerKey is the auth.TokenInfo.Extra key under which the transport stores the Caller.
const callerKey = "postern.caller"

// TokenInfoFor wraps c in the TokenInfo that go-sdk hands to tool handlers as
// req.Extra.TokenInfo: what HTTPHandler and UnixServer attach to every request, and what
// CallerFromTokenInfo reads back. No expiration: the transport proves identity per request.
// Outside this package it is for tests of MCP handlers, which attach a caller to requests
// over go-sdk's in-memory transports as the front ends do over HTTP.
func TokenInfoFor(c Caller) *auth.TokenInfo {
	return &auth.TokenInfo{
		UserID: c.Actor,
		Extra:  map[string]any{callerKey: c},
	}
}

// CallerFromTokenInfo extracts the Caller the transport attached. In a go-sdk tool handler:
//
//	caller, ok := transport.CallerFromTokenInfo(req.Extra.TokenInfo)
//
// ok is false when the request did not come through HTTPHandler or UnixServer.
func CallerFromTokenInfo(ti *auth.TokenInfo) (Caller, bool) {
	if ti == nil {
		return Caller{}, false
	}
	c, ok := ti.Extra[callerKey].(Caller)
	if !ok || c.Actor == "" || c.Actor != ti.UserID {
		return Caller{}, false
	}
	return c, true
}

// CallerFromContext extracts the Caller from an HTTP request context that passed through
// HTTPHandler or UnixServer (for handlers other than go-sdk tools, e.g. /metrics or health).
func CallerFromContext(ctx context.Context) (Caller, bool) {
	return CallerFromTokenInfo(auth.TokenInfoFromContext(ctx))
}
