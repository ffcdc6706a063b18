package hostagent

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/envpolicy"
)

// FuzzSessionRequests: whatever a client sends on a session channel — env, the batch env
// request, exec, subsystem, signal or anything else, with any payload — is answered on the
// channel (a reply, never a panic that would take the agent and every connection down), and
// what the session accepts keeps its bounds: allowed names, values without NUL within
// max_env_value_bytes, at most max_env_vars requests, a cwd the host protocol's rule
// accepts.
func FuzzSessionRequests(f *testing.F) {
	env := func(name, value string) []byte { return gossh.Marshal(&struct{ Name, Value string }{name, value}) }
	batch := func(vars ...hostproto.EnvVar) []byte {
		data, _ := json.Marshal(vars)
		return gossh.Marshal(&struct{ Env string }{string(data)})
	}
	exec := gossh.Marshal(&struct{ Command string }{"echo hi"})
	f.Add("env", env(hostproto.EnvCwd, "/tmp/a\x00b"), "exec", exec, "", []byte(nil))
	f.Add(hostproto.EnvRequest, batch(hostproto.EnvVar{Name: "LC_A\nB", Value: "x"}, hostproto.EnvVar{Name: hostproto.EnvCwd, Value: "/srv/../etc"}), "exec", exec, "env", env("LANG", "C"))
	f.Add(hostproto.EnvRequest, batch(hostproto.EnvVar{Name: hostproto.EnvCwd, Value: "/" + strings.Repeat("a", 5000)}), "exec", exec, "signal", gossh.Marshal(&struct{ Signal string }{"TERM"}))
	f.Add("subsystem", gossh.Marshal(&struct{ Name string }{ControlSubsystem}), "exec", exec, "pty-req", []byte{0, 0, 0})
	f.Add(hostproto.EnvRequest, []byte{0, 0, 0, 9, '[', '{', '"', 'n', 'a', 'm', 'e', '"', ':'}, "exec", []byte{0xff, 0xff, 0xff, 0xff}, "env", []byte{})
	cfg := DefaultConfig()
	f.Fuzz(func(t *testing.T, t1 string, p1 []byte, t2 string, p2 []byte, t3 string, p3 []byte) {
		s := &session{logger: slog.New(slog.DiscardHandler), env: sessionEnv{filter: newEnvFilter(cfg)}}
		for _, r := range []struct {
			typ     string
			payload []byte
		}{{t1, p1}, {t2, p2}, {t3, p3}} {
			s.handleRequest(&gossh.Request{Type: r.typ, WantReply: true, Payload: r.payload})
		}
		if s.env.requests > cfg.MaxEnvVars && s.env.problem == nil {
			t.Fatalf("%d env requests taken without a problem; the bound is %d", s.env.requests, cfg.MaxEnvVars)
		}
		for name, value := range s.env.vars {
			if !envpolicy.ValidName(name) || !s.env.filter.allow.Allows(name) || strings.IndexByte(value, 0) >= 0 || len(value) > cfg.MaxEnvValueBytes {
				t.Fatalf("accepted %q=%q", name, value)
			}
		}
		if !s.started || s.subsystem != "" || s.env.problem != nil {
			return
		}
		// What execRequest checks of the variables, besides who asks.
		vars := s.env.vars
		parseOperationKey(vars[hostproto.EnvOperationKey])
		parseTimeout(vars[hostproto.EnvTimeout])
		if cwd, err := parseCwd(vars[hostproto.EnvCwd], "/root"); err == nil && vars[hostproto.EnvCwd] != "" {
			if err := hostproto.CheckCwd(cwd); err != nil {
				t.Fatalf("cwd %q accepted: %v", cwd, err)
			}
		}
	})
}
