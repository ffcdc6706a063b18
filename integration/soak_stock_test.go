package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// The soak's host without the hostagent: Debian's sshd with a throwaway account and the
// marker script, behind its own fault proxy. It takes host cuts and freezes (and every
// bastion fault); hostagent and shim kills go to the hostagents.

// newStockSoakHost starts the sshd for name and enrolls it with the marker script.
func newStockSoakHost(t *testing.T, b *harness.Bastion, name string) *soakHost {
	t.Helper()
	acct := stockAccount(t, "postern-al-soak", false)
	s := startStockSSHD(t, acct, b.ClientKey)
	sh := &soakHost{name: name, sshd: s, home: acct.Home, proxy: testutil.StartFaultProxy(t, s.Addr), effects: filepath.Join(acct.Home, "effects")}
	h := fleet.Host{Name: name, Addr: sh.proxy.Addr(), Account: acct.Name, HostKey: s.HostKey}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	digest, err := fleet.InstallMarkerScript(ctx, h, b.ClientKey.Signer)
	if err != nil {
		t.Fatal(err)
	}
	h.Guarantee, h.ScriptSHA256 = fleet.GuaranteeMarkerScript, digest
	if err := fleet.Enroll(config.DefaultConfig(b.StateDir()).InventoryPath(), h); err != nil {
		t.Fatal(err)
	}
	return sh
}

// stockMarkers reads the marker script's markers straight from the account's home, as the
// host's records in the checker's terms: an exit record is exited; a start without one,
// running while the wrapper lives, else interrupted; a bare claim never started.
func stockMarkers(t *testing.T, home string) map[string]*hostproto.Marker {
	t.Helper()
	dir := filepath.Join(home, ".postern", "markers")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("marker script markers: %v", err)
	}
	out := map[string]*hostproto.Marker{}
	// fields reads a record's fields; none when it is missing or only partly written.
	fields := func(id, name string, n int) []string {
		data, _ := os.ReadFile(filepath.Join(dir, id, name))
		if f := strings.Fields(string(data)); len(f) >= n {
			return f
		}
		return nil
	}
	for _, e := range entries {
		m := &hostproto.Marker{ID: e.Name(), State: hostproto.MarkerNotStarted}
		if exit := fields(e.Name(), "exit", 1); exit != nil {
			code, err := strconv.Atoi(exit[0])
			if err != nil {
				t.Fatalf("marker %s: exit record %q", e.Name(), exit)
			}
			m.State, m.ExitCode = hostproto.MarkerExited, &code
		} else if started := fields(e.Name(), "started", 3); started != nil {
			m.State = hostproto.MarkerInterrupted
			if pid, _ := strconv.Atoi(started[0]); pid > 0 && syscall.Kill(pid, 0) == nil {
				m.State = hostproto.MarkerRunning
			}
		}
		out[m.ID] = m
	}
	return out
}
