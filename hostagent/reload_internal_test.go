package hostagent

import (
	"crypto/rand"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
)

// TestConfigChanges: which keys a reload sees changed, and which of them only a restart
// applies (every key not in liveKeys).
func TestConfigChanges(t *testing.T) {
	base := DefaultConfig()
	base.AuthorizedKeysFile = "/etc/postern-hostagent/authorized_keys"
	tests := []struct {
		name                  string
		change                func(*Config)
		changed, needsRestart string
	}{
		{"nothing", func(*Config) {}, "", ""},
		{"accounts and env", func(c *Config) {
			c.AllowedAccounts = append(slices.Clone(c.AllowedAccounts), "deploy")
			c.AcceptEnv = []string{"APP_*"}
		}, "accept_env,allowed_accounts", ""},
		{"keys", func(c *Config) {
			c.AuthorizedKeysDir, c.TrustedUserCAKeysFile = "/etc/keys", "/etc/ca.pub"
			c.KeyCheckInterval = time.Second
		}, "authorized_keys_dir,key_check_interval,trusted_user_ca_keys_file", ""},
		{"limits", func(c *Config) {
			c.MaxSessions, c.MaxCommandBytes, c.MaxEnvVars, c.MaxEnvValueBytes = 1, 2, 3, 4
			c.HandshakeTimeout, c.MissingExecutionID = time.Second, MissingIDAssign
		}, "handshake_timeout,max_command_bytes,max_env_value_bytes,max_env_vars,max_sessions,missing_execution_id", ""},
		{"listen, state and host key", func(c *Config) {
			c.Listen, c.DataDir, c.HostKeyFile, c.ControlSocket = "0.0.0.0:22", "/srv", "/k", "/run/s"
		}, "control_socket,data_dir,host_key_file,listen", "control_socket,data_dir,host_key_file,listen"},
		{"what each command takes", func(c *Config) {
			c.OutputCap, c.KillGrace, c.RetryFailedOperations = 1, time.Minute, true
		}, "kill_grace,output_cap,retry_failed_operations", ""},
		{"what is read once", func(c *Config) {
			c.Shell, c.SpoolCap, c.MarkerRetention, c.IdleTimeout = "/bin/bash", 2, time.Hour, time.Hour
			c.ControlSocketMaxConns, c.ControlSocketOperatorConns, c.ControlSocketMaxConnsPerUID = 1, 2, 3
		}, "control_socket_max_conns,control_socket_max_conns_per_uid,control_socket_operator_conns,idle_timeout,marker_retention,shell,spool_cap",
			"control_socket_max_conns,control_socket_max_conns_per_uid,control_socket_operator_conns,idle_timeout,marker_retention,shell,spool_cap"},
		{"live and not", func(c *Config) { c.AcceptEnv, c.Listen = []string{"X"}, ":1" }, "accept_env,listen", "listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := base
			tt.change(&next)
			changed, needsRestart := configChanges(base, next)
			if got := strings.Join(changed, ","); got != tt.changed {
				t.Errorf("changed = %s; want %s", got, tt.changed)
			}
			if got := strings.Join(needsRestart, ","); got != tt.needsRestart {
				t.Errorf("need a restart = %s; want %s", got, tt.needsRestart)
			}
		})
	}
	// Every live key names a field: a misspelt entry would make nothing live.
	for key := range liveKeys {
		if configValue(base, key) == nil {
			t.Errorf("liveKeys has %q, which is no config key", key)
		}
	}
}

// TestReloadOnlyForLocalOperators: reload is refused over SSH (even to the agent's own
// account) and to local peers that are not operators.
func TestReloadOnlyForLocalOperators(t *testing.T) {
	for _, c := range []controlCaller{
		sshCaller(testIdentity("root"), "root"),
		sshCaller(testIdentity("alice"), "root"),
		{transport: "local", operator: false, peerPID: 42},
	} {
		if err := c.permits(hostproto.OpReload); !errors.Is(err, hostproto.ErrForbidden) {
			t.Errorf("%+v may reload: %v", c, err)
		}
	}
	if err := (controlCaller{transport: "local", operator: true, peerPID: 42}).permits(hostproto.OpReload); err != nil {
		t.Errorf("a local operator may not reload: %v", err)
	}
}

// TestKeySetsAdmit: a connection stays while its key (or its certificate's authority) is
// still in the files; a certificate that expired since it logged in ends no connection.
func TestKeySetsAdmit(t *testing.T) {
	plain, other, ca := testutil.NewSSHKey(t), testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	cert := &gossh.Certificate{Key: other.Signer.PublicKey(), CertType: gossh.UserCert, ValidPrincipals: []string{"alice"},
		ValidAfter: 1, ValidBefore: uint64(time.Now().Add(-time.Hour).Unix())}
	if err := cert.SignCert(rand.Reader, ca.Signer); err != nil {
		t.Fatal(err)
	}
	id := func(k gossh.PublicKey) string { return string(k.Marshal()) }
	ks := keySets{
		authorized: map[string]bool{},
		cas:        map[string]bool{id(ca.Signer.PublicKey()): true},
		own:        map[string]map[string]bool{"alice": {id(plain.Signer.PublicKey()): true}},
	}
	if err := ks.admits("alice", plain.Signer.PublicKey()); err != nil {
		t.Errorf("a key in the account's own file: %v", err)
	}
	if err := ks.admits("bob", plain.Signer.PublicKey()); !errors.Is(err, ErrNotAuthorized) {
		t.Errorf("alice's key as bob: %v; want not authorized", err)
	}
	if err := ks.admits("alice", cert); err != nil {
		t.Errorf("an expired certificate of a trusted CA: %v; want it kept", err)
	}
	ks.cas = map[string]bool{}
	if err := ks.admits("alice", cert); !errors.Is(err, ErrNotAuthorized) {
		t.Errorf("a certificate whose CA was removed: %v; want not authorized", err)
	}
}
