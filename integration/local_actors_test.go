package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// TestLocalActorByUID: a `[[actors]] uid = N` actor reaches the bastion through the real MCP
// socket — `postern mcp` run as that user — and is resolved to its actor; a user no actor
// names is closed at accept, and the refusal is logged.
func TestLocalActorByUID(t *testing.T) {
	agentUser := unixuser.New(t, "bastionhard-l")
	stranger := unixuser.New(t, "bastionhard-x")
	target := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{})
	pluginPath, sum := harness.HTTPPlugin(t)
	socket := filepath.Join(unixuser.SharedDir(t, "bastionhard-"), "mcp.sock")
	b := harness.NewBastion(t, testutil.NewSSHKey(t),
		fmt.Sprintf("socket = %q", socket),
		fmt.Sprintf("[http_plugin]\npath = %q\nsha256 = %q", pluginPath, sum),
		fmt.Sprintf("[[endpoints]]\nname = \"echo\"\nbase_url = %q\nmethods = [\"GET\"]\npath_prefixes = [\"/v1\"]\nclass = \"read_only\"", target.URL),
		fmt.Sprintf("[[actors]]\nname = \"bastionhard-local\"\nuid = %d\nendpoints = [\"echo\"]", agentUser.UID),
	)
	b.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bastion log:\n%s", b.Logs())
		}
	})
	bridge := unixuser.SharedBinary(t, harness.Binary(t, "postern"))
	connectAs := func(ctx context.Context, u unixuser.User) (*mcp.ClientSession, error) {
		cmd := exec.Command(bridge, "mcp", "--socket", socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.Credential()}
		client := mcp.NewClient(&mcp.Implementation{Name: "bastionhard-agent", Version: "0"}, nil)
		return client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	}

	ctx := testContext(t)
	cs, err := connectAs(ctx, agentUser)
	if err != nil {
		t.Fatalf("configured uid %d: connect through %s: %v", agentUser.UID, socket, err)
	}
	defer cs.Close()
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, "http_request", map[string]any{"endpoint": "echo", "method": "GET", "path": "/v1/echo", "wait_s": 60}, &x)
	if err != nil || res.IsError {
		t.Fatalf("http_request as uid %d: %v %s", agentUser.UID, err, harness.ResultText(res))
	}
	var full api.Execution
	if _, err := harness.CallTool(ctx, cs, "execution_status", map[string]any{"execution_id": x.ExecutionID, "evidence": "full"}, &full); err != nil ||
		x.State != "completed" || !slices.Contains(full.Evidence, "actor resolved: bastionhard-local") {
		t.Fatalf("execution = %+v (full evidence %q, %v); want completed, by the actor configured for uid %d", x, full.Evidence, err, agentUser.UID)
	}

	// The stranger's bridge reaches the socket (0666), and the bastion closes the connection
	// before reading anything: the bridge cannot even initialize.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	scs, err := connectAs(sctx, stranger)
	if err == nil {
		scs.Close()
		t.Fatalf("unconfigured uid %d connected", stranger.UID)
	}
	testutil.WaitFor(t, "the refusal in the bastion's log", func() bool {
		logs := b.Logs()
		return strings.Contains(logs, "local connection refused") && strings.Contains(logs, "uid="+strconv.Itoa(stranger.UID))
	})
}
