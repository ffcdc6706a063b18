package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// Client faults of the soak: the ways the clients agents really use fail, which the soak's
// own well-behaved client never did. Each one gives up on a call whose command may already
// have run, and the call is then issued again:
//
//   - client_kill: the client is a separate process (the test binary re-executed as a go-sdk
//     client) SIGKILLed while it waits; the kernel, not the client, ends its connection;
//   - sdk_abort: like the TypeScript SDK's timeout/AbortSignal, the client sends
//     notifications/cancelled for the request in a POST of its own while the request itself
//     goes on and its response is read to the end and dropped;
//   - bridge_restart: the call goes through the stdio bridge (`postern mcp`), the bridge
//     process is SIGKILLed mid-call, and the call is re-issued through a bridge started
//     from a copy of the binary at another path (an in-place upgrade, or a daemon run with
//     `go run` and a bridge that was built).
const (
	faultClientKill    = "client_kill"
	faultSDKAbort      = "sdk_abort"
	faultBridgeRestart = "bridge_restart"
)

const (
	// soakClientKillChance and soakAbortChance are the chances that a call's first attempt
	// is made by a client that is killed, or that aborts.
	soakClientKillChance = 0.05
	soakAbortChance      = 0.06
	// soakBridgedChance is the chance that a call is made through the stdio bridge (as the
	// local actor, in this process's run); soakBridgeKillChance that one of its attempts
	// loses its bridge.
	soakBridgedChance    = 0.08
	soakBridgeKillChance = 0.5
)

// roleSoakClient is the role of the re-executed test binary that makes one call as an
// agent process of its own (see runSoakClientProcess).
const roleSoakClient = "soak-client"

// Environment of a soak client process.
const (
	envSoakURL   = "POSTERN_SOAK_URL"
	envSoakToken = "POSTERN_SOAK_TOKEN"
	envSoakRun   = "POSTERN_SOAK_RUN"
	envSoakTool  = "POSTERN_SOAK_TOOL"
	envSoakArgs  = "POSTERN_SOAK_ARGS"
)

// runSoakClientProcess makes the call its environment names and prints the execution it
// got as one JSON line: what this client saw, if it lived to see it.
func runSoakClientProcess() int {
	var args map[string]any
	if err := json.Unmarshal([]byte(os.Getenv(envSoakArgs)), &args); err != nil {
		fmt.Fprintln(os.Stderr, "soak client:", err)
		return 2
	}
	hc := harness.TokenHTTPClient(os.Getenv(envSoakToken), runHeader(os.Getenv(envSoakRun)), nil)
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "postern-soak-process", Version: "0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: os.Getenv(envSoakURL), HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak client:", err)
		return 1
	}
	defer cs.Close()
	var x api.Execution
	res, err := harness.CallTool(ctx, cs, os.Getenv(envSoakTool), args, &x)
	if err != nil || res.StructuredContent == nil {
		fmt.Fprintln(os.Stderr, "soak client: no execution:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(x); err != nil {
		return 1
	}
	return 0
}

// killedClient makes the call from a client process and SIGKILLs it after a random delay
// (commands take 20–300 ms, so it dies before, during or after the command ran). What the
// process printed before it died is what this agent saw.
func (cl *soakClient) killedClient(ctx context.Context, c *soakCall, rng *rand.Rand) {
	o := cl.s.obs[c.tag]
	args, err := json.Marshal(c.args)
	if err != nil {
		o.failed(err)
		return
	}
	cmd, err := testutil.ReexecCommand(roleSoakClient,
		envSoakURL+"="+cl.s.fleet.bastion.URL, envSoakToken+"="+cl.s.fleet.bastion.Tokens[cl.actor],
		envSoakRun+"="+runOf(cl.actor), envSoakTool+"="+c.tool, envSoakArgs+"="+string(args))
	if err != nil {
		o.failed(err)
		return
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		o.failed(err)
		return
	}
	o.mu.Lock()
	o.attempts++
	o.mu.Unlock()
	sleepCtx(ctx, time.Duration(20+rng.IntN(480))*time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		cl.s.faults.add(faultClientKill)
		o.mu.Lock()
		o.clientKilled = true
		o.mu.Unlock()
	}
	var x api.Execution
	if json.Unmarshal(stdout.Bytes(), &x) == nil && x.ExecutionID != "" {
		o.saw(x)
	}
}

// abortedCall makes the call as the TypeScript SDK does when its timeout fires or its
// AbortSignal is aborted: it stops waiting, sends notifications/cancelled for the request,
// and the request goes on underneath, its response read to the end and dropped.
func (cl *soakClient) abortedCall(ctx context.Context, c *soakCall, rng *rand.Rand) {
	o := cl.s.obs[c.tag]
	rt := &abortingTransport{next: cl.transport, drains: &cl.drains}
	hc := cl.s.fleet.bastion.HTTPClient(cl.actor, runHeader(runOf(cl.actor)), rt)
	client := mcp.NewClient(&mcp.Implementation{Name: "postern-soak-abort", Version: "0"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: cl.s.fleet.bastion.URL, HTTPClient: hc, MaxRetries: -1}, nil)
	cancel()
	if err != nil {
		o.failed(err)
		return
	}
	defer cs.Close()
	o.mu.Lock()
	o.attempts++
	o.mu.Unlock()
	callCtx, cancel := context.WithTimeout(ctx, time.Duration(5+rng.IntN(400))*time.Millisecond)
	var x api.Execution
	res, err := harness.CallTool(callCtx, cs, c.tool, c.args, &x)
	aborted := callCtx.Err() != nil
	cancel()
	switch {
	case err == nil && res.StructuredContent != nil && x.ExecutionID != "":
		o.saw(x)
	case aborted:
		if err := rt.cancelLastCall(ctx, hc); err != nil {
			o.failed(err)
			o.cancelLost()
			return
		}
		cl.s.faults.add(faultSDKAbort)
	case err != nil:
		o.failed(err)
	}
}

// abortingTransport carries a client's requests past the client's cancellation, as fetch
// does for the TypeScript SDK: every response is read to its end in the background (drains)
// even after the client stopped reading. It remembers the last tools/call so that it can be
// cancelled with notifications/cancelled.
type abortingTransport struct {
	next   http.RoundTripper
	drains *sync.WaitGroup

	mu       sync.Mutex // guards lastCall
	lastCall *http.Request
	lastBody []byte
}

func (a *abortingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		r.Body.Close()
	}
	var msg struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
		a.mu.Lock()
		a.lastCall, a.lastBody = r, body
		a.mu.Unlock()
	}
	detached := r.Clone(context.WithoutCancel(r.Context()))
	detached.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := a.next.RoundTrip(detached)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	stop := context.AfterFunc(r.Context(), func() { pr.CloseWithError(r.Context().Err()) })
	upstream := resp.Body
	a.drains.Go(func() {
		defer upstream.Close()
		defer stop()
		_, err := io.Copy(pw, upstream)
		pw.CloseWithError(err)
		io.Copy(io.Discard, upstream) // the client stopped reading: drop the rest
	})
	resp.Body = pr
	return resp, nil
}

// cancelLastCall posts notifications/cancelled for the last tools/call, with its headers
// and protocol metadata, as a separate request.
func (a *abortingTransport) cancelLastCall(ctx context.Context, hc *http.Client) error {
	a.mu.Lock()
	call, body := a.lastCall, a.lastBody
	a.mu.Unlock()
	if call == nil {
		return fmt.Errorf("soak: no tools/call to cancel")
	}
	var req struct {
		ID     json.RawMessage `json:"id"`
		Params struct {
			Meta map[string]any `json:"_meta,omitempty"`
		} `json:"params"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return err
	}
	params := map[string]any{"requestId": req.ID, "reason": "The operation was aborted due to timeout"}
	if req.Params.Meta != nil {
		params["_meta"] = req.Params.Meta
	}
	note, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
	if err != nil {
		return err
	}
	post, err := http.NewRequestWithContext(ctx, http.MethodPost, call.URL.String(), bytes.NewReader(note))
	if err != nil {
		return err
	}
	for k, v := range call.Header {
		post.Header[k] = v
	}
	post.Header.Set("Mcp-Method", "notifications/cancelled")
	post.Header.Del("Mcp-Name")
	resp, err := hc.Do(post)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("soak: notifications/cancelled answered %s", resp.Status)
	}
	return nil
}

// connectBridge opens a session through a new stdio bridge process, started from one of
// the two copies of the postern binary (alternating, so a re-issue crosses binaries). The
// bridge's parent, this test process, is the agent: every bridged call has its run.
func (cl *soakClient) connectBridge(ctx context.Context, attempt int) (*mcp.ClientSession, *exec.Cmd, error) {
	bridge := exec.Command(cl.s.bridgeBins[attempt%len(cl.s.bridgeBins)], "mcp", "--socket", cl.s.fleet.bastion.Socket)
	client := mcp.NewClient(&mcp.Implementation{Name: "postern-soak-bridge", Version: "0"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cs, err := client.Connect(cctx, &mcp.CommandTransport{Command: bridge}, nil)
	if err != nil {
		return nil, nil, err
	}
	return cs, bridge, nil
}

// killBridgeLater SIGKILLs the bridge after a random delay unless stop is called first; it
// reports whether it killed it.
func killBridgeLater(bridge *exec.Cmd, rng *rand.Rand, soon bool) (stop func() bool) {
	var killed bool
	var mu sync.Mutex
	delay := time.Duration(5+rng.IntN(400)) * time.Millisecond
	if soon { // owed: killed before even a fast call can end
		delay = time.Duration(1+rng.IntN(3)) * time.Millisecond
	}
	timer := time.AfterFunc(delay, func() {
		mu.Lock()
		defer mu.Unlock()
		killed = bridge.Process.Signal(syscall.SIGKILL) == nil
	})
	return func() bool {
		timer.Stop()
		mu.Lock()
		defer mu.Unlock()
		return killed
	}
}

// copiesOf copies the executable bin to n new paths, each in a directory of its own.
func copiesOf(t *testing.T, bin string, n int) []string {
	t.Helper()
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := range n {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("postern-copy-%d", i))
		if err := os.WriteFile(path, data, 0o755); err != nil {
			t.Fatal(err)
		}
		out = append(out, path)
	}
	return out
}
