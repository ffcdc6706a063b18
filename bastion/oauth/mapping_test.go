package oauth

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/datadriven"
)

// testRules are the rules every case of testdata/mapping maps against:
//
//	0 alice       subjects alice@example.com
//	1 deploy-bot  clients ci-runner, scopes postern:exec
//	2 ops         groups sre, oncall
//	3 auditor     scopes postern:audit
//
// and the scopes' tools: postern:read the readers, postern:exec ssh_exec and fleet_exec.
var testRules = Rules{
	Actors: []Rule{
		{Actor: "alice", Subjects: []string{"alice@example.com"}},
		{Actor: "deploy-bot", Clients: []string{"ci-runner"}, Scopes: []string{"postern:exec"}},
		{Actor: "ops", Groups: []string{"sre", "oncall"}},
		{Actor: "auditor", Scopes: []string{"postern:audit"}},
	},
	ScopeTools: map[string][]string{
		"postern:read":  {"execution_status", "execution_output", "executions_list", "hosts_list"},
		"postern:exec":  {"ssh_exec", "fleet_exec"},
		"postern:audit": {"executions_list"},
	},
}

// TestMapping checks Rules.Map from testdata/mapping:
//
//	map [sub=S] [client=C] [groups=G,G] [scopes=S,S] [narrow=false]
//
// prints the actor, the rule and the tools the scopes allow ("all" when scopes narrow
// nothing: narrow=false maps without ScopeTools), or the refusal.
func TestMapping(t *testing.T) {
	datadriven.RunFile(t, filepath.Join("testdata", "mapping"), func(t *testing.T, c datadriven.Case) string {
		list := func(key string) []string {
			if c.Args[key] == "" {
				return nil
			}
			return strings.Split(c.Args[key], ",")
		}
		id := Identity{Subject: c.Args["sub"], ClientID: c.Args["client"], Groups: list("groups"), Scopes: list("scopes")}
		rules := testRules
		if c.Args["narrow"] == "false" {
			rules.ScopeTools = nil
		}
		m, err := rules.Map(id)
		if errors.Is(err, ErrNoActor) {
			return "refused: " + err.Error()
		}
		if err != nil {
			c.Fatalf(t, "%v", err)
		}
		tools := "all"
		if m.Tools != nil {
			tools = "[" + strings.Join(m.Tools, " ") + "]"
		}
		return fmt.Sprintf("actor=%s rule=%d tools=%s", m.Actor, m.Rule, tools)
	})
}

func TestScopesFor(t *testing.T) {
	if got := strings.Join(testRules.ScopesFor("executions_list"), " "); got != "postern:audit postern:read" {
		t.Fatalf("ScopesFor(executions_list) = %q", got)
	}
	if got := strings.Join(testRules.Scopes(), " "); got != "postern:audit postern:exec postern:read" {
		t.Fatalf("Scopes() = %q", got)
	}
}
