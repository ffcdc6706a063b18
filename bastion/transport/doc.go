// Package transport owns how agents reach the bastion and who they are: the Streamable HTTP
// front end (bearer tokens), the local unix-socket front end (kernel credentials), and the
// stdio bridge (`postern mcp`) that carries a stdio MCP client onto the unix socket. Each
// front end wraps the bastion's MCP http.Handler and attaches a [Caller] to every request,
// which go-sdk tool handlers read with [CallerFromTokenInfo](req.Extra.TokenInfo).
//
// # Invariants
//
//   - The actor and the local intent scope come from a bearer-token hash match (HTTP), an
//     OAuth access token the bastion/oauth verifier validated and mapped (HTTP, oauth.go), or
//     from the kernel (SO_PEERCRED and /proc, unix socket), never from the request body or
//     headers. A client's Authorization header on the unix socket is discarded, and the
//     Authorization header is removed before the MCP handler sees any request.
//   - A stdio bridge names its parent (the agent) in the Postern-Bridge-Parent header, as
//     pid and start time; it counts only if it equals the connecting process's real parent
//     read from /proc, so any `postern mcp` binary or version of one agent process gets that
//     process's scope, and a claim that does not match is refused. A peer that names no
//     parent is the agent itself.
//   - The only caller-supplied value in a Caller is RunID (the Postern-Run header of remote
//     callers), bounded and validated; it narrows a remote caller's scope, it names no actor.
//   - Every request body is bounded (default 1 MiB) before the MCP handler reads it; a larger
//     body is answered 413 and never reaches it. The bridge bounds every line and response.
//   - On HTTP, the Host and Origin headers are decided (guard.decide, origin.go) before
//     authentication and before the MCP handler: on a loopback listen only loopback Hosts,
//     and no Origin, a loopback Origin or a listed one; elsewhere listed Hosts and Origins.
//     CORS headers go only to admitted Origins; "null" is never admitted.
//   - Nothing logs a token: Postern's tokens are hashed on arrival and only hashes are
//     compared, in constant time against every configured hash; an OAuth token's subject
//     and client are logged, never the token.
//   - An OAuth caller whose scopes narrow its tools cannot reach the MCP handler with a
//     tools/call of another tool (403 insufficient_scope), nor with a body the gate cannot
//     read exactly as go-sdk does (400).
//   - A local socket admits a peer by its kernel uid at accept, before reading a byte: root,
//     the daemon's own uid and the uids it was given (UnixAccess); every other connection is
//     closed and logged. Each uid's open connections are bounded, and the last slots of each
//     socket are kept for root and the daemon's uid.
package transport
