package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/hostproto"
)

// FuzzExecArgsReachTheWire: what intake accepts, the dispatch can send: the host protocol's
// check of the request (every field, and every request within one SSH packet) passes, and
// the cwd passes the rule the hostagent applies. So no accepted call can be refused by the
// client of the pooled connection, nor break it.
func FuzzExecArgsReachTheWire(f *testing.F) {
	f.Add("h1", "echo hi", "/srv/app", "LANG", "C.UTF-8", "LC_ALL", "C", "deploy:1", 30)
	f.Add("h1", "true", "/tmp/a\x00b", "LC_A\nB", "x", "RAILS_ENV", "production", "", 0)
	f.Add("h1", strings.Repeat("x", 300<<10), "/", "LC_X", strings.Repeat("<", 4096), "LANG", "\xed\xa0\x80", "", 0)
	f.Add("h1", "true", "/srv/../etc", "LC_\x00", "v", "LANG", "\xff", "a b", -1)
	in := &intake{core: testCore(&core{cfg: config.DefaultConfig("/x")})}
	in.cfg.MaxCommandBytes = 1 << 20
	f.Fuzz(func(t *testing.T, host, command, cwd, k1, v1, k2, v2, opKey string, timeoutS int) {
		a := api.ExecArgs{Host: host, Command: command, Cwd: cwd, Env: map[string]string{k1: v1, k2: v2}, OperationKey: opKey, TimeoutS: timeoutS}
		if in.validate(&a) != nil {
			return
		}
		if err := checkWire(a, a.Cwd); err != nil {
			t.Fatalf("validate accepted %+v; the wire check refuses it: %v", a, err)
		}
		x := hostproto.Exec{
			ExecutionID: "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW", Fingerprint: "hmac-sha256:" + strings.Repeat("ab", 32),
			Command: a.Command, OperationKey: a.OperationKey, Cwd: a.Cwd, Env: a.Env,
			Timeout: time.Duration(a.TimeoutS) * time.Second,
		}
		if err := x.Check(); err != nil {
			t.Fatalf("validate accepted %+v; the host protocol refuses it: %v", a, err)
		}
		if a.Cwd != "" {
			if err := hostproto.CheckCwd(a.Cwd); err != nil {
				t.Fatalf("validate accepted cwd %q; the hostagent refuses it: %v", a.Cwd, err)
			}
		}
	})
}
