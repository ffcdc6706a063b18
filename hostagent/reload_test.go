package hostagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/markers"
)

// reloadAgent is a whole in-process hostagent (markers, executor, SSH server, control socket)
// started from a config file, which a test rewrites and reloads.
type reloadAgent struct {
	agent      *hostagent.Agent
	addr       string
	account    string
	dir        string
	configPath string
	keysPath   string
	key        testutil.SSHKey // the bastion's key, authorized at start
	logs       *testutil.LockedBuffer
	control    *hostproto.ControlClient // on the local socket, as an operator
}

// configText is the agent's config file: base lines and extra ones.
func (ra *reloadAgent) configText(extra ...string) string {
	return strings.Join(append([]string{
		`listen = "` + ra.addr + `"`,
		`data_dir = "` + filepath.Join(ra.dir, "data") + `"`,
		`authorized_keys_file = "` + ra.keysPath + `"`,
		`allowed_accounts = ["` + ra.account + `"]`,
		`key_check_interval = "200ms"`,
		`kill_grace = "1s"`,
	}, extra...), "\n") + "\n"
}

func (ra *reloadAgent) writeConfig(t *testing.T, extra ...string) {
	t.Helper()
	if err := os.WriteFile(ra.configPath, []byte(ra.configText(extra...)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func startReloadAgent(t *testing.T, extra ...string) *reloadAgent {
	t.Helper()
	dir := sockdir.New(t) // holds the control socket
	ra := &reloadAgent{
		addr: testutil.FreeAddr(t), account: currentUser(t), dir: dir,
		configPath: filepath.Join(dir, "hostagent.toml"), keysPath: filepath.Join(dir, "authorized_keys"),
		key: testutil.NewSSHKey(t), logs: &testutil.LockedBuffer{},
	}
	testutil.WriteAuthorizedKeys(t, ra.keysPath, ra.key.AuthorizedLine())
	ra.writeConfig(t, extra...)
	load := func(data []byte) (hostagent.Config, error) {
		cfg, err := hostagent.ParseConfig(bytes.NewReader(data))
		return cfg, errors.Join(err, cfg.Validate())
	}
	data, err := os.ReadFile(ra.configPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := load(data)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(ra.logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	ra.agent, err = hostagent.OpenAgent(ctx, cfg, hostagent.AgentOptions{Logger: logger, ConfigFile: ra.configPath,
		ConfigDigest: hostagent.ConfigDigest(data), Load: load})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", ra.addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { ra.agent.Serve(ctx, ln, time.Second) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		ra.agent.Close()
		if t.Failed() {
			t.Logf("agent log:\n%s", ra.logs.String())
		}
	})
	testutil.WaitFor(t, "the control socket", func() bool {
		ra.control, err = hostproto.DialLocalControl(ctx, cfg.ControlSocketPath())
		return err == nil
	})
	t.Cleanup(func() { ra.control.Close() })
	return ra
}

func (ra *reloadAgent) dial(key testutil.SSHKey) (*gossh.Client, error) {
	return gossh.Dial("tcp", ra.addr, &gossh.ClientConfig{
		User: ra.account, Auth: []gossh.AuthMethod{gossh.PublicKeys(key.Signer)},
		HostKeyCallback: gossh.FixedHostKey(ra.agent.Server().HostPublicKey()), Timeout: 10 * time.Second,
	})
}

func (ra *reloadAgent) marker(t *testing.T, id string) *hostproto.Marker {
	t.Helper()
	found, _, err := ra.control.Status(context.Background(), []string{id})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		return nil
	}
	return found[0]
}

// TestRevokedKeyClosesTheConnectionNotTheCommand: a bastion-like client connects with key
// K and starts a long command; K is removed from authorized_keys. The connection is closed at
// the next key check, the command goes on and finishes under its marker (its side effect
// happens once), and K can no longer connect.
func TestRevokedKeyClosesTheConnectionNotTheCommand(t *testing.T) {
	ra := startReloadAgent(t)
	client, err := ra.dial(ra.key)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	work := t.TempDir()
	gate, effects := filepath.Join(work, "gate"), filepath.Join(work, "effects")
	// Waits (at most 60 s) for the test to open the gate, then leaves its effect.
	command := "i=0; while [ ! -e " + gate + " ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo ran >> " + effects
	id, _ := markers.NewExecutionID(time.Now())
	ran := make(chan error, 1)
	go func() {
		_, err := hostproto.Run(context.Background(), client, hostproto.Exec{ExecutionID: id, Command: command})
		ran <- err
	}()
	testutil.WaitFor(t, "the command running", func() bool {
		m := ra.marker(t, id)
		return m != nil && m.State == hostproto.MarkerRunning
	})

	// Revoke K: another key takes its place in the file.
	testutil.WriteAuthorizedKeys(t, ra.keysPath, testutil.NewSSHKey(t).AuthorizedLine())
	closed := make(chan error, 1)
	go func() { closed <- client.Wait() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection of the revoked key is still open")
	}
	if err := <-ran; err == nil {
		t.Fatal("the exec over the closed connection reported an outcome; want the connection lost")
	}
	if m := ra.marker(t, id); m.State != hostproto.MarkerRunning {
		t.Fatalf("after the connection closed the marker is %s; want running (nothing is killed)", m.State)
	}
	if _, err := ra.dial(ra.key); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("a new connection with the revoked key: %v; want it refused", err)
	}
	if !strings.Contains(ra.logs.String(), "closing connection: its key is no longer authorized") {
		t.Errorf("the agent did not log why it closed the connection")
	}

	// The command finishes on its own, under its marker.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the command's marker to say it exited", func() bool {
		m := ra.marker(t, id)
		return m.State == hostproto.MarkerExited
	})
	if m := ra.marker(t, id); m.ExitCode == nil || *m.ExitCode != 0 {
		t.Fatalf("marker %+v; want exit 0", m)
	}
	if got, _ := os.ReadFile(effects); string(got) != "ran\n" {
		t.Fatalf("effects %q; want the command to have run once", got)
	}
}

// TestReloadAppliesLiveAndRefusesWhole: a good config is applied to new sessions and the
// change is reported; a config with a problem, or one that changes a setting only a restart
// applies, changes nothing and says why; a reload that takes a key away closes its
// connection.
func TestReloadAppliesLiveAndRefusesWhole(t *testing.T) {
	ra := startReloadAgent(t)
	ctx := context.Background()
	echoApp := func() string {
		t.Helper()
		c, err := ra.dial(ra.key)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var out bytes.Buffer
		id, _ := markers.NewExecutionID(time.Now())
		res, err := hostproto.Run(ctx, c, hostproto.Exec{ExecutionID: id, Command: `printf %s "$APP_COLOR"`, Stdout: &out,
			Env: map[string]string{"APP_COLOR": "blue"}})
		if err == nil && res.ExitStatus != 0 {
			err = errors.New("non-zero exit")
		}
		if err != nil && !errors.Is(err, hostproto.ErrRefused) {
			t.Fatalf("exec: %+v %v", res, err)
		}
		return out.String()
	}
	if got := echoApp(); got != "" {
		t.Fatalf("APP_COLOR reached the command before accept_env allowed it: %q", got)
	}

	// Nothing changed yet.
	res, err := ra.control.Reload(ctx)
	if err != nil || len(res.Changed) != 0 || res.Config != ra.configPath {
		t.Fatalf("reload of the same file = %+v, %v; want nothing changed", res, err)
	}

	first := res.Digest
	reloadLog := filepath.Join(ra.dir, "data", hostagent.ReloadLogName)
	if _, err := os.Stat(reloadLog); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a reload that changed nothing was logged: %v", err)
	}

	// A good change applies to the next session, and is in the reload log first.
	ra.writeConfig(t, `accept_env = ["APP_*"]`, `max_sessions = 4`)
	res, err = ra.control.Reload(ctx)
	if err != nil || strings.Join(res.Changed, ",") != "accept_env,max_sessions" {
		t.Fatalf("reload = %+v, %v; want accept_env and max_sessions changed", res, err)
	}
	if got := echoApp(); got != "blue" {
		t.Fatalf("after the reload APP_COLOR = %q; want blue", got)
	}
	var logged struct {
		By, Config, Digest, Previous string
		Changes                      []struct {
			Key      string
			From, To any
		}
	}
	if data, err := os.ReadFile(reloadLog); err != nil || json.Unmarshal(data, &logged) != nil {
		t.Fatalf("reload log: %q, %v", data, err)
	}
	if text := ra.configText(`accept_env = ["APP_*"]`, `max_sessions = 4`); logged.Digest != hostagent.ConfigDigest([]byte(text)) ||
		logged.Previous != first || logged.Digest != res.Digest || logged.Config != ra.configPath ||
		!strings.HasPrefix(logged.By, "control socket: uid ") || len(logged.Changes) != 2 || logged.Changes[1].Key != "max_sessions" ||
		logged.Changes[1].From != float64(128) || logged.Changes[1].To != float64(4) {
		t.Fatalf("reload log line = %+v", logged)
	}
	logSize := func() int64 {
		info, err := os.Stat(reloadLog)
		if err != nil {
			t.Fatal(err)
		}
		return info.Size()
	}
	size := logSize()

	// Bad configs change nothing, and say why.
	for _, tc := range []struct {
		name string
		text string
		want string
	}{
		{"unknown key", ra.configText(`accept_env = []`, `max_sesions = 2`), "max_sesions"},
		{"invalid value", ra.configText(`accept_env = []`, `max_sessions = 0`), "max_sessions"},
		{"not TOML", "listen = ", "config"},
		{"restart only", strings.Replace(ra.configText(`accept_env = []`), ra.addr, "127.0.0.1:1", 1) + `shell = "/bin/bash"` + "\n", "listen, shell cannot change while the agent runs"},
	} {
		if err := os.WriteFile(ra.configPath, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ra.control.Reload(ctx)
		if !errors.Is(err, hostproto.ErrReloadRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing changed") {
			t.Errorf("%s: reload = %v; want refused naming %q", tc.name, err, tc.want)
		}
		if got := echoApp(); got != "blue" {
			t.Errorf("%s: a refused reload changed the agent (APP_COLOR = %q)", tc.name, got)
		}
	}
	if !strings.Contains(ra.logs.String(), "config reload refused") {
		t.Errorf("the refusals were not logged")
	}
	if logSize() != size {
		t.Errorf("a refused reload was written to the reload log")
	}

	// A reload log that cannot be written changes nothing either.
	os.Rename(reloadLog, reloadLog+".kept")
	if err := os.Mkdir(reloadLog, 0o700); err != nil {
		t.Fatal(err)
	}
	ra.writeConfig(t, `accept_env = []`)
	if _, err := ra.control.Reload(ctx); !errors.Is(err, hostproto.ErrReloadRefused) || !strings.Contains(err.Error(), "reload log") {
		t.Errorf("reload with an unwritable log = %v; want refused", err)
	}
	if got := echoApp(); got != "blue" {
		t.Errorf("a reload that could not be logged changed the agent (APP_COLOR = %q)", got)
	}
	os.Remove(reloadLog)
	os.Rename(reloadLog+".kept", reloadLog)

	// A reload that points at another keys file, without K, closes K's connection.
	client, err := ra.dial(ra.key)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	other := filepath.Join(ra.dir, "other_keys")
	testutil.WriteAuthorizedKeys(t, other, testutil.NewSSHKey(t).AuthorizedLine())
	text := strings.Replace(ra.configText(`accept_env = ["APP_*"]`, `max_sessions = 4`), ra.keysPath, other, 1)
	if err := os.WriteFile(ra.configPath, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err = ra.control.Reload(ctx); err != nil || strings.Join(res.Changed, ",") != "authorized_keys_file" {
		t.Fatalf("reload = %+v, %v; want authorized_keys_file changed", res, err)
	}
	closed := make(chan error, 1)
	go func() { closed <- client.Wait() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection of the key the reload took away is still open")
	}
}

// TestRunningExecutionKeepsItsSettings: a reload that lowers output_cap applies to the next
// command; one already running keeps the cap it started with.
func TestRunningExecutionKeepsItsSettings(t *testing.T) {
	ra := startReloadAgent(t)
	ctx := context.Background()
	client, err := ra.dial(ra.key)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	gate := filepath.Join(t.TempDir(), "gate")
	before, _ := markers.NewExecutionID(time.Now())
	var beforeOut bytes.Buffer
	ran := make(chan error, 1)
	go func() {
		_, err := hostproto.Run(ctx, client, hostproto.Exec{ExecutionID: before, Stdout: &beforeOut,
			Command: "i=0; while [ ! -e " + gate + " ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; printf 0123456789"})
		ran <- err
	}()
	testutil.WaitFor(t, "the first command running", func() bool {
		m := ra.marker(t, before)
		return m != nil && m.State == hostproto.MarkerRunning
	})

	ra.writeConfig(t, `output_cap = 4`)
	if res, err := ra.control.Reload(ctx); err != nil || strings.Join(res.Changed, ",") != "output_cap" {
		t.Fatalf("reload = %+v, %v; want output_cap changed", res, err)
	}
	after, _ := markers.NewExecutionID(time.Now())
	var afterOut bytes.Buffer
	if _, err := hostproto.Run(ctx, client, hostproto.Exec{ExecutionID: after, Stdout: &afterOut, Command: "printf 0123456789"}); err != nil {
		t.Fatal(err)
	}
	if afterOut.String() != "0123" {
		t.Errorf("a command started after the reload wrote %q; want it capped at 4 bytes", afterOut.String())
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if beforeOut.String() != "0123456789" {
		t.Errorf("the command running during the reload wrote %q; want all of it (the cap it started with)", beforeOut.String())
	}
}
