package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/policy"
)

// TestReloadScope: which changes a reload applies (Changes says them) and which only a
// restart does (RestartOnly names them), from a table.
func TestReloadScope(t *testing.T) {
	uid := 1000
	base := DefaultConfig("/var/lib/postern")
	base.Actors = []policy.Actor{{Name: "agent", TokenSHA256: strings.Repeat("a", 64)}, {Name: "me", UID: &uid}}
	base.Rules = []policy.Rule{{Name: "no-rm", Decision: "deny", Commands: []string{"rm **"}}}
	for _, tt := range []struct {
		name        string
		change      func(*Config)
		wantRestart []string
		wantChanges []string
	}{
		{name: "nothing", change: func(*Config) {}},
		{name: "an actor added and one removed", change: func(c *Config) {
			c.Actors = []policy.Actor{c.Actors[1], {Name: "ci", TokenSHA256: strings.Repeat("b", 64)}}
		}, wantChanges: []string{"actors added: ci", "actors removed: agent"}},
		{name: "an actor's limits", change: func(c *Config) {
			c.Actors = slices.Clone(c.Actors)
			c.Actors[0].MaxConcurrent = 3
		}, wantChanges: []string{"actors changed: agent"}},
		{name: "the same uid in a new pointer is no change", change: func(c *Config) {
			other := 1000
			c.Actors = slices.Clone(c.Actors)
			c.Actors[1].UID = &other
		}},
		{name: "rules", change: func(c *Config) { c.Rules = nil }, wantChanges: []string{"rules: 1 before, 0 now"}},
		{name: "a class", change: func(c *Config) { c.Classes = []Class{{Name: "slow", AttachWindow: time.Hour}} }, wantChanges: []string{"classes added: slow"}},
		{name: "operators", change: func(c *Config) { c.Approvals.Operators = []string{"alice"} }, wantChanges: []string{"approvals.operators: alice"}},
		{name: "max_wait", change: func(c *Config) { c.MaxWait = time.Minute }, wantChanges: []string{"max_wait: 5m0s → 1m0s"}},
		{name: "listen", change: func(c *Config) { c.Listen = "127.0.0.1:1" }, wantRestart: []string{"listen"}},
		{name: "the journal and the webhook", change: func(c *Config) {
			c.Journal.Backend = "etcd"
			c.Approvals.Webhook = "https://example.test/hook"
		}, wantRestart: []string{"journal", "approvals.webhook"}},
		{name: "state_dir", change: func(c *Config) { c.StateDir = "/srv/postern" }, wantRestart: []string{"state_dir"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next := base
			tt.change(&next)
			if got := base.RestartOnly(next); !slices.Equal(got, tt.wantRestart) {
				t.Errorf("RestartOnly = %q; want %q", got, tt.wantRestart)
			}
			if tt.wantRestart != nil {
				return
			}
			if got := base.Changes(next); !slices.Equal(got, tt.wantChanges) {
				t.Errorf("Changes = %q; want %q", got, tt.wantChanges)
			}
		})
	}
}
