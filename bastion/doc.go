// Package bastion is the daemon agents and operators talk to: it opens the engine
// (bastion/engine) and serves its surfaces — the MCP tools (bastion/mcpserver) and the
// operator API (bastion/operatorapi) — on their endpoints: Streamable HTTP, the local unix
// socket the stdio bridge reaches, and the operator socket. The engine turns every tool call
// into an execution with an identity and carries it across the SSH boundary; the surfaces
// only translate, through the interfaces they declare. docs/architecture.md maps every
// package.
//
// Invariant: nothing is served before the engine reconciled the executions the journal shows
// in flight (Recover, then Serve).
package bastion
