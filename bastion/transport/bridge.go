package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrDaemonNotRunning is returned by Bridge when nothing listens on the socket.
var ErrDaemonNotRunning = errors.New("postern daemon is not running")

// Bounds of the stdio bridge.
const (
	// MaxBridgeLineBytes bounds one message from the stdio client; a longer line is answered
	// with a JSON-RPC parse error (-32700) and skipped.
	MaxBridgeLineBytes = 4 << 20
	// maxBridgeResponseBytes bounds one response body or SSE event from the daemon.
	maxBridgeResponseBytes = 16 << 20
	// maxBridgeErrorBodyBytes bounds how much of a non-2xx body is read for its message.
	maxBridgeErrorBodyBytes = 64 << 10
	// maxBridgeInFlight bounds concurrent requests; reading stdin waits when it is reached.
	maxBridgeInFlight = 64
)

// Approvals in the client: the daemon's endpoints are stateless and cannot send a request to
// a client, so the bridge — the client's own stdio session — asks for them (elicitation).
const (
	// BridgeElicitationHeader ("form") on a tools/call says the bridge's client declared the
	// elicitation capability, so the daemon may offer an approval to ask for.
	BridgeElicitationHeader = "Postern-Bridge-Elicitation"
	// MetaApprovalOffer is the _meta key of a tools/call result that carries an offer:
	// {"execution_id", "message", "token"}. The bridge removes it before the client sees the result.
	MetaApprovalOffer = "dev.postern/approval-offer"
	// MethodApproval is the daemon's JSON-RPC method the bridge sends the user's answer to:
	// params {"execution_id", "decision": "approve"|"deny", "note", "token"} (the offer's). It is not a tool, so a
	// model cannot call it through its client, and the bridge refuses it from its client.
	MethodApproval = "postern/approval"
)

// JSON-RPC error codes the bridge produces.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
	codeBridgeError    = -32000 // implementation-defined server error: the daemon did not answer
)

// MCP HTTP header names and the _meta key the daemon validates (go-sdk, protocol 2026-07-28).
const (
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerMethod          = "Mcp-Method"
	headerName            = "Mcp-Name"
	metaProtocolVersion   = "io.modelcontextprotocol/protocolVersion"
)

// Bridge forwards MCP JSON-RPC messages between in/out (newline-delimited, as MCP stdio
// clients speak) and the daemon's unix socket (Streamable HTTP, POST urlPath), until in
// reaches EOF or ctx ends. Requests are forwarded concurrently; messages written to out are
// serialized, one per line. A call that gets no answer from the daemon (HTTP error, lost
// connection, truncated stream) is answered with a JSON-RPC error for its id, so the client
// is never left hanging. notifications/cancelled is forwarded to the daemon before the next
// message is read (so a cancel the daemon revokes a delivery for is recorded before a
// re-issued call arrives), then cancels the matching in-flight HTTP request. Every request
// names this process's parent, the agent, in BridgeParentHeader (when /proc shows it); the
// daemon checks it against the kernel. At EOF it waits for in-flight requests; when ctx ends it cancels them
// and closes in if it is an io.Closer, so a blocked read returns.
func Bridge(ctx context.Context, socketPath, urlPath string, in io.Reader, out io.Writer) error {
	if !strings.HasPrefix(urlPath, "/") {
		return fmt.Errorf("transport: bridge: url path %q must start with /", urlPath)
	}
	dialer := &net.Dialer{}
	probe, err := dialer.DialContext(ctx, "unix", socketPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("transport: bridge: %w (nothing listens on %s; start it with `postern up`): %w", ErrDaemonNotRunning, socketPath, err)
		}
		return fmt.Errorf("transport: bridge: connecting to %s: %w", socketPath, err)
	}
	probe.Close()
	// A parent that cannot be named (outside this PID namespace) leaves the bridge its own
	// agent: it still works, its scope is this process (cmd/postern warns).
	parent, _ := BridgeParentClaim()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	httpTransport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", socketPath)
		},
		DisableCompression: true,
		MaxIdleConns:       maxBridgeInFlight,
	}
	defer httpTransport.CloseIdleConnections()
	b := &bridge{
		socketPath: socketPath,
		parent:     parent,
		url:        "http://localhost" + urlPath,
		client:     &http.Client{Transport: httpTransport},
		out:        out,
		fail:       cancel,
		inFlight:   map[string]context.CancelFunc{},
		asked:      map[string]chan envelope{},
	}

	var watcher sync.WaitGroup
	readDone := make(chan struct{})
	if closer, ok := in.(io.Closer); ok {
		watcher.Go(func() {
			select {
			case <-ctx.Done():
				closer.Close()
			case <-readDone:
			}
		})
	}
	readErr := b.readLoop(ctx, bufio.NewReaderSize(in, 64<<10))
	close(readDone)
	b.requests.Wait()
	watcher.Wait()

	if ctx.Err() != nil {
		return fmt.Errorf("transport: bridge: %w", context.Cause(ctx))
	}
	if readErr != nil {
		return fmt.Errorf("transport: bridge: reading stdin: %w", readErr)
	}
	return nil
}

type bridge struct {
	socketPath string
	parent     string // the BridgeParentHeader value ("" if the parent cannot be named)
	url        string
	client     *http.Client
	fail       context.CancelCauseFunc // ends the bridge, e.g. when out is gone
	requests   sync.WaitGroup          // one per forwarded message

	outMu sync.Mutex // serializes writes to out
	out   io.Writer

	mu sync.Mutex // guards the fields below
	// protocolVersion is the version negotiated by initialize, sent as Mcp-Protocol-Version
	// on requests that do not carry their own (legacy protocol versions).
	protocolVersion string
	// inFlight cancels forwarded calls by their JSON-RPC id (compact JSON).
	inFlight map[string]context.CancelFunc
	// elicitation: the client declared the elicitation capability (form) in initialize.
	elicitation bool
	// asked holds the bridge's own requests to the client (elicitation/create) by id,
	// waiting for the client's response.
	asked    map[string]chan envelope
	askedSeq int
}

// envelope is the part of a JSON-RPC message the bridge routes on.
type envelope struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// idKey is the canonical form of a JSON-RPC id, "" for none (absent or null).
func idKey(raw json.RawMessage) string {
	var buf bytes.Buffer
	if len(raw) == 0 || json.Compact(&buf, raw) != nil || buf.String() == "null" {
		return ""
	}
	return buf.String()
}

func (e *envelope) isCall() bool { return e.Method != "" && idKey(e.ID) != "" }

func (b *bridge) readLoop(ctx context.Context, r *bufio.Reader) error {
	slots := make(chan struct{}, maxBridgeInFlight)
	for {
		line, tooLong, err := readLine(r, MaxBridgeLineBytes)
		if tooLong {
			b.replyError(nil, codeParseError, fmt.Sprintf("message longer than %d bytes", MaxBridgeLineBytes))
		} else if line = bytes.TrimSpace(line); len(line) > 0 {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
			b.dispatch(ctx, line, func() { <-slots })
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil // in was closed because ctx ended
			}
			return err
		}
	}
}

// dispatch routes one client message; release frees its in-flight slot.
func (b *bridge) dispatch(ctx context.Context, line []byte, release func()) {
	var env envelope
	if line[0] != '{' {
		release()
		if line[0] == '[' && json.Valid(line) {
			b.replyError(nil, codeInvalidRequest, "JSON-RPC batches are not supported")
			return
		}
		b.replyError(nil, codeParseError, "message is not a JSON object")
		return
	}
	if err := json.Unmarshal(line, &env); err != nil {
		release()
		b.replyError(nil, codeParseError, "message is not valid JSON")
		return
	}
	if env.Method == "" && b.answerAsked(&env) {
		release()
		return
	}
	if env.Method == MethodApproval {
		// The user's decision reaches the daemon only as the bridge's own elicitation got
		// it: a client sending it itself would approve its own execution.
		release()
		if env.isCall() {
			b.replyError(env.ID, codeMethodNotFound, MethodApproval+" is the bridge's own; approvals are asked of the user by elicitation")
		}
		return
	}
	if env.Method == "initialize" {
		b.learnElicitation(env.Params)
	}
	if env.Method == "notifications/cancelled" {
		defer release()
		b.forwardCancel(ctx, &env, line)
		b.cancelInFlight(env.Params)
		return
	}
	reqCtx, cancelReq := context.WithCancel(ctx)
	id := idKey(env.ID)
	if env.isCall() {
		b.mu.Lock()
		if _, dup := b.inFlight[id]; dup {
			b.mu.Unlock()
			cancelReq()
			release()
			b.replyError(env.ID, codeInvalidRequest, "a request with this id is already in flight")
			return
		}
		b.inFlight[id] = cancelReq
		b.mu.Unlock()
	}
	b.requests.Go(func() {
		defer release()
		defer cancelReq()
		b.forward(reqCtx, &env, line)
		if env.isCall() {
			b.mu.Lock()
			delete(b.inFlight, id)
			b.mu.Unlock()
		}
	})
}

// cancelForwardTimeout bounds how long reading stdin waits for the daemon to take a cancel.
const cancelForwardTimeout = 10 * time.Second

// forwardCancel tells the daemon that the client abandoned a request, waiting for its answer:
// a result the daemon already counted as delivered is revoked before anything else is sent.
func (b *bridge) forwardCancel(ctx context.Context, env *envelope, line []byte) {
	ctx, cancel := context.WithTimeout(ctx, cancelForwardTimeout)
	defer cancel()
	_ = b.roundTrip(ctx, env, line, func([]byte) {}) // a notification has no answer to relay
}

func (b *bridge) cancelInFlight(params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return
	}
	b.mu.Lock()
	cancel := b.inFlight[idKey(p.RequestID)]
	b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// forward POSTs one message and relays what comes back. For a call, exactly one response
// for its id reaches out unless the client cancelled it. A tools/call result that carries an
// approval offer is held: the bridge asks the client's user (askApproval), and once the
// daemon has journaled the answer it sends the call again — a retry of the same intent joins
// the same execution, now approved or rejected — and relays that answer instead; if the user
// was not asked or did not answer, the held result goes out as it was (without the offer).
func (b *bridge) forward(ctx context.Context, env *envelope, line []byte) {
	answered := false
	var held []byte
	var offer approvalOffer
	id := idKey(env.ID)
	relay := func(msg []byte) {
		answers, o, stripped, hasOffer := b.inspect(env, id, msg)
		answered = answered || answers
		if hasOffer {
			held, offer = stripped, o
			return
		}
		b.write(msg)
	}
	err := b.roundTrip(ctx, env, line, relay)
	if held != nil {
		if b.askApproval(ctx, offer) {
			b.forward(ctx, env, line)
			return
		}
		if ctx.Err() == nil {
			b.write(held)
		}
		return
	}
	if !env.isCall() || answered || ctx.Err() != nil {
		return
	}
	if err == nil {
		err = errors.New("the daemon's response ended without a result")
	}
	b.replyError(env.ID, codeBridgeError, "postern bridge: "+err.Error())
}

// inspect reads a message the daemon sent while it answers env (whose id is id): whether it
// is env's answer, and for a tools/call answer that carries an approval offer, the offer and
// the answer without it (hasOffer). Every answer passes here, so it decodes only the
// message's id and method, and looks further only for what it needs: initialize's protocol
// version; an offer only when its key is in the message at all (the daemon writes keys as
// they are: encoding/json escapes none of its characters).
func (b *bridge) inspect(env *envelope, id string, msg []byte) (answers bool, offer approvalOffer, stripped []byte, hasOffer bool) {
	var got struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(msg, &got) != nil || got.Method != "" || idKey(got.ID) != id {
		return false, approvalOffer{}, nil, false
	}
	if env.Method == "initialize" {
		b.learnProtocolVersion(msg)
	}
	if env.Method == "tools/call" && bytes.Contains(msg, approvalOfferKey) {
		offer, stripped, hasOffer = takeOffer(msg)
	}
	return true, offer, stripped, hasOffer
}

// approvalOfferKey is MetaApprovalOffer as a JSON object key.
var approvalOfferKey = []byte(`"` + MetaApprovalOffer + `"`)

func (b *bridge) roundTrip(ctx context.Context, env *envelope, line []byte, relay func([]byte)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(line))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if b.parent != "" {
		req.Header.Set(BridgeParentHeader, b.parent)
	}
	b.setMCPHeaders(req.Header, env)
	resp, err := b.client.Do(req)
	if err != nil {
		return fmt.Errorf("daemon at %s unreachable: %w", b.socketPath, err)
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return b.relayHTTPError(env, resp)
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusNoContent:
		return nil
	case mediaType == "application/json":
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxBridgeResponseBytes+1))
		if err != nil {
			return fmt.Errorf("reading response: %w", err)
		}
		if len(body) > maxBridgeResponseBytes {
			return fmt.Errorf("response larger than %d bytes", maxBridgeResponseBytes)
		}
		msg, err := compactJSON(body)
		if err != nil {
			return fmt.Errorf("response: %w", err)
		}
		relay(msg)
		return nil
	case mediaType == "text/event-stream":
		return readSSE(resp.Body, maxBridgeResponseBytes, func(data []byte) {
			if msg, err := compactJSON(data); err == nil {
				relay(msg)
			}
		})
	default:
		return fmt.Errorf("unexpected response content type %q", mediaType)
	}
}

// relayHTTPError answers a call refused by the daemon, keeping the daemon's JSON-RPC error
// when it sent one (go-sdk does for protocol errors).
func (b *bridge) relayHTTPError(env *envelope, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBridgeErrorBodyBytes))
	if !env.isCall() {
		return nil
	}
	var daemonErr envelope
	if json.Unmarshal(body, &daemonErr) == nil && daemonErr.Error != nil {
		b.writeError(env.ID, *daemonErr.Error)
		return nil
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	return fmt.Errorf("daemon answered HTTP %d: %s", resp.StatusCode, msg)
}

// setMCPHeaders sets the headers go-sdk's Streamable HTTP server checks against the body:
// the protocol version (the request's own _meta value, else the one initialize negotiated),
// and from 2026-07-28 the method and the tool/prompt/resource name.
func (b *bridge) setMCPHeaders(h http.Header, env *envelope) {
	if env.Method == "" {
		return
	}
	var params struct {
		Name   string                     `json:"name"`
		URI    string                     `json:"uri"`
		TaskID string                     `json:"taskId"`
		Meta   map[string]json.RawMessage `json:"_meta"`
	}
	_ = json.Unmarshal(env.Params, &params) // absent or non-object params carry no headers
	var version string
	if raw, ok := params.Meta[metaProtocolVersion]; ok {
		_ = json.Unmarshal(raw, &version)
	}
	if version == "" {
		b.mu.Lock()
		version = b.protocolVersion
		b.mu.Unlock()
	}
	if version != "" {
		h.Set(headerProtocolVersion, version)
	}
	h.Set(headerMethod, env.Method)
	switch env.Method {
	case "tools/call", "prompts/get":
		if params.Name != "" {
			h.Set(headerName, params.Name)
		}
		b.mu.Lock()
		elicitation := b.elicitation
		b.mu.Unlock()
		if elicitation && env.Method == "tools/call" {
			h.Set(BridgeElicitationHeader, "form")
		}
	case "resources/read":
		if params.URI != "" {
			h.Set(headerName, params.URI)
		}
	case "tasks/get", "tasks/update", "tasks/cancel": // the tasks extension routes by task id
		if params.TaskID != "" {
			h.Set(headerName, params.TaskID)
		}
	}
}

func (b *bridge) learnProtocolVersion(answer []byte) {
	var resp struct {
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if json.Unmarshal(answer, &resp) == nil && resp.Result.ProtocolVersion != "" {
		b.mu.Lock()
		b.protocolVersion = resp.Result.ProtocolVersion
		b.mu.Unlock()
	}
}

func (b *bridge) replyError(id json.RawMessage, code int, message string) {
	b.writeError(id, rpcError{Code: code, Message: message})
}

func (b *bridge) writeError(id json.RawMessage, e rpcError) {
	if idKey(id) == "" {
		id = json.RawMessage("null")
	}
	msg, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, e})
	if err != nil {
		return // unreachable: the id was parsed from JSON
	}
	b.write(msg)
}

// write sends one message as one line. A failed write means the client is gone: the bridge ends.
func (b *bridge) write(msg []byte) {
	b.outMu.Lock()
	defer b.outMu.Unlock()
	if _, err := b.out.Write(append(msg, '\n')); err != nil {
		b.fail(fmt.Errorf("writing stdout: %w", err))
	}
}

// compactJSON returns data as one line of valid JSON (JSON strings cannot hold raw newlines):
// data itself when it is one line already, as the daemon's answers are.
func compactJSON(data []byte) ([]byte, error) {
	if bytes.IndexAny(data, "\r\n") < 0 && json.Valid(data) {
		return data, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	return buf.Bytes(), nil
}

// readLine reads one '\n'-terminated line of at most max bytes (terminator excluded). A longer
// line is consumed to its end and reported as tooLong without being kept in memory.
func readLine(r *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLong {
			content := len(line) + len(bytes.TrimRight(chunk, "\r\n"))
			if content > max {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, tooLong, err
	}
}

// readSSE calls emit with the data of each "message" event of a text/event-stream body,
// until the body ends. An event larger than max ends the stream with an error.
func readSSE(body io.Reader, max int, emit func(data []byte)) error {
	r := bufio.NewReaderSize(body, 64<<10)
	var data []byte
	var event string
	hasData := false
	for {
		line, tooLong, err := readLine(r, max)
		if tooLong {
			return fmt.Errorf("event larger than %d bytes", max)
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if err == nil { // a blank line ends an event
				if hasData && (event == "" || event == "message") {
					emit(data)
				}
				data, event, hasData = nil, "", false
			}
		case line[0] == ':': // comment
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "data":
				if hasData {
					data = append(data, '\n')
				}
				if len(data)+len(value) > max {
					return fmt.Errorf("event larger than %d bytes", max)
				}
				data, hasData = append(data, value...), true
			case "event":
				event = string(value)
			}
		}
		if errors.Is(err, io.EOF) {
			return nil // an unterminated last event is discarded, as the SSE spec says
		}
		if err != nil {
			return fmt.Errorf("reading event stream: %w", err)
		}
	}
}
