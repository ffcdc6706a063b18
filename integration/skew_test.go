package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// previousRelease is the commit of the release this one must talk to in both directions
// (hostproto, "Compatibility"). Move it to the new release's commit at each release.
const previousRelease = "370a2865c87c8d525b1a1565f1e1fc66b0479e4f"

// previousBinaries are the previous release's postern, postern-hostagent and postern-shim,
// built once per test binary run from previousRelease (see previousBuild).
var previousBinaries struct {
	once sync.Once
	// dir holds the binaries; skip says why there are none; err why the build failed.
	dir, skip string
	err       error
}

// previousBuild returns the directory of the previous release's binaries, building them the
// first time: `git archive previousRelease | tar -x` into a temp dir and `go build` there
// (modules from the module cache or proxy). A tree that is not a git checkout, or lacks the
// commit, skips the calling test.
func previousBuild(t *testing.T) string {
	t.Helper()
	p := &previousBinaries
	p.once.Do(func() { p.dir, p.skip, p.err = buildPrevious() })
	switch {
	case p.skip != "":
		t.Skip(p.skip)
	case p.err != nil:
		t.Fatalf("build the previous release %s: %v", previousRelease, p.err)
	}
	return p.dir
}

func buildPrevious() (dir, skip string, err error) {
	rootOut, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", "", fmt.Errorf("find module root: %w", err)
	}
	root := strings.TrimSpace(string(rootOut))
	if err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		return "", fmt.Sprintf("skew test: %s is not a git checkout (git rev-parse: %v), so the previous release %s cannot be built from history", root, err, previousRelease), nil
	}
	if err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		return "", fmt.Sprintf("skew test: the git checkout at %s lacks commit %s (the previous release); clone with history", root, previousRelease), nil
	}
	tmp, err := os.MkdirTemp("", "postern-previous-")
	if err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", "", err
	}
	archive := exec.Command("git", "-C", root, "archive", previousRelease)
	untar := exec.Command("tar", "-x", "-C", src)
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if untar.Stdin, err = archive.StdoutPipe(); err != nil {
		return "", "", err
	}
	if err := untar.Start(); err != nil {
		return "", "", err
	}
	if err := archive.Run(); err != nil {
		return "", "", fmt.Errorf("git archive: %v: %s", err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		return "", "", fmt.Errorf("tar: %v: %s", err, untarErr.String())
	}
	bin := filepath.Join(tmp, "bin")
	// -trimpath: the packages that did not change since are the build cache's already, from
	// earlier runs, whatever this run's temp dir is called.
	build := exec.Command("go", "build", "-trimpath", "-o", bin+"/", "./cmd/postern", "./cmd/postern-hostagent", "./cmd/postern-shim")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, "", nil
}

// cleanupPrevious removes what previousBuild built; TestMain calls it.
func cleanupPrevious() {
	if d := previousBinaries.dir; d != "" {
		os.RemoveAll(filepath.Dir(d))
	}
}

// TestSkew runs a bastion and a hostagent of different releases against each other — this
// release's bastion with the previous release's hostagent, and the other way round — through
// exec, attach (execution_output following a running command), status, cancel, and the two
// reconciliations: a connection cut while a command runs, and a bastion restarted while it
// runs. Every command runs exactly once, counted on disk.
func TestSkew(t *testing.T) {
	previous := previousBuild(t)
	for _, pair := range []struct {
		name              string
		oldBastion, oldHA bool
	}{
		{name: "new bastion, previous hostagent", oldHA: true},
		{name: "previous bastion, new hostagent", oldBastion: true},
	} {
		t.Run(pair.name, func(t *testing.T) {
			h := harness.NewHostagent(t)
			if pair.oldHA {
				h.Bin = filepath.Join(previous, "postern-hostagent") // with its postern-shim next to it
			}
			h.Start(t)
			b := harness.NewBastion(t, h.ClientKey)
			if pair.oldBastion {
				b.RunRelease(t, filepath.Join(previous, "postern"))
			}
			f := &testbed{bastion: b, host: h, proxy: testutil.StartFaultProxy(t, h.Addr)}
			b.EnrollAt(t, "h1", f.proxy.Addr(), h)
			b.Start(t)
			f.logOnFailure(t)
			ctx := testContext(t)

			t.Run("version", func(t *testing.T) { skewVersion(t, ctx, f, pair.oldBastion, pair.oldHA) })
			t.Run("exec", func(t *testing.T) {
				cmd, file := appendCommand(t, "exec")
				x := mustCall(t, ctx, f.session(t, "agent", "run-skew-exec"), "ssh_exec", map[string]any{"host": "h1", "command": cmd})
				if x.State != "completed" || x.Stdout != "done\n" || x.ExitCode == nil || *x.ExitCode != 0 {
					t.Fatalf("ssh_exec = %+v; want completed, exit 0, with its output", x)
				}
				ranOnce(t, file)
			})
			t.Run("attach and status", func(t *testing.T) { skewAttach(t, ctx, f) })
			t.Run("cancel", func(t *testing.T) { cancelStopsTheCommand(t, ctx, f) })
			t.Run("connection cut", func(t *testing.T) { hostConnectionCutAfterStart(t, ctx, f) })
			t.Run("bastion restarted", func(t *testing.T) { bastionKilledMidCommand(t, ctx, f, false) })
		})
	}
}

// skewVersion: each side learns the other's protocol version; the previous release sends no
// hello and is served as ever.
func skewVersion(t *testing.T, ctx context.Context, f *testbed, oldBastion, oldHA bool) {
	if !oldHA {
		v, build, err := hostproto.SayHello(f.host.Dial(t), "skew test")
		if err != nil || v != hostproto.Version || build == "" {
			t.Errorf("hello to this release's hostagent = %d, %q, %v; want version %d", v, build, err, hostproto.Version)
		}
	}
	if oldBastion {
		return // its doctor knows no protocol
	}
	// A first call makes the pooled connection, whose hello the doctor reports.
	mustCall(t, ctx, f.session(t, "agent", "run-skew-version"), "ssh_exec", map[string]any{"host": "h1", "command": "true"})
	hc := operatorClient(f.bastion)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://operator/v1/doctor")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep api.DoctorReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("doctor: %s, %v", resp.Status, err)
	}
	want := hostproto.Version
	if oldHA {
		want = 1 // no hello: the previous release
	}
	if len(rep.Hosts) != 1 || !rep.Hosts[0].OK || rep.Hosts[0].Protocol != want {
		t.Errorf("doctor = %+v; want h1 answering protocol %d", rep.Hosts, want)
	}
}

// skewAttach: a running command's output is followed with execution_output, its status
// asked while it runs and after it ended.
func skewAttach(t *testing.T, ctx context.Context, f *testbed) {
	g := newGatedCommand(t)
	cs := f.session(t, "agent", "run-skew-attach")
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo first; " + g.cmd, "wait_s": 0})
	offsetArg := stdoutOffsetArg(t, ctx, cs)
	testutil.WaitFor(t, "the first line, through execution_output", func() bool {
		out := mustCall(t, ctx, cs, "execution_output", map[string]any{"execution_id": x.ExecutionID, offsetArg: 0, "wait_s": 1})
		return out.Stdout == "first\n"
	})
	testutil.WaitFor(t, "execution_status to say running", func() bool {
		return statusOf(t, ctx, cs, x.ExecutionID).State == "running"
	})
	g.open(t)
	end, out := followOutput(t, ctx, cs, x.ExecutionID)
	if end.State != "completed" || out != "first\ndone\n" {
		t.Fatalf("followed to %+v, stdout %q; want completed with both lines", end, out)
	}
	if st := statusOf(t, ctx, cs, x.ExecutionID); st.State != "completed" || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("status after the end = %+v; want completed, exit 0", st)
	}
	ranOnce(t, g.file)
}

// TestUpgradeFromThePreviousRelease: the package upgrade from the previous release, binaries
// replaced by rename as dpkg does (postern-shim becoming a link to postern-supervisor). The
// previous release's agent, still running, starts its supervisor again through postern-shim —
// now this release's binary — and its command runs once; restarted on this release, the
// agent adopts the command the previous release's supervisor runs; nothing runs twice.
func TestUpgradeFromThePreviousRelease(t *testing.T) {
	previous := previousBuild(t)
	installed := t.TempDir()
	install := func(name, from string) {
		t.Helper()
		tmp := filepath.Join(installed, "."+name+".dpkg-new")
		data, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(tmp, data, 0o755)
		}
		if err == nil {
			err = os.Rename(tmp, filepath.Join(installed, name))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, target string) {
		t.Helper()
		tmp := filepath.Join(installed, "."+name+".dpkg-new")
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(installed, name)); err != nil {
			t.Fatal(err)
		}
	}
	install("postern-hostagent", filepath.Join(previous, "postern-hostagent"))
	install("postern-shim", filepath.Join(previous, "postern-shim"))
	h := harness.NewHostagent(t)
	h.Bin = filepath.Join(installed, "postern-hostagent")
	h.Start(t)
	c := h.Dial(t)

	// A command under the previous release's supervisor, running through the upgrade.
	g := newGatedCommand(t)
	long := newID(t)
	waitLong := execInBackground(t, c, hostproto.Exec{ExecutionID: long, Command: g.cmd})
	oldSupervisor := readSupervisorPID(t, filepath.Join(h.DataDir, "spool", long))

	install("postern-hostagent", harness.Binary(t, "postern-hostagent"))
	install(hostagent.SupervisorBinary, harness.Binary(t, "postern-supervisor"))
	link("postern-shim", hostagent.SupervisorBinary)

	// The previous release's agent is still the one running. Its supervisor dies (its
	// command is interrupted, as it would be with any supervisor killed), so the agent starts
	// one again, through postern-shim: this release's binary now.
	if err := syscall.Kill(oldSupervisor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if got := waitLong(); got.res.ExitStatus != hostproto.ExitUnknownOutcome {
		t.Fatalf("the command of the killed supervisor = %+v; want its outcome unknown", got)
	}
	cmd, file := appendCommand(t, "through postern-shim")
	viaShim := newID(t)
	waitShim := execInBackground(t, c, hostproto.Exec{ExecutionID: viaShim, Command: cmd})
	newSupervisor := readSupervisorPID(t, filepath.Join(h.DataDir, "spool", viaShim))
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", newSupervisor)); filepath.Base(exe) != hostagent.SupervisorBinary {
		t.Errorf("the previous release's agent started %q as its supervisor; want this release's %s", exe, hostagent.SupervisorBinary)
	}
	if got := waitShim(); got.err != nil || got.res.ExitStatus != 0 || got.stdout != "done\n" {
		t.Fatalf("a command of the previous release's agent under this release's supervisor = %+v", got)
	}
	ranOnce(t, file)

	// A command running when the agent restarts on this release: adopted, not run again.
	g = newGatedCommand(t)
	adopted := newID(t)
	waitAdopted := execInBackground(t, c, hostproto.Exec{ExecutionID: adopted, Command: g.cmd})
	h.Kill(t) // the unit restarts the agent (KillMode=process: the agent only)
	waitAdopted()
	h.Start(t)
	g.open(t)
	again := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: adopted, Command: g.cmd})
	if again.err != nil || again.res.ExitStatus != 0 || again.stdout != "done\n" || !again.res.Replayed() {
		t.Fatalf("re-issue after the upgrade = %+v; want exit 0 from the adopted command", again)
	}
	ranOnce(t, g.file)
}
