package config

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/oauth"
)

// OAuth makes the HTTP endpoint an OAuth 2.1 protected resource ([oauth], docs/oauth.md):
// besides the actors' own tokens, it accepts the JWT access tokens the authorization server
// issues for it, and maps each to a remote actor by its subject, client, groups or scopes.
// A reload changes the mapping (actors, scope_tools); the rest needs a restart.
type OAuth struct {
	// Issuer is the authorization server's issuer identifier (its discovery document is read
	// from it). https, or http on a loopback address.
	Issuer string `toml:"issuer"`
	// Resource is the MCP endpoint's URL as clients reach it ("https://postern.example.com/mcp"):
	// the resource identifier of the metadata, and the aud tokens must carry.
	Resource string `toml:"resource"`
	// Audiences, when set, are the aud values accepted instead of Resource.
	Audiences []string `toml:"audiences"`
	// JWKSURL overrides the key set URL of the issuer's discovery document.
	JWKSURL string `toml:"jwks_url"`
	// Algorithms narrow the signature algorithms accepted (asymmetric ones only). Default
	// RS*, PS*, ES* and EdDSA.
	Algorithms []string `toml:"algorithms"`
	// Leeway is the clock skew tolerated on exp, nbf and iat. Default 60s, at most 5m.
	Leeway time.Duration `toml:"leeway"`
	// GroupsClaim names the claim groups or roles are read from ("realm_access.roles" reads
	// a nested one). Default "groups".
	GroupsClaim string `toml:"groups_claim"`
	// IntrospectionURL, when set, checks opaque access tokens (not JWTs) at the authorization
	// server's RFC 7662 endpoint, as the client IntrospectionClientID whose secret is in
	// IntrospectionSecretFile (a reference; read at start). Default: opaque tokens refused.
	IntrospectionURL        string `toml:"introspection_url"`
	IntrospectionClientID   string `toml:"introspection_client_id"`
	IntrospectionSecretFile string `toml:"introspection_secret_file"`
	// Actors map tokens to remote actors, first match wins ([[oauth.actors]]); a token no
	// rule maps is refused (403).
	Actors []oauth.Rule `toml:"actors"`
	// ScopeTools, when set, narrows each token to the tools its scopes list (the union),
	// within what its actor may do ([oauth.scope_tools], scope = [tools]).
	ScopeTools map[string][]string `toml:"scope_tools"`
}

// maxLeeway bounds oauth.leeway: a longer one would accept tokens long expired.
const maxLeeway = 5 * time.Minute

// Options are the verifier options of o (oauth.New), with the introspection secret, if
// any, read from its file.
func (o *OAuth) Options() (oauth.Options, error) {
	opts := o.options()
	if opts.Introspection != nil {
		secret, err := readSecret(o.IntrospectionSecretFile)
		if err != nil {
			return oauth.Options{}, fmt.Errorf("oauth: introspection_secret_file: %w", err)
		}
		opts.Introspection.ClientSecret = secret
	}
	return opts, nil
}

// options are the verifier options without reading the secret (its field is a placeholder).
func (o *OAuth) options() oauth.Options {
	opts := oauth.Options{
		Issuer: o.Issuer, Resource: o.Resource, Audiences: slices.Clone(o.Audiences), JWKSURL: o.JWKSURL,
		Algorithms: slices.Clone(o.Algorithms), Leeway: o.Leeway, GroupsClaim: o.GroupsClaim,
		Rules: oauth.Rules{Actors: slices.Clone(o.Actors), ScopeTools: maps.Clone(o.ScopeTools)},
	}
	if o.IntrospectionURL != "" {
		opts.Introspection = &oauth.Introspection{URL: o.IntrospectionURL, ClientID: o.IntrospectionClientID, ClientSecret: "(read at start)"}
	}
	return opts
}

// Rules are the mapping of o, what a reload applies.
func (o *OAuth) Rules() oauth.Rules { return o.options().Rules }

// maxSecretBytes bounds the introspection secret file.
const maxSecretBytes = 4 << 10

// readSecret reads a secret file: at most maxSecretBytes, surrounding space trimmed.
func readSecret(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return "", err
	}
	if len(data) > maxSecretBytes {
		return "", fmt.Errorf("%s exceeds %d bytes", path, maxSecretBytes)
	}
	secret := strings.TrimSpace(string(data))
	if secret == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return secret, nil
}

func (c Config) validateOAuth() []error {
	o := c.OAuth
	if o == nil {
		return nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("config: oauth: "+format, args...)) }
	if c.Listen == "" {
		bad("the bastion serves no HTTP endpoint (listen is empty): OAuth is for HTTP clients")
	}
	if o.Issuer == "" || o.Resource == "" {
		bad("issuer and resource are required (the authorization server's issuer, and the MCP endpoint's URL as clients reach it)")
	} else if err := oauth.CheckURL(o.Resource); err != nil {
		bad("resource: %v", err)
	} else if _, err := oauth.New(o.options()); err != nil {
		errs = append(errs, fmt.Errorf("config: %w", err))
	}
	if (o.IntrospectionURL == "") != (o.IntrospectionClientID == "") || (o.IntrospectionURL == "") != (o.IntrospectionSecretFile == "") {
		bad("introspection_url, introspection_client_id and introspection_secret_file go together")
	} else if o.IntrospectionSecretFile != "" && !filepath.IsAbs(o.IntrospectionSecretFile) {
		bad("introspection_secret_file must be an absolute path, got %q", o.IntrospectionSecretFile)
	}
	if o.Leeway < 0 || o.Leeway > maxLeeway {
		bad("leeway must be in 0s..%v, got %v", maxLeeway, o.Leeway)
	}
	if len(o.Actors) == 0 {
		bad("no [[oauth.actors]]: every token would be refused; map subjects, clients, groups or scopes to remote actors")
	}
	remote := map[string]bool{}
	for _, a := range c.Actors {
		if !a.Local() {
			remote[a.Name] = true
		}
	}
	for i, r := range o.Actors {
		if r.Actor != "" && !remote[r.Actor] {
			bad("actors[%d]: %q is not a remote actor of the config: add [[actors]] name = %q, remote = true (with what it may do)", i, r.Actor, r.Actor)
		}
	}
	for scope, tools := range o.ScopeTools {
		for _, t := range tools {
			if !actorName.MatchString(t) {
				bad("scope_tools.%s: %q is not a tool name", scope, t)
			}
		}
	}
	return errs
}

// restartOnly names what differs between o and next that a reload cannot apply: adding or
// removing [oauth], or any key but the mapping (actors, scope_tools), which the verifier
// takes while serving.
func (o *OAuth) restartOnly(next *OAuth) []string {
	if (o == nil) != (next == nil) {
		return []string{"oauth"}
	}
	if o == nil {
		return nil
	}
	a, b := *o, *next
	a.Actors, b.Actors, a.ScopeTools, b.ScopeTools = nil, nil, nil, nil
	return changedKeys("oauth.", reflect.ValueOf(a), reflect.ValueOf(b))
}

// changes says what a reload changes in the mapping.
func (o *OAuth) changes(next *OAuth) []string {
	if o == nil || next == nil {
		return nil
	}
	var out []string
	if !reflect.DeepEqual(o.Actors, next.Actors) {
		out = append(out, fmt.Sprintf("oauth.actors: %d rules before, %d now", len(o.Actors), len(next.Actors)))
	}
	if !reflect.DeepEqual(o.ScopeTools, next.ScopeTools) {
		out = append(out, fmt.Sprintf("oauth.scope_tools: %d scopes before, %d now", len(o.ScopeTools), len(next.ScopeTools)))
	}
	return out
}
