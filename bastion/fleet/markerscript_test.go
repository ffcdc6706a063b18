package fleet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/internal/testutil"
)

// TestInstallMarkerScript runs the install line with /bin/sh on a test host, under a HOME of
// its own: the script lands in ~/.postern/run and its digest is returned; a refusal on the
// host is reported with what the host said; a host presenting another key is sent nothing.
func TestInstallMarkerScript(t *testing.T) {
	th := newTestHost(t)
	home := t.TempDir()
	th.set(func(th *testHost) { th.home = home })

	digest, err := InstallMarkerScript(t.Context(), th.enrolled(), th.bastion.Signer)
	if err != nil {
		t.Fatal(err)
	}
	if digest != agentless.ScriptSHA256() {
		t.Fatalf("digest = %s; want %s", digest, agentless.ScriptSHA256())
	}
	installed, err := os.ReadFile(filepath.Join(home, ".postern", "run"))
	if err != nil || string(installed) != agentless.Script {
		t.Fatalf("installed script differs from agentless.Script (%v)", err)
	}

	// ~/.postern as a symbolic link: the install program refuses.
	linked := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(linked, ".postern")); err != nil {
		t.Fatal(err)
	}
	th.set(func(th *testHost) { th.home = linked })
	if _, err := InstallMarkerScript(t.Context(), th.enrolled(), th.bastion.Signer); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("install through a symbolic link = %v; want the host's refusal", err)
	}

	h := th.enrolled()
	h.HostKey = testutil.NewSSHKey(t).Public()
	if _, err := InstallMarkerScript(t.Context(), h, th.bastion.Signer); !errors.Is(err, ErrHostKeyMismatch) {
		t.Fatalf("install on a host with another key = %v; want ErrHostKeyMismatch", err)
	}

	th.set(func(th *testHost) { th.home = "" }) // sessions refused
	if _, err := InstallMarkerScript(t.Context(), th.enrolled(), th.bastion.Signer); err == nil {
		t.Fatal("install on a host that refuses sessions succeeded")
	}
	if _, err := InstallMarkerScript(t.Context(), th.enrolled(), nil); err == nil {
		t.Fatal("install without a key succeeded")
	}
}
