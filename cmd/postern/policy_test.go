package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// writePolicyConfig writes a config for state dir dir with the README's rules and an
// actor, and returns its path.
func writePolicyConfig(t *testing.T, dir, extra string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "postern.toml")
	err := os.WriteFile(config, []byte(`state_dir = "`+dir+`"
[[actors]]
name = "deploy-bot"
token_sha256 = "`+strings.Repeat("ab", 32)+`"
hosts = ["web-*", "h1"]
[[rules]]
name = "no-rm"
decision = "deny"
commands = ["rm **"]
[[rules]]
name = "migrations"
decision = "approve"
class = "irreversible"
commands = ["migrate **"]
`+extra), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// wantLines fails the test for each of wants that out does not hold.
func wantLines(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("policy check printed:\n%s\nwant a line with %q", out, want)
		}
	}
}

// checkStatus is the exit status policy check's error stands for: 0 for none, the
// decision's status, else what the CLI maps the error to.
func checkStatus(err error) int {
	var status interface{ ExitStatus() int }
	if errors.As(err, &status) {
		return status.ExitStatus()
	}
	return prog.ExitCode(err, &strings.Builder{})
}

func TestPolicyCheckExplainsTheDecision(t *testing.T) {
	dir := sockdir.New(t) // the CLI dials the operator socket in it
	config := writePolicyConfig(t, filepath.Join(dir, "state"), "")
	tests := []struct {
		name        string
		host        string
		command     []string
		wantOutcome policy.Outcome
		wantRule    string
		wantStatus  int
	}{
		{"allowed", "web-1", []string{"uptime"}, policy.Authorized, "default", 0},
		{"globs, variables, redirections and loops are ordinary", "web-1", []string{`for f in /var/log/*.log; do wc -l "$f" >> /tmp/count; done`}, policy.Authorized, "default", 0},
		{"deny wins through a shell escape", "web-1", []string{"uptime;", "rm", "-rf", "/"}, policy.Rejected, "no-rm", exitRejected},
		{"rm of a glob", "web-1", []string{"rm", "*.log"}, policy.Rejected, "no-rm", exitRejected},
		{"rm behind new wrappers", "web-1", []string{"runuser -u app -- flock /tmp/l timeout 5 rm x"}, policy.Rejected, "no-rm", exitRejected},
		{"approval", "web-1", []string{"migrate", "up"}, policy.AwaitingApproval, "migrations", exitApprovalRequired},
		{"host not allowed", "db-1", []string{"uptime"}, policy.Rejected, "db-1", exitRejected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"policy", "check", "--config", config, "--actor", "deploy-bot", "--host", tt.host, "--json", "--"}, tt.command...)
			res := runCLI(t, "", args...)
			if got := checkStatus(res.err); got != tt.wantStatus {
				t.Fatalf("exit status %d (%v); want %d\n%s", got, res.err, tt.wantStatus, res.stderr)
			}
			var out checkResult
			decodeJSON(t, res, &out)
			if out.Outcome != tt.wantOutcome || !strings.Contains(out.Rule, tt.wantRule) || len(out.Steps) == 0 || out.Reason == "" {
				t.Fatalf("decision = %+v; want %s by a rule mentioning %q, with its steps and reason", out.Decision, tt.wantOutcome, tt.wantRule)
			}
			if out.Outcome != policy.Authorized && out.Repair == "" {
				t.Errorf("a %s decision without a repair: %+v", out.Outcome, out.Decision)
			}
			if out.DecidedBy != config || out.CommandLine != strings.Join(tt.command, " ") {
				t.Errorf("decided by %q on %q; want %q on the words joined", out.DecidedBy, out.CommandLine, config)
			}
		})
	}
	t.Run("layers", func(t *testing.T) {
		words := []string{"sudo", "env", "FOO=1", "sh", "-c", `'nice rm -rf /x'`}
		res := runCLI(t, "", append([]string{"policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "web-1", "--json", "--"}, words...)...)
		var out checkResult
		decodeJSON(t, res, &out)
		if out.Outcome != policy.Rejected || len(out.Layers) != 5 || out.Layer != 4 || out.Layers[4].String() != "rm -rf /x" || out.Word != "rm" {
			t.Fatalf("decision = %+v; want rejected, five layers, the fifth (rm -rf /x) deciding", out.Decision)
		}
		res = runCLI(t, "", append([]string{"policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "web-1", "--"}, words...)...)
		wantLines(t, res.stdout,
			"decided by:   "+config,
			"command line: sudo env FOO=1 sh -c 'nice rm -rf /x'",
			`reason:       denied by rule rules[0] "no-rm": rm -rf /x (run by nice) matches "rm **"`,
			"repair:       the policy forbids this here",
			"layers:", "   1 sudo env FOO=1 sh -c 'nice rm -rf /x'", "   4       nice rm -rf /x  (via sh -c)",
			"=> 5         rm -rf /x  (via nice)", `deny: rules[0] "no-rm" matches, layer 5: rm -rf /x`)
	})
	t.Run("writes and what is unknowable", func(t *testing.T) {
		config := writePolicyConfig(t, filepath.Join(dir, "state"), `[[rules]]
name = "no-etc"
decision = "deny"
writes = ["/etc/**"]
`)
		res := runCLI(t, "", "policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "web-1", "--", "date", ">>", "/tmp/f;", `echo x > "$F"`)
		wantLines(t, res.stdout, "decision:     rejected", `rule:         rules[2] "no-etc"`, "writes:", "     /tmp/f  (layer 1)",
			`     ‹"$F"› (known only when it runs)  (layer 2)`)
		res = runCLI(t, "", "policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "web-1", "--", "$CMD", "-rf", "/")
		wantLines(t, res.stdout, "code:         unparsable", "reason:       a program of the command is only known when it runs: $CMD",
			"repair:       name the program literally")
	})
	t.Run("exit statuses of errors", func(t *testing.T) {
		if res := runCLI(t, "", "policy", "check", "--config", config, "--host", "web-1"); checkStatus(res.err) != 2 || !errors.Is(res.err, cli.ErrUsage) {
			t.Errorf("policy check without a command: %v (status %d), want a usage error (2)", res.err, checkStatus(res.err))
		}
		if res := runCLI(t, "", "policy", "check", "--config", filepath.Join(dir, "missing.toml"), "--host", "web-1", "--", "ls"); checkStatus(res.err) != 1 {
			t.Errorf("policy check with a missing config: %v (status %d), want 1", res.err, checkStatus(res.err))
		}
		bad := writePolicyConfig(t, filepath.Join(dir, "state"), "[[rules]]\nname = \"x\"\ndecision = \"permit\"\n")
		if res := runCLI(t, "", "policy", "check", "--config", bad, "--host", "web-1", "--", "ls"); checkStatus(res.err) != 1 || !strings.Contains(res.err.Error(), `decision "permit"`) {
			t.Errorf("policy check with an invalid config: %v (status %d), want 1 naming the problem", res.err, checkStatus(res.err))
		}
	})
}

// TestPolicyCheckDaemonOrFile: without --config the running daemon decides, and says so;
// with --config FILE the file decides although a daemon runs.
func TestPolicyCheckDaemonOrFile(t *testing.T) {
	f := startFleet(t)
	res := runCLI(t, "", "policy", "check", "--state-dir", f.bastion.StateDir(), "--actor", "agent", "--host", "h1", "--", "rm", "-rf", "/tmp/x")
	if res.err != nil || !strings.Contains(res.stdout, "decided by:   the running daemon's policy (") || !strings.Contains(res.stdout, "decision:     authorized") {
		t.Fatalf("policy check against the daemon: %v\n%s", res.err, res.stdout)
	}
	config := writePolicyConfig(t, f.bastion.StateDir(), "")
	res = runCLI(t, "", "policy", "check", "--config", config, "--actor", "deploy-bot", "--host", "h1", "--", "rm", "-rf", "/tmp/x")
	if checkStatus(res.err) != exitRejected || !strings.Contains(res.stdout, "decided by:   "+config) {
		t.Fatalf("policy check --config with a daemon running: %v (status %d)\n%s", res.err, checkStatus(res.err), res.stdout)
	}
}
