package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

func TestPolicyCheckExplainsTheDecision(t *testing.T) {
	dir := sockdir.New(t) // the CLI dials the operator socket in it
	config := filepath.Join(dir, "postern.toml")
	err := os.WriteFile(config, []byte(`state_dir = "`+filepath.Join(dir, "state")+`"
[[actors]]
name = "deploy-bot"
token_sha256 = "`+strings.Repeat("ab", 32)+`"
hosts = ["web-*"]
[[rules]]
name = "no-rm"
decision = "deny"
commands = ["rm **"]
[[rules]]
name = "migrations"
decision = "approve"
class = "irreversible"
commands = ["migrate **"]
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		host        string
		command     []string
		wantOutcome policy.Outcome
		wantRule    string
	}{
		{"allowed", "web-1", []string{"uptime"}, policy.Authorized, "default"},
		{"deny wins through a shell escape", "web-1", []string{"uptime;", "rm", "-rf", "/"}, policy.Rejected, "no-rm"},
		{"approval", "web-1", []string{"migrate", "up"}, policy.AwaitingApproval, "migrations"},
		{"host not allowed", "db-1", []string{"uptime"}, policy.Rejected, "db-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"policy", "check", "--config", config, "--actor", "deploy-bot", "--host", tt.host, "--json", "--"}, tt.command...)
			res := mustRun(t, args...)
			var dec policy.Decision
			decodeJSON(t, res, &dec)
			if dec.Outcome != tt.wantOutcome || !strings.Contains(dec.Rule, tt.wantRule) || len(dec.Steps) == 0 {
				t.Fatalf("decision = %+v; want %s by a rule mentioning %q, with its steps", dec, tt.wantOutcome, tt.wantRule)
			}
		})
	}
	t.Run("layers", func(t *testing.T) {
		res := mustRun(t, "policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "web-1", "--json", "--",
			"sudo", "env", "FOO=1", "sh", "-c", `'nice rm -rf /x'`)
		var dec policy.Decision
		decodeJSON(t, res, &dec)
		if dec.Outcome != policy.Rejected || len(dec.Layers) != 5 || dec.Layer != 4 || dec.Layers[4].String() != "rm -rf /x" {
			t.Fatalf("decision = %+v; want rejected, five layers, the fifth (rm -rf /x) deciding", dec)
		}
		out := mustRun(t, "policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "web-1", "--",
			"sudo", "env", "FOO=1", "sh", "-c", `'nice rm -rf /x'`)
		for _, want := range []string{"layers:", "   1 sudo env FOO=1 sh -c 'nice rm -rf /x'", "   4       nice rm -rf /x  (via sh -c)",
			"=> 5         rm -rf /x  (via nice)", `deny: rules[0] "no-rm" matches, layer 5: rm -rf /x`} {
			if !strings.Contains(out.stdout, want) {
				t.Errorf("policy check printed:\n%s\nwant a line with %q", out.stdout, want)
			}
		}
	})
	if res := runCLI(t, "", "policy", "check", "--config", config, "--host", "web-1"); res.err == nil {
		t.Fatal("policy check without a command succeeded")
	}
}
