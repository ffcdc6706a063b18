package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/plugins"
)

var binaries struct {
	mu    sync.Mutex // guards dir and built
	dir   string
	built map[string]string
}

// Binary builds ./cmd/<name> of this module once per test process and returns its path.
// Call CleanupBinaries from TestMain after m.Run.
func Binary(t testing.TB, name string) string {
	t.Helper()
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if path, ok := binaries.built[name]; ok {
		return path
	}
	if binaries.dir == "" {
		dir, err := os.MkdirTemp("", "postern-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binaries.dir, binaries.built = dir, map[string]string{}
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("find module root: %v", err)
	}
	path := filepath.Join(binaries.dir, name)
	cmd := exec.Command("go", "build", "-o", path, "./cmd/"+name)
	cmd.Dir = strings.TrimSpace(string(root))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", name, err, out)
	}
	binaries.built[name] = path
	return path
}

// HTTPPlugin builds postern-plugin-http (see Binary) and returns its path and the SHA-256
// a bastion's [http_plugin] pins it by.
func HTTPPlugin(t testing.TB) (path, sha256 string) {
	t.Helper()
	path = Binary(t, "postern-plugin-http")
	sum, err := plugins.FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, sum
}

// CleanupBinaries removes what Binary built.
func CleanupBinaries() {
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
}

// Hostagent is a postern-hostagent process on 127.0.0.1 with its own data dir, one
// authorized client key and the current user as the allowed account.
type Hostagent struct {
	// Bin is the agent binary Start runs; default the one Binary builds (with
	// postern-supervisor next to it).
	Bin                                     string
	Addr, Dir, DataDir, ConfigPath, Account string
	ClientKey                               testutil.SSHKey
	HostKey                                 gossh.PublicKey

	daemon
}

// StartHostagent writes a config (extra TOML lines appended) and starts the agent; it is
// killed at cleanup.
func StartHostagent(t testing.TB, extraConfig ...string) *Hostagent {
	t.Helper()
	h := NewHostagent(t, extraConfig...)
	h.Start(t)
	return h
}

// NewHostagent prepares an agent (keys, config, data dir) without starting it.
func NewHostagent(t testing.TB, extraConfig ...string) *Hostagent {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return NewHostagentFor(t, []string{u.Username}, extraConfig...)
}

// NewHostagentFor is NewHostagent with accounts as allowed_accounts; Account is the first.
func NewHostagentFor(t testing.TB, accounts []string, extraConfig ...string) *Hostagent {
	t.Helper()
	dir := sockdir.New(t) // the data dir holds the control socket
	h := &Hostagent{
		Addr: testutil.FreeAddr(t), Dir: dir, DataDir: filepath.Join(dir, "data"),
		ConfigPath: filepath.Join(dir, "hostagent.toml"), Account: accounts[0], ClientKey: testutil.NewSSHKey(t),
		daemon: daemon{what: "hostagent"},
	}
	testutil.WriteAuthorizedKeys(t, h.AuthorizedKeysPath(), h.ClientKey.AuthorizedLine())
	quoted := make([]string, len(accounts))
	for i, a := range accounts {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	cfg := fmt.Sprintf("listen = %q\ndata_dir = %q\nauthorized_keys_file = %q\nallowed_accounts = [%s]\nkill_grace = \"1s\"\n%s\n",
		h.Addr, h.DataDir, h.AuthorizedKeysPath(), strings.Join(quoted, ", "), strings.Join(extraConfig, "\n"))
	if err := os.WriteFile(h.ConfigPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// The agent first, so it starts nothing more; then what it detached, before the temp
	// dir goes.
	t.Cleanup(func() { h.Kill(t); reapShims(t, h.DataDir) })
	return h
}

// AuthorizedKeysPath is the agent's authorized_keys file (ClientKey only, until a test
// rewrites it).
func (h *Hostagent) AuthorizedKeysPath() string { return filepath.Join(h.Dir, "authorized_keys") }

// Start runs the agent (again) and waits until it listens. The dedicated supervisor binary is
// built next to it, as installed.
func (h *Hostagent) Start(t testing.TB) {
	t.Helper()
	bin := h.Bin
	if bin == "" {
		Binary(t, "postern-supervisor")
		bin = Binary(t, "postern-hostagent")
	}
	h.start(t, "listening on", bin, "serve", "--config", h.ConfigPath)
	key, err := os.ReadFile(filepath.Join(h.DataDir, "host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	h.HostKey = signer.PublicKey()
}

// Dial connects as the allowed account with the client key.
func (h *Hostagent) Dial(t testing.TB) *gossh.Client {
	t.Helper()
	return testutil.MustDialSSH(t, h.Addr, h.Account, h.HostKey, gossh.PublicKeys(h.ClientKey.Signer))
}

// Marker asks a hostagent through its control protocol for its marker of id: nil if it has
// none.
func Marker(t testing.TB, ctx context.Context, cc *hostproto.ControlClient, id string) *hostproto.Marker {
	t.Helper()
	found, _, err := cc.Status(ctx, []string{id})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		return nil
	}
	return found[0]
}
