package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TestHostsImport: a file with a bad host imports nothing and says which line; a dry run
// writes nothing; the good file imports in one go; another key for an enrolled host needs
// --replace.
func TestHostsImport(t *testing.T) {
	dir := sockdir.New(t)
	stateDir := filepath.Join(dir, "state")
	inventory := config.DefaultConfig(stateDir).InventoryPath()
	k1, k2 := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	write := func(name, text string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := "name,addr,account,labels,description,host_key\n" +
		fmt.Sprintf("db-1,10.0.0.1:2222,postgres,role=db env=prod,primary,%s\n", k1.AuthorizedLine()) +
		"db-2,10.0.0.2:2222,postgres,role=db env=prod,replica,@cert-authority\n"
	bad := write("bad.csv", good+"db 3,10.0.0.3:2222,postgres,,,@cert-authority\n")

	res := runCLI(t, "", "hosts", "import", bad, "--state-dir", stateDir)
	if !errors.Is(res.err, fleet.ErrImportFailed) || !strings.Contains(res.stdout, `bad.csv: line 4: host "db 3": name`) || !strings.Contains(res.stdout, "1 of 3 hosts cannot be imported; nothing was imported") {
		t.Fatalf("import of a bad file: %v\n%s", res.err, res.stdout)
	}
	if _, err := os.Stat(inventory); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed import wrote the inventory: %v", err)
	}

	goodFile := write("fleet.csv", good)
	res = mustRun(t, "hosts", "import", goodFile, "--dry-run", "--state-dir", stateDir)
	if !strings.Contains(res.stdout, "dry run: every host passes; importing would record 2 new") {
		t.Fatalf("dry run printed %q", res.stdout)
	}
	if _, err := os.Stat(inventory); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dry run wrote the inventory: %v", err)
	}
	res = mustRun(t, "hosts", "import", goodFile, "--state-dir", stateDir)
	if !strings.Contains(res.stdout, "imported 2 hosts (2 new, 0 replaced, 0 unchanged)") {
		t.Fatalf("import printed %q", res.stdout)
	}
	list := mustRun(t, "hosts", "list", "--state-dir", stateDir).stdout
	if !strings.Contains(list, "db-1") || !strings.Contains(list, "@cert-authority") || !strings.Contains(list, "env=prod,role=db") {
		t.Fatalf("hosts list after the import:\n%s", list)
	}

	page := mustRun(t, "hosts", "list", "--label", "env=prod,role=db", "--limit", "1", "--state-dir", stateDir).stdout
	if !strings.Contains(page, "db-1") || strings.Contains(page, "db-2") || !strings.Contains(page, "1 of 2 hosts; next page: --cursor db-1") {
		t.Fatalf("hosts list --limit 1:\n%s", page)
	}
	page = mustRun(t, "hosts", "list", "--label", "env=prod", "--limit", "1", "--cursor", "db-1", "--state-dir", stateDir).stdout
	if !strings.Contains(page, "db-2") || strings.Contains(page, "db-1 ") || strings.Contains(page, "next page") {
		t.Fatalf("hosts list --cursor db-1:\n%s", page)
	}
	if res := runCLI(t, "", "hosts", "list", "--label", "env", "--state-dir", stateDir); !errors.Is(res.err, cli.ErrUsage) {
		t.Fatalf("hosts list --label env: %v; want a usage error", res.err)
	}

	rekeyed := write("rekeyed.toml", fmt.Sprintf("account = \"postgres\"\n\n[[hosts]]\nname = \"db-1\"\naddr = \"10.0.0.1:2222\"\nhost_key = %q\n", k2.AuthorizedLine()))
	res = runCLI(t, "", "hosts", "import", rekeyed, "--state-dir", stateDir)
	if !errors.Is(res.err, fleet.ErrImportFailed) || !strings.Contains(res.stdout, "line 3: host db-1: already enrolled with host key") || !strings.Contains(res.stdout, "--replace") {
		t.Fatalf("import of another key: %v\n%s", res.err, res.stdout)
	}
	res = mustRun(t, "hosts", "import", rekeyed, "--replace", "--json", "--state-dir", stateDir)
	if !strings.Contains(res.stdout, `"applied": true`) || !strings.Contains(res.stdout, `"changes": [`) {
		t.Fatalf("import --replace --json printed %s", res.stdout)
	}
}

// TestHostsImportByFingerprint: a host given by its fingerprint is asked for its key, which
// is recorded when it matches; a host presenting another key, or not reachable, fails the
// import with its line, and nothing is imported.
func TestHostsImportByFingerprint(t *testing.T) {
	agent := harness.StartHostagent(t)
	dir := sockdir.New(t)
	stateDir := filepath.Join(dir, "state")
	inventory := config.DefaultConfig(stateDir).InventoryPath()
	fp := gossh.FingerprintSHA256(agent.HostKey)
	closedAddr, release := testutil.ClosedAddr(t)
	defer release()
	file := filepath.Join(dir, "fleet.csv")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("name,addr,account,host_key\n" +
		fmt.Sprintf("good,%s,%s,%s\n", agent.Addr, agent.Account, fp) +
		fmt.Sprintf("impostor,%s,%s,%s\n", agent.Addr, agent.Account, gossh.FingerprintSHA256(testutil.NewSSHKey(t).Public())) +
		fmt.Sprintf("down,%s,%s,%s\n", closedAddr, agent.Account, fp))
	res := runCLI(t, "", "hosts", "import", file, "--state-dir", stateDir)
	if !errors.Is(res.err, fleet.ErrImportFailed) || !strings.Contains(res.stdout, "line 3: host impostor: "+agent.Addr+" presents "+fp+", not the expected") ||
		!strings.Contains(res.stdout, "line 4: host down: its key could not be fetched") {
		t.Fatalf("import: %v\n%s", res.err, res.stdout)
	}
	if _, err := os.Stat(inventory); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed import wrote the inventory: %v", err)
	}

	write("name,addr,account,host_key\n" + fmt.Sprintf("good,%s,%s,%s\n", agent.Addr, agent.Account, fp))
	mustRun(t, "hosts", "import", file, "--state-dir", stateDir)
	inv, err := fleet.OpenInventory(inventory)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := inv.Host("good"); err != nil || h.Fingerprint() != fp {
		t.Fatalf("good = %+v, %v; want its key %s pinned", h, err, fp)
	}
}
