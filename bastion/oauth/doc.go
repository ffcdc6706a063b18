// Package oauth makes the bastion's HTTP MCP endpoint an OAuth 2.1 protected resource, as
// the MCP authorization specification asks: it validates the JWT access tokens an
// authorization server (the operator's identity provider) issued for this resource, and maps
// each token's subject, groups and scopes to a configured actor.
//
// # Invariants
//
//   - A token is validated locally, with keys from the issuer's JWKS, found through its
//     discovery document (OpenID Connect or RFC 8414) unless configured. Only asymmetric
//     signature algorithms are accepted: "none" and the HMAC ones (whose key would be a
//     secret shared with every resource) never verify anything.
//   - Every check of [Verifier.Verify] must pass: size, algorithm, key, signature, issuer,
//     audience (the configured resource), exp (required), nbf and iat (with a small leeway),
//     a subject. The list is written down in docs/oauth.md; keep both in step.
//   - Keys are cached. An unknown key id refetches the JWKS, at most once per
//     minRefetchInterval whatever the tokens presented, so a flood of made-up key ids costs
//     the identity provider one request per interval; every fetch is bounded in time and
//     size, and the issuer, discovery and JWKS URLs must be HTTPS unless on loopback.
//   - A token that passed every check is remembered by its SHA-256 (cache.go); on every later
//     request its expiry and its key still being published are checked again, and the rules
//     map it again.
//   - An opaque token is checked only by introspection at the configured endpoint (RFC 7662,
//     introspect.go), whose answer passes the same claim checks; answers are remembered 30 s
//     and at most 8 introspections are in flight.
//   - Deny by default: a valid token that no [Rule] maps to an actor authenticates nobody
//     ([ErrNoActor]). Rules are a pure function of the token's claims ([Rules.Map]).
package oauth
