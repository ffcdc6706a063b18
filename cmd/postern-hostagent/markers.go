package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostagent/supervisor"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/locate"
	"github.com/postern-dev/postern/markers"
)

// errVerifyFailed: the log did not verify (the report says where and why).
var errVerifyFailed = errors.New("verification failed")

// MarkersCommand lets operators on the host read markers: through the agent's control socket
// while it runs, straight from the store (read-only) while it is down.
type MarkersCommand struct {
	Stdout, Stderr io.Writer
}

const markersUsage = `usage: postern-hostagent markers SUBCOMMAND [flags]

subcommands:
  list [--state S] [--since T] [--until T] [--operation-key K] [--limit N] [--cursor C] [--json]
  show ID [--json]          the marker and its checkpoints
  tail ID [--follow]        the execution's output (stdout to stdout, stderr to stderr)
  verify [--require-sealed] [--json]
                            verify the marker event log against the audit verifier key

common flags: --config FILE, --socket PATH, --data-dir DIR
Without a reachable agent, list, show, tail and verify read the data dir directly.
`

func (c *MarkersCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "markers", markersUsage+"\n"+ruleHelp(),
		cli.Subcommands{"list": c.list, "show": c.show, "tail": c.tail, "verify": c.verify}, args, c.Stdout, c.Stderr)
}

// agentFlags locate the agent (by the discovery rule): its control socket and its data dir
// (for the fallback).
type agentFlags struct {
	config, socket, dataDir string
	// paths names the files in the data dir (valid after resolve).
	paths hostagent.Config
	// where is what the rule chose and why (after resolve).
	where string
}

func (f *agentFlags) register(fs *flag.FlagSet) {
	flagsUsage := fs.Usage
	fs.Usage = func() { flagsUsage(); fmt.Fprint(fs.Output(), "\n"+ruleHelp()) }
	fs.StringVar(&f.config, "config", "", "the hostagent's config file (TOML; else $"+envConfig+", "+hostagent.DefaultConfigPath+", …: see below)")
	fs.StringVar(&f.socket, "socket", "", "control socket (default the config's control_socket, <data_dir>/control.sock)")
	fs.StringVar(&f.dataDir, "data-dir", "", "data directory (else $"+envDataDir+", …); with --config, it overrides data_dir")
}

// resolve fills socket and dataDir by the discovery rule.
func (f *agentFlags) resolve() error {
	cfg, found, err := findAgent(f.config, f.dataDir)
	if err != nil {
		return err
	}
	f.found(cfg, found)
	return nil
}

// found fills socket and dataDir from what the rule found.
func (f *agentFlags) found(cfg hostagent.Config, found locate.Found) {
	f.where = found.Why()
	f.dataDir = cfg.DataDir
	if f.socket == "" {
		f.socket = cfg.ControlSocketPath()
	}
	f.paths = cfg
}

// markerSource is where markers are read from: the agent (*hostproto.ControlClient) or the
// store itself.
type markerSource interface {
	Status(ctx context.Context, ids []string) ([]*hostproto.Marker, []string, error)
	List(ctx context.Context, q hostproto.ControlListQuery) ([]*hostproto.Marker, string, error)
	Close() error
}

// open connects to the agent, or opens the store read-only when the agent is not running
// (no socket, or nobody listening on it).
func (f *agentFlags) open(ctx context.Context, stderr io.Writer) (markerSource, error) {
	agent, err := hostproto.DialLocalControl(ctx, f.socket)
	if err == nil {
		return agent, nil
	}
	if !agentDown(err) || f.dataDir == "" {
		return nil, err
	}
	if _, err := os.Stat(f.dataDir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no hostagent here: nothing listens on %s and %s does not exist (%s): pass --config FILE (the one postern-hostagent serve runs with), or set %s",
			f.socket, f.dataDir, f.where, envConfig)
	}
	store, err := markers.Open(f.paths.MarkersDir(), markers.Options{Graph: markers.HostGraph, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("agent not reachable at %s, and the store cannot be read (%s): %w", f.socket, f.where, err)
	}
	fmt.Fprintf(stderr, "note: agent not reachable at %s; reading %s directly\n", f.socket, f.dataDir)
	return storeSource{store}, nil
}

// agentDown reports whether a dial error means that no agent is serving the socket.
func agentDown(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED)
}

// storeSource reads a store opened read-only, filtering like the agent does, and answers
// with markers as the agent sends them.
type storeSource struct{ store *markers.Store }

func (s storeSource) Close() error { return s.store.Close() }

func (s storeSource) Status(_ context.Context, ids []string) ([]*hostproto.Marker, []string, error) {
	var found []*hostproto.Marker
	var missing []string
	for _, id := range ids {
		rec, err := s.store.Get(id)
		switch {
		case errors.Is(err, markers.ErrNotFound):
			missing = append(missing, id)
		case err != nil:
			return nil, nil, err
		default:
			found = append(found, hostagent.WireMarker(rec))
		}
	}
	return found, missing, nil
}

func (s storeSource) List(_ context.Context, q hostproto.ControlListQuery) ([]*hostproto.Marker, string, error) {
	mq := markers.Query{State: markers.State(q.State), Since: q.Since, Until: q.Until, Newest: q.Newest, Limit: q.Limit, Cursor: q.Cursor}
	if q.OperationKey == "" {
		page, next, err := s.store.List(mq)
		return hostagent.WireMarkers(page), next, err
	}
	limit := mq.Limit
	if limit == 0 {
		limit = 100
	}
	var out []*hostproto.Marker
	for {
		// Pages no larger than what is left, so the cursor stays exact.
		mq.Limit = limit - len(out)
		page, next, err := s.store.List(mq)
		if err != nil {
			return nil, "", err
		}
		for _, r := range page {
			if r.OperationKey == q.OperationKey {
				out = append(out, hostagent.WireMarker(r))
			}
		}
		if next == "" || len(out) >= limit {
			return out, next, nil
		}
		mq.Cursor = next
	}
}

// parseTime reads an RFC 3339 time or a duration before now ("2h").
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time or a duration such as 2h", s)
	}
	return time.Now().Add(-d), nil
}

func (c *MarkersCommand) list(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers list [flags]", c.Stderr)
	var af agentFlags
	af.register(fs)
	var q hostproto.ControlListQuery
	fs.Func("state", "only markers in this state ("+statesList()+")", func(s string) error {
		q.State = hostproto.MarkerState(s)
		if !markers.HostGraph.Has(markers.State(s)) {
			return fmt.Errorf("unknown state %q", s)
		}
		return nil
	})
	fs.Func("since", "created at or after (RFC 3339, or a duration before now such as 24h)", func(s string) (err error) {
		q.Since, err = parseTime(s)
		return err
	})
	fs.Func("until", "created before (RFC 3339, or a duration before now)", func(s string) (err error) {
		q.Until, err = parseTime(s)
		return err
	})
	fs.StringVar(&q.OperationKey, "operation-key", "", "only markers with this operation key")
	fs.IntVar(&q.Limit, "limit", 50, "page size (at most 1000)")
	fs.StringVar(&q.Cursor, "cursor", "", "continue from a previous page")
	oldest := fs.Bool("oldest-first", false, "list oldest first (default newest first)")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	q.Newest = !*oldest
	if err := af.resolve(); err != nil {
		return err
	}
	src, err := af.open(ctx, c.Stderr)
	if err != nil {
		return err
	}
	defer src.Close()
	page, next, err := src.List(ctx, q)
	if err != nil {
		return err
	}
	if *asJSON {
		if page == nil {
			page = []*hostproto.Marker{}
		}
		return cli.WriteJSON(c.Stdout, struct {
			Markers []*hostproto.Marker `json:"markers"`
			Next    string              `json:"next,omitempty"`
		}{page, next})
	}
	rows := make([][]string, 0, len(page))
	for _, r := range page {
		rows = append(rows, []string{r.ID, string(r.State), cli.Printable(cli.Dash(r.Account)), cli.FormatTime(r.CreatedAt),
			cli.MarkerOutcome(r), cli.Printable(cli.MarkerCommandText(r))})
	}
	if err := cli.PrintTable(c.Stdout, cli.TableWidth(c.Stdout), []string{"ID", "STATE", "ACCOUNT", "CREATED", "EXIT", "COMMAND"}, rows); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(c.Stderr, "more: --cursor %s\n", next)
	}
	return nil
}

func statesList() string {
	var names []string
	for _, s := range markers.HostGraph.States() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}

// openMarker parses the agent flags (already registered on fs) and the ID argument, opens
// the marker source and returns it with the marker; the caller closes the source.
func (c *MarkersCommand) openMarker(ctx context.Context, fs *flag.FlagSet, af *agentFlags, args []string) (markerSource, *hostproto.Marker, error) {
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return nil, nil, err
	}
	if err := af.resolve(); err != nil {
		return nil, nil, err
	}
	src, err := af.open(ctx, c.Stderr)
	if err != nil {
		return nil, nil, err
	}
	rec, err := c.get(ctx, src, pos[0])
	if err != nil {
		src.Close()
		return nil, nil, err
	}
	return src, rec, nil
}

// get returns the marker of id from src.
func (c *MarkersCommand) get(ctx context.Context, src markerSource, id string) (*hostproto.Marker, error) {
	if !hostproto.ValidExecutionID(id) {
		return nil, prog.UsageErrorf(c.Stderr, "%q is not an execution id (ex_ + 26-character ULID)", id)
	}
	found, _, err := src.Status(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("no marker %s on this host", id)
	}
	return found[0], nil
}

func (c *MarkersCommand) show(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers show ID [flags]", c.Stderr)
	var af agentFlags
	af.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	src, rec, err := c.openMarker(ctx, fs, &af, args)
	if err != nil {
		return err
	}
	defer src.Close()
	if *asJSON {
		return cli.WriteJSON(c.Stdout, rec)
	}
	return cli.WriteMarker(c.Stdout, "", rec)
}

func (c *MarkersCommand) tail(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers tail ID [flags]", c.Stderr)
	var af agentFlags
	af.register(fs)
	follow := fs.Bool("follow", false, "keep streaming until the execution ends (needs the agent)")
	src, rec, err := c.openMarker(ctx, fs, &af, args)
	if err != nil {
		return err
	}
	defer src.Close()
	agent, viaAgent := src.(*hostproto.ControlClient)
	if *follow && !viaAgent {
		return errors.New("--follow needs the running agent")
	}
	// Attach streams until the execution ends: right for --follow and for an ended
	// execution. Without --follow, a running execution's output so far is in its spool.
	if viaAgent && (*follow || rec.State.Ended()) {
		_, err := agent.Attach(ctx, rec.ID, 0, 0, func(stream string, _ int64, data []byte) error {
			w := c.Stdout
			if stream == supervisor.StreamStderr {
				w = c.Stderr
			}
			_, err := w.Write(data)
			return err
		})
		return err
	}
	if rec.SpoolDir == "" {
		return fmt.Errorf("%s has no spool directory (state %s)", rec.ID, rec.State)
	}
	for _, f := range []struct {
		name string
		w    io.Writer
	}{{supervisor.StdoutFile, c.Stdout}, {supervisor.StderrFile, c.Stderr}} {
		if err := copyFile(filepath.Join(rec.SpoolDir, f.name), f.w); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(path string, w io.Writer) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the stream has no output yet
	}
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

func (c *MarkersCommand) verify(ctx context.Context, args []string) error {
	fs := prog.FlagSet("markers verify [flags]", c.Stderr)
	var af agentFlags
	af.register(fs)
	keyPath := fs.String("key", "", "audit verifier key (default <data_dir>/audit.key.pub)")
	var opts markers.VerifyOptions
	fs.BoolVar(&opts.RequireSealed, "require-sealed", false, "fail if the last events are not covered by a signed checkpoint")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := af.resolve(); err != nil {
		return err
	}
	if *keyPath == "" {
		if af.dataDir == "" {
			return prog.UsageErrorf(c.Stderr, "--key is required without a data dir")
		}
		*keyPath = af.paths.AuditKeyPath() + ".pub"
	}
	key, err := os.ReadFile(*keyPath)
	if err != nil {
		return fmt.Errorf("audit verifier key: %w", err)
	}
	rep, err := verifyLog(ctx, &af, string(key), opts, c.Stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		err = cli.WriteJSON(c.Stdout, rep)
	} else {
		_, err = fmt.Fprintln(c.Stdout, rep)
	}
	if err == nil && !rep.OK {
		err = errVerifyFailed
	}
	return err
}

// verifyLog verifies the export the agent streams, or the store's directory while the agent
// is down.
func verifyLog(ctx context.Context, af *agentFlags, key string, opts markers.VerifyOptions, stderr io.Writer) (markers.Report, error) {
	agent, err := hostproto.DialLocalControl(ctx, af.socket)
	if err != nil {
		if !agentDown(err) || af.dataDir == "" {
			return markers.Report{}, err
		}
		fmt.Fprintf(stderr, "note: agent not reachable at %s; verifying %s directly\n", af.socket, af.dataDir)
		return markers.VerifyDir(af.paths.MarkersDir(), key, opts)
	}
	defer agent.Close()
	pr, pw := io.Pipe()
	exported := make(chan error, 1)
	go func() {
		_, err := agent.Export(ctx, pw)
		pw.CloseWithError(err)
		exported <- err
	}()
	rep, err := markers.VerifyJSONL(pr, key, opts)
	pr.CloseWithError(errors.New("verification stopped reading")) // unblocks an export still writing
	exportErr := <-exported
	if err != nil {
		return rep, err
	}
	if exportErr != nil && rep.OK {
		return rep, fmt.Errorf("export: %w", exportErr)
	}
	return rep, nil
}
