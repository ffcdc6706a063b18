package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/oauth"
)

func TestOAuthConfig(t *testing.T) {
	const base = `state_dir = "/x"
[[actors]]
name = "ops"
remote = true
[[actors]]
name = "ci"
uid = 0
`
	const good = `[oauth]
issuer = "https://idp.example.com/realms/ops"
resource = "https://postern.example.com/mcp"
groups_claim = "realm_access.roles"
[[oauth.actors]]
actor = "ops"
groups = ["sre"]
[oauth.scope_tools]
"postern:read" = ["hosts_list", "execution_status"]
"postern:exec" = ["ssh_exec"]
`
	for _, tt := range []struct {
		name, toml, wantErr string
	}{
		{name: "good", toml: base + good},
		{name: "http issuer off loopback", toml: base + strings.Replace(good, "https://idp", "http://idp", 1), wantErr: "must use https"},
		{name: "loopback http issuer", toml: base + strings.Replace(strings.Replace(good, "https://idp.example.com", "http://127.0.0.1:8080", 1), "https://postern.example.com", "http://127.0.0.1:7410", 1)},
		{name: "http resource off loopback", toml: base + strings.Replace(good, "https://postern", "http://postern", 1), wantErr: "resource"},
		{name: "no issuer", toml: base + "[oauth]\nresource = \"https://p.example/mcp\"\n[[oauth.actors]]\nactor = \"ops\"\nsubjects = [\"a\"]\n", wantErr: "issuer and resource are required"},
		{name: "unknown actor", toml: base + strings.Replace(good, `actor = "ops"`, `actor = "nobody"`, 1), wantErr: `"nobody" is not a remote actor`},
		{name: "local actor", toml: base + strings.Replace(good, `actor = "ops"`, `actor = "ci"`, 1), wantErr: `"ci" is not a remote actor`},
		{name: "rule that matches everything", toml: base + strings.Replace(good, `groups = ["sre"]`, ``, 1), wantErr: "a rule that matches every token"},
		{name: "no rules", toml: base + "[oauth]\nissuer = \"https://idp.example.com\"\nresource = \"https://p.example/mcp\"\n", wantErr: "no [[oauth.actors]]"},
		{name: "symmetric algorithm", toml: base + strings.Replace(good, "[[oauth.actors]]", "algorithms = [\"HS256\"]\n[[oauth.actors]]", 1), wantErr: "only asymmetric"},
		{name: "leeway too long", toml: base + strings.Replace(good, "[[oauth.actors]]", "leeway = \"1h\"\n[[oauth.actors]]", 1), wantErr: "leeway must be in"},
		{name: "scope without tools", toml: base + good + "\"postern:none\" = []\n", wantErr: "list the tools"},
		{name: "unknown key", toml: base + strings.Replace(good, "[[oauth.actors]]", "audience = \"x\"\n[[oauth.actors]]", 1), wantErr: "unknown key"},
		{name: "introspection", toml: base + strings.Replace(good, "[[oauth.actors]]", "introspection_url = \"https://idp.example.com/introspect\"\nintrospection_client_id = \"postern\"\nintrospection_secret_file = \"/etc/postern/introspection.secret\"\n[[oauth.actors]]", 1)},
		{name: "introspection without its client", toml: base + strings.Replace(good, "[[oauth.actors]]", "introspection_url = \"https://idp.example.com/introspect\"\n[[oauth.actors]]", 1), wantErr: "go together"},
		{name: "introspection over http", toml: base + strings.Replace(good, "[[oauth.actors]]", "introspection_url = \"http://idp.example.com/introspect\"\nintrospection_client_id = \"postern\"\nintrospection_secret_file = \"/s\"\n[[oauth.actors]]", 1), wantErr: "must use https"},
		{name: "relative secret file", toml: base + strings.Replace(good, "[[oauth.actors]]", "introspection_url = \"https://idp.example.com/introspect\"\nintrospection_client_id = \"postern\"\nintrospection_secret_file = \"secret\"\n[[oauth.actors]]", 1), wantErr: "absolute path"},
		{name: "no HTTP", toml: "listen = \"\"\n" + base + good, wantErr: "serves no HTTP endpoint"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig(strings.NewReader(tt.toml))
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// A reload changes the [oauth] mapping; adding or removing [oauth], or its other keys, need a
// restart (the verifier and the metadata paths are wired into the endpoint at start).
func TestOAuthReloadScope(t *testing.T) {
	none := DefaultConfig("/x")
	with := none
	with.OAuth = &OAuth{Issuer: "https://idp.example.com", Resource: "https://p.example/mcp",
		Actors: []oauth.Rule{{Actor: "ops", Groups: []string{"sre"}}}}
	for _, tt := range []struct {
		name             string
		from, to         Config
		restart, changes string
	}{
		{name: "added", from: none, to: with, restart: "oauth"},
		{name: "removed", from: with, to: none, restart: "oauth"},
		{name: "issuer", from: with, to: func() Config {
			c := with
			o := *with.OAuth
			o.Issuer, o.Leeway = "https://other.example.com", time.Minute
			c.OAuth = &o
			return c
		}(), restart: "oauth.issuer,oauth.leeway"},
		{name: "mapping", from: with, to: func() Config {
			c := with
			o := *with.OAuth
			o.Actors = append(slices.Clone(o.Actors), oauth.Rule{Actor: "ci", Clients: []string{"ci"}})
			o.ScopeTools = map[string][]string{"postern:read": {"hosts_list"}}
			c.OAuth = &o
			return c
		}(), changes: "oauth.actors: 1 rules before, 2 now,oauth.scope_tools: 0 scopes before, 1 now"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := strings.Join(tt.from.RestartOnly(tt.to), ","); got != tt.restart {
				t.Fatalf("RestartOnly = %q, want %q", got, tt.restart)
			}
			if tt.restart == "" {
				if got := strings.Join(tt.from.Changes(tt.to), ","); got != tt.changes {
					t.Fatalf("Changes = %q, want %q", got, tt.changes)
				}
			}
		})
	}
}
