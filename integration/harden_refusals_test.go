package integration

import (
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// maxFloodLogBytes bounds what a flood of refusals may add to a daemon's logs: a few lines
// per reason and minute, and a summary.
const maxFloodLogBytes = 32 << 10

// TestRefusalFloodOfTheHostagent: an unprivileged user floods the control socket (past its
// share of connections: every connect refused) and every supervisor socket it can find, and
// someone floods the SSH port with a key that may not log in. The hostagent's log and the
// supervisor's log in the data dir grow by a bounded number of bytes, and the summary the
// hostagent logs when it stops counts every refusal.
func TestRefusalFloodOfTheHostagent(t *testing.T) {
	const connects, logins = 20000, 300
	stranger := unixuser.New(t, "hardenflood-h")
	socket := filepath.Join(unixuser.SharedDir(t, "hardenflood-"), "control.sock")
	h := harness.StartHostagent(t, fmt.Sprintf("control_socket = %q", socket))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hostagent log:\n%s", h.Logs())
		}
	})
	// A supervisor runs once a command ran.
	if o := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: newID(t), Command: "true"}); o.err != nil || o.res.ExitStatus != 0 {
		t.Fatalf("exec = %+v", o)
	}
	supervisorLog := filepath.Join(h.DataDir, "supervisor", "supervisor.log")
	supervisorBefore := len(readFile(supervisorLog))
	before := len(h.Logs())

	// The share of an account that is not an operator is 8 connections: the flood is refused.
	// The connections it holds stay until every refused one was served (below).
	connected, failed, release := flood(t, stranger, 8, connects, socket)
	if connected != connects {
		t.Fatalf("the control socket took %d of %d connects (%d failed)", connected, connects, failed)
	}
	supConnected, supFailed, _ := flood(t, stranger, 0, connects, "procnet:postern-supervisor", filepath.Join(h.DataDir, "supervisor", "s.sock"))
	t.Logf("supervisor sockets: %d connects reached one, %d did not", supConnected, supFailed)

	bad := testutil.NewSSHKey(t)
	for range logins {
		c, err := gossh.Dial("tcp", h.Addr, &gossh.ClientConfig{
			User: h.Account, Auth: []gossh.AuthMethod{gossh.PublicKeys(bad.Signer)},
			HostKeyCallback: gossh.FixedHostKey(h.HostKey),
		})
		if err == nil {
			c.Close()
			t.Fatal("a key that is not authorized logged in")
		}
	}
	// An operator's request is answered once every connect queued before it was accepted.
	cc, err := hostproto.DialLocalControl(testContext(t), socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cc.Status(testContext(t), []string{newID(t)}); err != nil {
		t.Fatalf("an operator's status request during the flood: %v", err)
	}
	cc.Close()
	release()

	grew := len(h.Logs()) - before
	supGrew := len(readFile(supervisorLog)) - supervisorBefore
	t.Logf("%d refused connects and %d refused logins added %d bytes to the hostagent's log, %d supervisor connects %d bytes to the supervisor's",
		connects, logins, grew, supConnected, supGrew)
	if grew > maxFloodLogBytes {
		t.Errorf("the hostagent's log grew by %d bytes; want at most %d", grew, maxFloodLogBytes)
	}
	if supGrew > maxFloodLogBytes {
		t.Errorf("the supervisor's log grew by %d bytes; want at most %d", supGrew, maxFloodLogBytes)
	}

	h.Stop(t)
	logs := h.Logs()
	if n := refusalTotal(logs, "control_socket", "busy"); n != connects {
		t.Errorf("the control socket's summary counts %d refusals; want %d", n, connects)
	}
	if n := refusalTotal(logs, "ssh", "public_key"); n != logins {
		t.Errorf("the SSH summary counts %d refused keys; want %d", n, logins)
	}
}

// TestRefusalFloodOfTheBastion: an unprivileged user no actor names floods the MCP socket
// (shared with a local actor's uid, so it can connect), and unauthenticated requests flood
// the HTTP endpoint. The bastion's log grows by a bounded number of bytes and
// postern_refusals_total counts every refusal.
func TestRefusalFloodOfTheBastion(t *testing.T) {
	const connects, requests = 20000, 2000
	agentUser := unixuser.New(t, "hardenflood-a")
	stranger := unixuser.New(t, "hardenflood-s")
	socket := filepath.Join(unixuser.SharedDir(t, "hardenflood-"), "mcp.sock")
	b := startBastion(t,
		fmt.Sprintf("socket = %q", socket),
		fmt.Sprintf("[[actors]]\nname = \"hardenflood-local\"\nuid = %d", agentUser.UID),
	)
	before := len(b.Logs())

	connected, failed, _ := flood(t, stranger, 0, connects, socket)
	if connected != connects {
		t.Fatalf("the MCP socket took %d of %d connects (%d failed)", connected, connects, failed)
	}
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	for range requests {
		resp, err := http.Post(b.URL, "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a request without a token: %s; want 401", resp.Status)
		}
	}
	testutil.WaitFor(t, "every refusal counted", func() bool {
		return refusals(t, b, "mcp_socket", "uid_not_allowed") == connects && refusals(t, b, "http", "unauthenticated") == requests
	})
	grew := len(b.Logs()) - before
	t.Logf("%d refused connects and %d refused requests added %d bytes to the bastion's log", connects, requests, grew)
	if grew > maxFloodLogBytes {
		t.Errorf("the bastion's log grew by %d bytes; want at most %d", grew, maxFloodLogBytes)
	}
}

// refusalTotal is the total of the last refusal summary of where and reason in logs.
func refusalTotal(logs, where, reason string) int {
	re := regexp.MustCompile(`where=` + where + ` reason=` + reason + ` not_logged=\d+ total=(\d+)`)
	m := re.FindAllStringSubmatch(logs, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}
