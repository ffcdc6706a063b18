package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/postern-dev/postern/bastion/oauth"
	"github.com/postern-dev/postern/internal/ratelog"
)

// OAuth access tokens on the HTTP endpoint (docs/oauth.md): besides its static and issued
// bearer tokens, the endpoint is an OAuth 2.1 protected resource as the MCP authorization
// specification describes. A bearer token shaped as a JWT (three dot-separated parts, not
// the pst_ prefix of Postern's own) — or, with introspection configured, any token without
// that prefix — is checked by the oauth.Verifier and mapped to a configured actor; a 401 names the protected resource metadata (RFC 9728) clients discover
// the authorization server from; a tools/call of a tool the token's scopes do not allow is
// answered 403 insufficient_scope before the MCP handler sees it.

// Why an OAuth request was refused: the "reason" label (refusals.go), where WhereHTTP.
const (
	ReasonOAuthInvalid      = "oauth_invalid"      // 401: a JWT that fails a check
	ReasonOAuthNoActor      = "oauth_no_actor"     // 403: a valid JWT no rule maps to an actor
	ReasonOAuthUnavailable  = "oauth_unavailable"  // 503: the issuer's keys could not be fetched
	ReasonInsufficientScope = "insufficient_scope" // 403: a tool the token's scopes do not allow
	ReasonBadJSONRPC        = "bad_jsonrpc"        // 400: a body the tool gate cannot read unambiguously
)

// oauthFront is the OAuth side of HTTPHandler. A nil *oauthFront handles nothing.
type oauthFront struct {
	verifier *oauth.Verifier
	refusals *ratelog.Logger
}

// oauthMappingKey is the auth.TokenInfo.Extra key of an OAuth caller's oauth.Mapping.
const oauthMappingKey = "postern.oauth.mapping"

// isJWT reports whether a bearer token is to be read as a JWT: compact serialization has
// three parts; Postern's own tokens have no dot.
func isJWT(token string) bool {
	return !strings.HasPrefix(token, tokenPrefix) && strings.Count(token, ".") == 2
}

// challenge is the WWW-Authenticate value of a 401 before any token was checked: the scheme,
// and with OAuth the metadata URL (RFC 9728 section 5.1) an MCP client starts from.
func (o *oauthFront) challenge() string {
	if o == nil {
		return `Bearer realm="postern"`
	}
	return fmt.Sprintf(`Bearer realm="postern", resource_metadata=%q`, o.verifier.MetadataURL())
}

// bearer is the request's bearer token, as go-sdk's RequireBearerToken reads it.
func bearer(r *http.Request) (string, bool) {
	fields := strings.Fields(r.Header.Get("Authorization"))
	if len(fields) != 2 || !strings.EqualFold(fields[0], "bearer") {
		return "", false
	}
	return fields[1], true
}

// authenticate checks a JWT bearer token before go-sdk's middleware runs. It answers the
// request itself (true) when the token is refused: 401 invalid_token, 403 when it maps to no
// actor, 503 when the issuer's keys cannot be fetched. A valid token's caller is put in st
// for the verifier (withOAuth); any other request is left to the static tokens (false).
func (o *oauthFront) authenticate(w http.ResponseWriter, r *http.Request, st *authState) bool {
	if o == nil {
		return false
	}
	token, ok := bearer(r)
	if !ok || !(isJWT(token) || (o.verifier.Introspects() && !strings.HasPrefix(token, tokenPrefix))) {
		return false
	}
	id, m, err := o.verifier.Verify(r.Context(), token)
	switch {
	case errors.Is(err, oauth.ErrInvalidToken):
		st.refuse(err)
		o.refusals.Log(slog.LevelWarn, ReasonOAuthInvalid, "refused an OAuth token", "remote", r.RemoteAddr, "status", http.StatusUnauthorized, "why", err.Error())
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return true
	case errors.Is(err, oauth.ErrNoActor):
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="postern", error="insufficient_scope", error_description=%q, resource_metadata=%q`, err.Error(), o.verifier.MetadataURL()))
		o.refusals.Log(slog.LevelWarn, ReasonOAuthNoActor, "refused an OAuth token that maps to no actor", "remote", r.RemoteAddr, "status", http.StatusForbidden, "subject", id.Subject, "client", id.ClientID)
		http.Error(w, err.Error()+": ask the bastion's operator to map it to an actor ([[oauth.actors]] in the config)", http.StatusForbidden)
		return true
	case err != nil:
		w.Header().Del("WWW-Authenticate")
		w.Header().Set("Retry-After", "30")
		o.refusals.Log(slog.LevelError, ReasonOAuthUnavailable, "cannot check OAuth tokens", "remote", r.RemoteAddr, "status", http.StatusServiceUnavailable, "err", err.Error())
		http.Error(w, "the bastion cannot check OAuth tokens now (its identity provider's keys are unavailable); retry later", http.StatusServiceUnavailable)
		return true
	}
	runID, _ := runIDFromHeader(r.Header)
	ti := TokenInfoFor(Caller{Actor: "token:" + m.Actor, RunID: runID, Subject: id.Subject})
	ti.Scopes, ti.Expiration = id.Scopes, id.Expires
	ti.Extra[oauthMappingKey] = m
	st.oauth = ti
	return false
}

// withOAuth is verify, except for a request whose JWT authenticate accepted already.
func withOAuth(verify auth.TokenVerifier) auth.TokenVerifier {
	return func(ctx context.Context, token string, req *http.Request) (*auth.TokenInfo, error) {
		if st, ok := ctx.Value(authStateKey{}).(*authState); ok && st.oauth != nil {
			return st.oauth, nil
		}
		return verify(ctx, token, req)
	}
}

// gateTools wraps next, which reads a body limitBody has read whole: a tools/call of a tool
// the OAuth caller's scopes do not allow is answered 403 insufficient_scope, with the scopes
// that would allow it, and next never sees it. Other callers pass untouched.
func (o *oauthFront) gateTools(next http.Handler) http.Handler {
	if o == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m oauth.Mapping
		ok := false
		if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
			m, ok = ti.Extra[oauthMappingKey].(oauth.Mapping)
		}
		if !ok || m.Tools == nil || r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body) // in memory already (limitBody)
		if err != nil {
			http.Error(w, "reading request body failed", http.StatusBadRequest)
			return
		}
		tools, err := ToolCalls(body)
		if err != nil {
			o.refusals.Log(slog.LevelInfo, ReasonBadJSONRPC, "refused request", "remote", r.RemoteAddr, "status", http.StatusBadRequest, "detail", err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, tool := range tools {
			if m.AllowsTool(tool) {
				continue
			}
			scopes := o.verifier.ScopesFor(tool)
			desc := fmt.Sprintf("the token's scopes do not allow the tool %q", tool)
			if len(scopes) > 0 {
				desc += fmt.Sprintf("; a scope that does: %s", strings.Join(scopes, " "))
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="postern", error="insufficient_scope", scope=%q, error_description=%q, resource_metadata=%q`,
				strings.Join(scopes, " "), desc, o.verifier.MetadataURL()))
			o.refusals.Log(slog.LevelInfo, ReasonInsufficientScope, "refused a tool the token's scopes do not allow", "remote", r.RemoteAddr, "status", http.StatusForbidden, "actor", m.Actor, "tool", tool)
			http.Error(w, desc, http.StatusForbidden)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// OAuthMetadataHandler serves v's protected resource metadata (RFC 9728), to be mounted at
// v.MetadataPaths(): go-sdk's handler (GET, CORS for any origin — the document is public,
// and browser-based clients read it before they hold a token), on the metadata of the rules
// in force (its scopes follow a reload).
func OAuthMetadataHandler(v *oauth.Verifier) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.ProtectedResourceMetadataHandler(v.Metadata()).ServeHTTP(w, r)
	})
}

// errAmbiguousJSONRPC refuses a body the tool gate cannot read exactly as the MCP handler
// would: malformed, or with a member named twice (in any letter case), which JSON decoders
// resolve differently.
var errAmbiguousJSONRPC = errors.New("the request is not one unambiguous JSON-RPC message or batch: members named twice (in any letter case) are refused")

// ToolCalls returns the tool names of the tools/call requests in a JSON-RPC body (one
// message or a batch). The members it reads — method, params, name — must appear once each,
// in that letter case only: a decoder that matches case-insensitively or keeps the first of
// two would see another tool than the one checked.
func ToolCalls(body []byte) ([]string, error) {
	body = bytes.TrimSpace(body)
	var messages []json.RawMessage
	if len(body) > 0 && body[0] == '[' {
		if err := json.Unmarshal(body, &messages); err != nil {
			return nil, errAmbiguousJSONRPC
		}
	} else {
		messages = []json.RawMessage{body}
	}
	var tools []string
	for _, msg := range messages {
		obj, err := uniqueMembers(msg, "method", "params")
		if err != nil {
			return nil, err
		}
		var method string
		if raw, ok := obj["method"]; !ok || json.Unmarshal(raw, &method) != nil || method != "tools/call" {
			continue // not a tools/call: nothing the gate decides
		}
		params, err := uniqueMembers(obj["params"], "name")
		if err != nil {
			return nil, err
		}
		var name string
		if json.Unmarshal(params["name"], &name) != nil {
			return nil, errAmbiguousJSONRPC
		}
		tools = append(tools, name)
	}
	return tools, nil
}

// uniqueMembers decodes a JSON object's members, refusing one named twice and one whose name
// equals a watched name in another letter case.
func uniqueMembers(data []byte, watched ...string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errAmbiguousJSONRPC
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errAmbiguousJSONRPC
		}
		key, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, errAmbiguousJSONRPC
		}
		if _, dup := members[key]; dup {
			return nil, errAmbiguousJSONRPC
		}
		for _, w := range watched {
			if key != w && strings.EqualFold(key, w) {
				return nil, errAmbiguousJSONRPC
			}
		}
		members[key] = value
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errAmbiguousJSONRPC
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errAmbiguousJSONRPC
	}
	return members, nil
}
