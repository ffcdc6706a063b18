package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// The hostagent's promise to identities (docs/design.md, "The hostagent"): an execution belongs to
// the identity that created it, and nothing tells another identity — another account, another
// key of the same account, another certificate key id, or an unprivileged local user — about
// it. These tests use two real accounts, the real OpenSSH client and the real binaries.

// twoAccounts is a running hostagent that lets two throwaway accounts in, with a key for each
// and a user CA, its control socket in a directory every account can reach, and
// postern-hostagent there too (for commands' checkpoints).
type twoAccounts struct {
	agent                *harness.Hostagent
	a, b                 unixuser.User
	keyA, keyB           string // private key files for ssh -i
	ca                   testutil.SSHKey
	dir, shared          string
	knownHosts, port     string
	socket, hostagentBin string
}

func startTwoAccounts(t *testing.T, prefix string) *twoAccounts {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("ssh client binary not installed")
	}
	ta := &twoAccounts{
		a:   unixuser.NewLogin(t, prefix+"-a"),
		b:   unixuser.NewLogin(t, prefix+"-b"),
		ca:  testutil.NewSSHKey(t),
		dir: t.TempDir(),
	}
	shared, err := os.MkdirTemp("", "hostid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	if err := os.Chmod(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	ta.shared, ta.socket = shared, filepath.Join(shared, "control.sock")
	ta.hostagentBin = filepath.Join(shared, "postern-hostagent")
	copyFile(t, harness.Binary(t, "postern-hostagent"), ta.hostagentBin, 0o755)

	caFile := filepath.Join(ta.dir, "user_ca.pub")
	testutil.WriteAuthorizedKeys(t, caFile, ta.ca.AuthorizedLine())
	ta.agent = harness.NewHostagentFor(t, []string{ta.a.Name, ta.b.Name},
		fmt.Sprintf("control_socket = %q", ta.socket), fmt.Sprintf("trusted_user_ca_keys_file = %q", caFile))
	keyB := testutil.NewSSHKey(t)
	testutil.WriteAuthorizedKeys(t, ta.agent.AuthorizedKeysPath(), ta.agent.ClientKey.AuthorizedLine(), keyB.AuthorizedLine())
	ta.agent.Start(t)
	ta.keyA = ta.agent.ClientKey.WritePrivateKey(t, filepath.Join(ta.dir, "id_a"))
	ta.keyB = keyB.WritePrivateKey(t, filepath.Join(ta.dir, "id_b"))
	_, ta.port, _ = net.SplitHostPort(ta.agent.Addr)
	ta.knownHosts = testutil.WriteKnownHosts(t, filepath.Join(ta.dir, "known_hosts"), ta.agent.Addr, ta.agent.HostKey)
	return ta
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, mode); err != nil {
		t.Fatal(err)
	}
}

// certFor writes a certificate of keyID for account on a new key and returns the key file.
func (ta *twoAccounts) certFor(t *testing.T, name, keyID, account string) string {
	t.Helper()
	key := testutil.NewSSHKey(t)
	file := key.WritePrivateKey(t, filepath.Join(ta.dir, name))
	testutil.WriteCert(t, file+"-cert.pub", testutil.SignUserCert(t, ta.ca, key.Public(),
		testutil.UserCert{KeyID: keyID, Principals: []string{account}}))
	return file
}

type sshResult struct {
	stdout, stderr string
	status         int
}

// ssh runs the OpenSSH client as identity (a key file) logged in as account, with the
// execution id (and operation key, if any) sent by SetEnv, and stdin.
// It fails the test if ssh has not returned after a minute (it attached to something that
// does not end).
func (ta *twoAccounts) ssh(t *testing.T, identity, account, id, opKey, stdin string, command ...string) sshResult {
	t.Helper()
	cmd := ta.sshCommand(identity, account, id, opKey, command...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	if !timer.Stop() {
		t.Fatalf("ssh %s@127.0.0.1 with %s did not return within a minute (attached?); stdout %q stderr %q", account, identity, stdout.String(), stderr.String())
	}
	return sshOutcome(t, err, &stdout, &stderr)
}

func (ta *twoAccounts) sshCommand(identity, account, id, opKey string, command ...string) *exec.Cmd {
	args := testutil.OpenSSHArgs(ta.knownHosts, identity, ta.port)
	env := "POSTERN_EXECUTION_ID=" + id
	if opKey != "" {
		env += " POSTERN_OPERATION_KEY=" + opKey
	}
	if id != "" {
		args = append(args, "-o", "SetEnv="+env)
	}
	args = append(append(args, account+"@127.0.0.1"), command...)
	return exec.Command("ssh", args...)
}

func sshOutcome(t *testing.T, err error, stdout, stderr *bytes.Buffer) sshResult {
	t.Helper()
	res := sshResult{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		res.status = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("ssh: %v", err)
	}
	return res
}

// control sends request lines to the postern-control subsystem with ssh -s and returns the
// reply lines, keepalives left out.
func (ta *twoAccounts) control(t *testing.T, identity, account string, requests ...string) []string {
	t.Helper()
	res := ta.ssh(t, identity, account, "", "", strings.Join(requests, "\n")+"\n", "-s", hostproto.ControlSubsystem)
	if res.status != 0 {
		t.Fatalf("control as %s: status %d, stderr %q", account, res.status, res.stderr)
	}
	var replies []string
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		if line != `{"keepalive":true}` {
			replies = append(replies, line)
		}
	}
	return replies
}

// TestExecutionBelongsToItsIdentity: another account, or another key of the same account,
// that sends a running or finished execution's id gets no output, no marker and no attach —
// the same refusal whatever the execution's state — and nothing runs again; its owner still
// attaches and replays.
func TestExecutionBelongsToItsIdentity(t *testing.T) {
	ta := startTwoAccounts(t, "hostid-own")
	effects, goFile := filepath.Join(ta.a.Home, "effects"), filepath.Join(ta.a.Home, "go")
	id := newID(t)
	command := "echo ran >> " + effects + "; echo secret-output; echo secret-stderr >&2; while [ ! -e " + goFile + " ]; do sleep 0.05; done; echo done"

	// The owner's command runs and prints its first line.
	owner := ta.sshCommand(ta.keyA, ta.a.Name, id, "", command)
	ownerOut, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var ownerErr bytes.Buffer
	owner.Stderr = &ownerErr
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	var ownerDone bool
	t.Cleanup(func() {
		if !ownerDone { // the test failed midway: let the command end before its account goes
			os.WriteFile(goFile, nil, 0o644)
			owner.Wait()
		}
	})
	ownerLines := bufio.NewReader(ownerOut)
	if line, err := ownerLines.ReadString('\n'); err != nil || line != "secret-output\n" {
		t.Fatalf("owner's first line = %q, %v; stderr %q", line, err, ownerErr.String())
	}

	foreign := []struct{ name, key, account string }{
		{"another account", ta.keyB, ta.b.Name},
		{"same key, another account", ta.keyA, ta.b.Name},
		{"another key of the same account", ta.keyB, ta.a.Name},
	}
	refusals := map[string]sshResult{}
	check := func(phase string) {
		for _, f := range foreign {
			got := ta.ssh(t, f.key, f.account, id, "", "", command)
			if got.status != 255 || got.stdout != "" || strings.Contains(got.stderr, "secret") ||
				strings.Contains(got.stderr, "running") || strings.Contains(got.stderr, "exited") ||
				!strings.Contains(got.stderr, "not available to this identity") {
				t.Errorf("%s, %s: %+v; want exit 255, no output, only \"not available to this identity\"", phase, f.name, got)
			}
			if first, ok := refusals[f.name]; ok && first != got {
				t.Errorf("%s: answer while running %+v differs from after it ended %+v", f.name, first, got)
			}
			refusals[f.name] = got
		}
	}
	check("while it runs")

	// Its control view: the id is missing / not found, exactly like an id never used.
	never := newID(t)
	for _, f := range foreign {
		replies := ta.control(t, f.key, f.account,
			`{"op":"status","ids":["`+id+`"]}`, `{"op":"attach","id":"`+id+`"}`, `{"op":"cancel","id":"`+id+`"}`)
		unknown := ta.control(t, f.key, f.account,
			`{"op":"status","ids":["`+never+`"]}`, `{"op":"attach","id":"`+never+`"}`, `{"op":"cancel","id":"`+never+`"}`)
		if got, want := strings.Join(replies, "\n"), strings.ReplaceAll(strings.Join(unknown, "\n"), never, id); got != want {
			t.Errorf("control as %s: %s\nwant the answers for an unknown id:\n%s", f.name, got, want)
		}
		if list := ta.control(t, f.key, f.account, `{"op":"list"}`); len(list) != 1 || strings.Contains(list[0], id) {
			t.Errorf("list as %s = %q; want no trace of %s", f.name, list, id)
		}
	}

	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(ownerLines)
	err = owner.Wait()
	ownerDone = true
	if err != nil || string(rest) != "done\n" {
		t.Fatalf("owner: %v, rest %q, stderr %q", err, rest, ownerErr.String())
	}
	check("after it ended")

	// The owner replays it; it ran once.
	got := ta.ssh(t, ta.keyA, ta.a.Name, id, "", "", command)
	if got.status != 0 || got.stdout != "secret-output\ndone\n" || !strings.Contains(got.stderr, "already ran") {
		t.Errorf("owner's replay = %+v; want the stored output", got)
	}
	data, err := os.ReadFile(effects)
	if err != nil || string(data) != "ran\n" {
		t.Errorf("side effects = %q, %v; want one run", data, err)
	}
}

// TestCertificateIdentityIsItsKeyID: a certificate's execution belongs to its key id (and
// account), so a renewed certificate — new key, same key id — attaches, and another key id
// of the same account does not.
func TestCertificateIdentityIsItsKeyID(t *testing.T) {
	ta := startTwoAccounts(t, "hostid-cert")
	id := newID(t)
	first := ta.certFor(t, "id_deploy", "deploy-bot", ta.a.Name)
	if got := ta.ssh(t, first, ta.a.Name, id, "", "", "echo from-deploy"); got.status != 0 || got.stdout != "from-deploy\n" {
		t.Fatalf("first run = %+v", got)
	}
	renewed := ta.certFor(t, "id_deploy_renewed", "deploy-bot", ta.a.Name)
	if got := ta.ssh(t, renewed, ta.a.Name, id, "", "", "echo from-deploy"); got.status != 0 || got.stdout != "from-deploy\n" || !strings.Contains(got.stderr, "already ran") {
		t.Errorf("renewed certificate = %+v; want the replay", got)
	}
	other := ta.certFor(t, "id_other", "someone-else", ta.a.Name)
	if got := ta.ssh(t, other, ta.a.Name, id, "", "", "echo from-deploy"); got.status != 255 || got.stdout != "" || !strings.Contains(got.stderr, "not available to this identity") {
		t.Errorf("another key id = %+v; want refused with nothing of the execution", got)
	}
}

// TestOperationKeyConflictNamesNoOtherIdentitysExecution: the operation key is host-wide, so
// another identity is refused too, but without the holder's execution id or marker; the
// owner is shown both.
func TestOperationKeyConflictNamesNoOtherIdentitysExecution(t *testing.T) {
	ta := startTwoAccounts(t, "hostid-opkey")
	holder := newID(t)
	if got := ta.ssh(t, ta.keyA, ta.a.Name, holder, "db-migrate-42", "", "echo migrated"); got.status != 0 {
		t.Fatalf("holder = %+v", got)
	}
	other := ta.ssh(t, ta.keyB, ta.b.Name, newID(t), "db-migrate-42", "", "echo again")
	if other.status != hostproto.ExitOperationTaken || other.stdout != "" || strings.Contains(other.stderr, holder) ||
		!strings.Contains(other.stderr, `operation key "db-migrate-42" is taken by another execution; not started`) {
		t.Errorf("another identity = %+v; want 253, the key taken, no execution id", other)
	}
	own := ta.ssh(t, ta.keyA, ta.a.Name, newID(t), "db-migrate-42", "", "echo again")
	if own.status != hostproto.ExitOperationTaken || !strings.Contains(own.stderr, holder) {
		t.Errorf("owner = %+v; want 253 naming %s", own, holder)
	}
}

// TestNoExecutionIDInProcessArguments: every local user can read every process's arguments;
// none of the hostagent's (agent, supervisor, command) names the execution or its spool.
func TestNoExecutionIDInProcessArguments(t *testing.T) {
	h := harness.StartHostagent(t)
	id := newID(t)
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	wait := execInBackground(t, h.Dial(t), hostproto.Exec{ExecutionID: id,
		Command: "touch " + started + "; while [ ! -e " + release + " ]; do sleep 0.05; done"})
	defer func() {
		os.WriteFile(release, nil, 0o600)
		if got := wait(); got.err != nil || got.res.ExitStatus != 0 {
			t.Errorf("exec = %+v", got)
		}
	}()
	testutil.WaitFor(t, "the command to run", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		args, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		if bytes.Contains(args, []byte(id)) {
			t.Errorf("%s = %q names the execution", p, bytes.ReplaceAll(args, []byte{0}, []byte{' '}))
		}
	}
}

// checkpointAs runs `postern-hostagent marker checkpoint` as user u for id and returns its
// combined output with id replaced by ID.
func (ta *twoAccounts) checkpointAs(t *testing.T, u unixuser.User, id string) (string, error) {
	t.Helper()
	cmd := exec.Command(ta.hostagentBin, "marker", "checkpoint", "probe")
	cmd.Env = []string{"POSTERN_EXECUTION_ID=" + id, "POSTERN_MARKER_SOCKET=" + ta.socket}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.Credential()}
	out, err := cmd.CombinedOutput()
	return strings.ReplaceAll(string(out), id, "ID"), err
}

// TestLocalSocketTellsOtherAccountsNothing: a local account that is not an operator gets one
// answer for a checkpoint on another account's running execution, a finished one and an id
// never used; the execution's own command is served.
func TestLocalSocketTellsOtherAccountsNothing(t *testing.T) {
	ta := startTwoAccounts(t, "hostid-sock")
	finished := newID(t)
	if got := ta.ssh(t, ta.keyA, ta.a.Name, finished, "", "", "true"); got.status != 0 {
		t.Fatalf("finished = %+v", got)
	}
	running := newID(t)
	goFile := filepath.Join(ta.a.Home, "go")
	owner := ta.sshCommand(ta.keyA, ta.a.Name, running, "",
		ta.hostagentBin+" marker checkpoint own && echo checkpointed; while [ ! -e "+goFile+" ]; do sleep 0.05; done")
	ownerOut, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var ownerErr bytes.Buffer
	owner.Stderr = &ownerErr
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.WriteFile(goFile, nil, 0o644)
		owner.Wait()
	}()
	if line, err := bufio.NewReader(ownerOut).ReadString('\n'); err != nil || line != "checkpointed\n" {
		t.Fatalf("the execution's own checkpoint: %q, %v, stderr %q", line, err, ownerErr.String())
	}

	var answers []string
	for _, id := range []string{running, finished, newID(t)} {
		out, err := ta.checkpointAs(t, ta.b, id)
		if err == nil {
			t.Errorf("checkpoint by another account on %s succeeded: %s", id, out)
		}
		answers = append(answers, out)
	}
	for i, a := range answers[1:] {
		if a != answers[0] {
			t.Errorf("answer %d %q differs from the one for a running execution %q", i+1, a, answers[0])
		}
	}
}

// Role of the integration test binary that holds local control connections (see
// TestLocalSocketSlotsPerAccount).
const holdConnsRole = "hold-control-connections"

// holdControlConnections dials the control socket count times, reports how many connections
// were served ("held N"), and holds them until stdin closes.
func holdControlConnections(socket string, count int) {
	held := 0
	for range count {
		c, err := hostproto.DialLocalControl(context.Background(), socket)
		if err != nil {
			continue
		}
		// Served connections answer (forbidden: not an operator); refused ones say busy.
		if _, err := c.Export(context.Background(), io.Discard); errors.Is(err, hostproto.ErrForbidden) {
			held++
			defer c.Close()
		} else {
			c.Close()
		}
	}
	fmt.Println("held", held)
	io.Copy(io.Discard, os.Stdin)
}

// TestLocalSocketSlotsPerAccount: an account that is not an operator holds at most its share
// of the local socket's connections; operators and the other accounts' commands still get in.
func TestLocalSocketSlotsPerAccount(t *testing.T) {
	ta := startTwoAccounts(t, "hostid-slots")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(ta.shared, "integration.test")
	copyFile(t, exe, bin, 0o755)
	hog := exec.Command(bin, "-test.run=^$")
	hog.Env = []string{"POSTERN_TEST_ROLE=" + holdConnsRole, "POSTERN_TEST_SOCKET=" + ta.socket, "POSTERN_TEST_COUNT=100"}
	hog.SysProcAttr = &syscall.SysProcAttr{Credential: ta.b.Credential()}
	stdin, err := hog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := hog.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	hog.Stderr = os.Stderr
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		hog.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("holder: %v", err)
	}
	held, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "held")))
	if held != 8 {
		t.Errorf("an account that is not an operator held %d connections; want its share, 8", held)
	}

	// An operator (root) still lists markers.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	op, err := hostproto.DialLocalControl(ctx, ta.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	if _, _, err := op.List(ctx, hostproto.ControlListQuery{}); err != nil {
		t.Errorf("operator's list while another account holds connections: %v", err)
	}
	// Another account's command still reports its checkpoint.
	got := ta.ssh(t, ta.keyA, ta.a.Name, newID(t), "", "", ta.hostagentBin+" marker checkpoint still-served && echo ok")
	if got.status != 0 || got.stdout != "ok\n" {
		t.Errorf("checkpoint from another account's command = %+v; want it served", got)
	}
}
