package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/engine"
	"github.com/postern-dev/postern/bastion/operatorapi"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/unixpath"
	"github.com/postern-dev/postern/markers"
)

// The operator commands (executions, investigate, runs, approvals, markers, hosts, audit)
// read what the daemon owns through its operator socket (bastion/operatorapi). The journal
// has one writer, so while the daemon runs they never open its files; while it is down they
// read the files, read-only, through the same API served in this process (offlineAPI), and
// say so on stderr.

// errBastionDown: nothing serves the operator socket (no socket file, or nobody listening).
var errBastionDown = errors.New("the bastion is not running")

// bastionDownError names the socket that nobody serves, and where the discovery rule
// looked for it.
type bastionDownError struct {
	socket string
	absent bool // no socket file at all (never started, or cleaned up)
	// where is what the discovery rule chose and why ("" when the command did not use it).
	where string
}

func (e *bastionDownError) Error() string {
	what := fmt.Sprintf("nothing listening on %s", e.socket)
	if e.absent {
		what = "no socket at " + e.socket
	}
	if e.where != "" {
		what += "; " + e.where
	}
	return fmt.Sprintf("%v (%s)", errBastionDown, what)
}

func (e *bastionDownError) Unwrap() error { return errBastionDown }

// apiError is an error the operator API answered with (its OperatorError body).
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return e.Message }

// Bounds on what the operator API may send back: a page of records or one execution with
// its events and output tails is far smaller; an error body is a line.
const (
	maxJSONResponseBytes  = 64 << 20
	maxErrorResponseBytes = 64 << 10
)

// operatorTimeout bounds one JSON request; the bastion itself gives a host 30s to answer a
// markers query.
const operatorTimeout = time.Minute

// operatorClient speaks HTTP to the daemon's operator socket.
type operatorClient struct {
	socket string
	hc     *http.Client
	// offline, when set, answers in this process from the journal's files whenever no
	// daemon serves the socket.
	offline *offlineAPI
	// where is what the discovery rule chose and why, for the errors that found no daemon.
	where string
}

// offlineAPI serves the operator API from the bastion's files while the daemon is down: an
// engine opened read-only (engine.Options.ReadOnly) behind the same handler the daemon
// serves, so every read command answers the same way in every state of the system. It never
// reconciles, dispatches or writes; decisions are refused with what to do.
type offlineAPI struct {
	cfg   config.Config
	note  io.Writer
	noted bool
}

// serve answers req from the files. Each request opens the journal and closes it again, so
// a daemon that starts meanwhile is not kept from it for longer than one answer.
func (o *offlineAPI) serve(req *http.Request, down error) (*http.Response, error) {
	if _, err := os.Stat(o.cfg.StateDir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w, and no bastion ever ran there (%s does not exist): start one with `postern up` (or `postern serve`), or point at another with --state-dir, --config or %s",
			down, o.cfg.StateDir, envStateDir)
	}
	quiet := slog.New(slog.DiscardHandler)
	e, err := engine.Open(engine.Options{Config: o.cfg, Logger: quiet, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("%w; nor could its files be read: %v", down, err)
	}
	defer e.Close()
	if !o.noted {
		o.noted = true
		fmt.Fprintf(o.note, "note: the bastion is not running; reading its journal files in %s (nothing is reconciled, sent or written)\n", o.cfg.StateDir)
	}
	rec := httptest.NewRecorder()
	operatorapi.Handler(e, quiet).ServeHTTP(rec, req)
	return rec.Result(), nil
}

// readFromFiles reports whether an answer came from the journal's files (the daemon was
// down), so nothing is carrying the executions in flight.
func (c *operatorClient) readFromFiles() bool { return c.offline != nil && c.offline.noted }

func newOperatorClient(socket string) *operatorClient {
	c := &operatorClient{socket: socket}
	c.hc = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if err := unixpath.Check(socket, "state_dir (or --state-dir)"); err != nil {
				return nil, fmt.Errorf("operator socket: %w", err)
			}
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", socket)
			switch {
			case err == nil:
				return conn, nil
			case errors.Is(err, fs.ErrNotExist):
				return nil, &bastionDownError{socket: socket, absent: true, where: c.where}
			case errors.Is(err, syscall.ECONNREFUSED):
				return nil, &bastionDownError{socket: socket, where: c.where}
			case errors.Is(err, fs.ErrPermission):
				return nil, fmt.Errorf("operator socket %s: permission denied (it admits only the bastion's user and root)", socket)
			}
			return nil, fmt.Errorf("operator socket %s: %w", socket, err)
		},
		DisableKeepAlives: true,
	}}
	return c
}

// do sends GET path?query and returns the response when it is 200 OK; any other status is
// decoded into an *apiError.
func (c *operatorClient) do(ctx context.Context, path string, query url.Values) (*http.Response, error) {
	return c.send(ctx, http.MethodGet, path, query, nil)
}

// postJSON sends body as JSON to path and decodes the answer into out.
func (c *operatorClient) postJSON(ctx context.Context, path string, body, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return c.exchangeJSON(ctx, http.MethodPost, path, nil, raw, out)
}

// getJSON decodes the JSON answer to GET path?query into out.
func (c *operatorClient) getJSON(ctx context.Context, path string, query url.Values, out any) error {
	return c.exchangeJSON(ctx, http.MethodGet, path, query, nil, out)
}

// exchangeJSON sends one request (see send) within operatorTimeout and decodes its JSON
// answer into out.
func (c *operatorClient) exchangeJSON(ctx context.Context, method, path string, query url.Values, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, operatorTimeout)
	defer cancel()
	resp, err := c.send(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJSONResponseBytes)).Decode(out); err != nil {
		return fmt.Errorf("operator API %s: decode answer: %w", path, err)
	}
	return nil
}

// send is one request to the operator API; see do.
func (c *operatorClient) send(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Response, error) {
	u := "http://postern" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	// The dialer's errors say everything; the URL wrapper would only add noise.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, errBastionDown) && c.offline != nil {
		if req.GetBody != nil {
			req.Body, _ = req.GetBody() // the body as it was: the failed dial may have read it
		}
		resp, err = c.offline.serve(req, err)
	}
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorResponseBytes))
	var oe api.OperatorError
	if json.Unmarshal(answer, &oe) == nil && oe.Error != "" {
		return nil, &apiError{Status: resp.StatusCode, Code: oe.Code, Message: oe.Error}
	}
	return nil, &apiError{Status: resp.StatusCode, Message: fmt.Sprintf("operator API %s: %s: %s",
		path, resp.Status, cli.Printable(cli.Truncate(strings.TrimSpace(string(answer)), 200)))}
}

// operatorIO is where an operator command reads and writes.
type operatorIO struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// flagSet is prog.FlagSet with the flags that locate the bastion (--state-dir, --config)
// registered in the returned locator.
func (o operatorIO) flagSet(usage string) (*flag.FlagSet, *locator) {
	fs := prog.FlagSet(usage, o.stderr)
	flagsUsage := fs.Usage
	fs.Usage = func() { flagsUsage(); fmt.Fprint(fs.Output(), "\n"+ruleHelp()) }
	loc := &locator{}
	loc.register(fs)
	return fs, loc
}

// operator is the operator API of the bastion the locator names: the daemon's, or while it
// is down its files' (read-only, said on stderr).
func (l *locator) operator(stderr io.Writer) (*operatorClient, error) {
	cfg, err := l.config()
	if err != nil {
		return nil, err
	}
	op := newOperatorClient(cfg.OperatorSocketPath())
	op.offline = &offlineAPI{cfg: cfg, note: stderr}
	op.where = l.where()
	return op, nil
}

// parseExecutionID parses flags and the one positional argument, an execution id.
func parseExecutionID(fs *flag.FlagSet, args []string, stderr io.Writer) (string, error) {
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return "", err
	}
	if !markers.ValidExecutionID(pos[0]) {
		return "", prog.UsageErrorf(stderr, "%q is not an execution id (ex_ and a 26-character ULID)", cli.Printable(pos[0]))
	}
	return pos[0], nil
}

// parseJournalID is parseExecutionID for the commands that take a fleet run (fr_…) as well:
// both are records of the bastion's journal.
func parseJournalID(fs *flag.FlagSet, args []string, stderr io.Writer) (string, error) {
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return "", err
	}
	if !markers.ValidJournalID(pos[0]) {
		return "", prog.UsageErrorf(stderr, "%q is not an execution id or a fleet run id (ex_ or fr_, and a 26-character ULID)", cli.Printable(pos[0]))
	}
	return pos[0], nil
}

// parseFleetRunID parses flags and the one positional argument, a fleet run id.
func parseFleetRunID(fs *flag.FlagSet, args []string, stderr io.Writer) (string, error) {
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return "", err
	}
	if !markers.ValidFleetRunID(pos[0]) {
		return "", prog.UsageErrorf(stderr, "%q is not a fleet run id (fr_ and a 26-character ULID)", cli.Printable(pos[0]))
	}
	return pos[0], nil
}
