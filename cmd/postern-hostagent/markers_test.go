package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/markers"
)

// storeBackend serves a real store over the control socket the way the executor does for
// finished executions: attach replays fixed output, checkpoints are accepted from one pid.
type storeBackend struct {
	*markers.Store
	output map[string]string // stdout of each execution

	mu       sync.Mutex // guards allowPID
	allowPID int
}

func (b *storeBackend) Attach(_ context.Context, id string, stdoutOffset, _ int64, emit func(string, []byte) error) (*markers.Record, error) {
	if out := b.output[id]; int64(len(out)) > stdoutOffset {
		if err := emit("stdout", []byte(out[stdoutOffset:])); err != nil {
			return nil, err
		}
	}
	return b.Get(id)
}

func (b *storeBackend) MarkerRetention() time.Duration { return 720 * time.Hour }

func (b *storeBackend) Cancel(context.Context, string) (*markers.Record, error) {
	return nil, hostproto.ErrNotRunning
}

func (b *storeBackend) Checkpoint(ctx context.Context, id string, peerPID int, note string, validated bool) (*markers.Record, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if peerPID != b.allowPID {
		return nil, hostagent.ErrNotYourProcess
	}
	return b.Update(ctx, id, "checkpoint", func(r *markers.Record) error {
		if validated {
			r.Validated = true
			return nil
		}
		r.Checkpoints = append(r.Checkpoints, markers.Checkpoint{At: time.Now().UTC(), Note: note})
		return nil
	})
}

// agentDir is a data dir with a config file pointing at it and a store of three markers:
// two exited, one running (ids in that order).
type agentDir struct {
	dataDir, config string
	ids             []string
}

func newAgentDir(t *testing.T) (*agentDir, *markers.Store) {
	t.Helper()
	base := sockdir.New(t) // the data dir holds the control socket
	d := &agentDir{dataDir: filepath.Join(base, "data"), config: filepath.Join(base, "config.toml")}
	if err := os.WriteFile(d.config, []byte(fmt.Sprintf("data_dir = %q\n", d.dataDir)), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := hostagent.Config{DataDir: d.dataDir}
	signer, _, err := markers.LoadOrCreateAuditKey(paths.AuditKeyPath(), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	store, err := markers.Open(paths.MarkersDir(), markers.Options{
		Graph: markers.HostGraph, Signer: signer, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, spec := range []struct {
		account, opKey string
		exit           int
	}{{"alice", "migration:1", 0}, {"bob", "", 3}, {"alice", "", -1}} {
		id, _ := markers.NewExecutionID(time.Now())
		d.ids = append(d.ids, id)
		if _, err := store.Create(ctx, &markers.Record{ID: id, Account: spec.account, OperationKey: spec.opKey,
			Command: []string{fmt.Sprintf("step-%d", i)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Transition(ctx, id, markers.Started, markers.Running, "", nil); err != nil {
			t.Fatal(err)
		}
		if spec.exit < 0 {
			continue
		}
		if _, err := store.Transition(ctx, id, markers.Running, markers.Exited, "", func(r *markers.Record) error {
			r.ExitCode = &spec.exit
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return d, store
}

// serveAgent serves store on the data dir's control socket until the test ends.
func serveAgent(t *testing.T, d *agentDir, b *storeBackend) {
	t.Helper()
	ln, err := hostagent.ListenLocal((hostagent.Config{DataDir: d.dataDir}).ControlSocketPath())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- hostagent.ServeLocal(ctx, ln, b, hostagent.DefaultConfig().LocalLimits(), slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeLocal: %v", err)
		}
	})
}

func runCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// checkMarkersCommands runs against the agent and against the stopped agent's data dir alike.
func checkMarkersCommands(t *testing.T, d *agentDir) {
	t.Run("list table", func(t *testing.T) {
		out, _, err := runCLI(t, "markers", "list", "--config", d.config)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], d.ids[2]) {
			t.Errorf("list =\n%s\nwant a header and 3 markers, newest first", out)
		}
	})
	t.Run("list filters as JSON", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			want []string
		}{
			{name: "state", args: []string{"--state", "exited", "--oldest-first"}, want: []string{d.ids[0], d.ids[1]}},
			{name: "operation key", args: []string{"--operation-key", "migration:1"}, want: []string{d.ids[0]}},
			{name: "since", args: []string{"--since", "1h", "--limit", "1"}, want: []string{d.ids[2]}},
			{name: "until", args: []string{"--until", "2000-01-01T00:00:00Z"}, want: nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				out, _, err := runCLI(t, append([]string{"markers", "list", "--json", "--config", d.config}, tt.args...)...)
				if err != nil {
					t.Fatal(err)
				}
				var got struct{ Markers []*markers.Record }
				if err := json.Unmarshal([]byte(out), &got); err != nil {
					t.Fatalf("%v in %s", err, out)
				}
				var ids []string
				for _, r := range got.Markers {
					ids = append(ids, r.ID)
				}
				if strings.Join(ids, ",") != strings.Join(tt.want, ",") {
					t.Errorf("got = %v; want %v", ids, tt.want)
				}
			})
		}
	})
	t.Run("show", func(t *testing.T) {
		out, _, err := runCLI(t, "markers", "show", d.ids[1], "--config", d.config)
		if err != nil {
			t.Fatal(err)
		}
		// "exit N", as the bastion's CLI prints it (one printer, internal/cli).
		for _, want := range []string{d.ids[1], "exited", "bob", "step-1", "outcome", "exit "} {
			if !strings.Contains(out, want) {
				t.Errorf("show output lacks %q:\n%s", want, out)
			}
		}
		out, _, err = runCLI(t, "markers", "show", "--json", "--config", d.config, d.ids[0])
		var rec markers.Record
		if err != nil || json.Unmarshal([]byte(out), &rec) != nil || rec.OperationKey != "migration:1" {
			t.Errorf("show --json = %s, %v", out, err)
		}
		absent, _ := markers.NewExecutionID(time.Now())
		if _, _, err := runCLI(t, "markers", "show", absent, "--config", d.config); err == nil {
			t.Error("show of an absent marker succeeded")
		}
	})
}

// TestMarkersWithoutConfig: with no --config, no variable, no installed config and no
// local hostagent of postern up, markers list says where it looked and what to pass instead
// of failing on a path under /etc.
func TestMarkersWithoutConfig(t *testing.T) {
	noMachine(t)
	_, _, err := runCLI(t, "markers", "list")
	for _, want := range []string{"pass --config FILE", packagedConfig + " (absent)", filepath.Join(os.Getenv("HOME"), ".local/state/postern/hostagent"), "chosen by the user default"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("markers list without a config: %v; want it to say %q", err, want)
		}
	}
}

// noMachine makes the discovery rule independent of the machine the test runs on: no
// packaged config, no variables, a home of its own.
func noMachine(t *testing.T) {
	t.Helper()
	saved := packagedConfig
	packagedConfig = filepath.Join(t.TempDir(), "etc-postern-hostagent-config.toml")
	t.Cleanup(func() { packagedConfig = saved })
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv(envConfig, "")
	t.Setenv(envDataDir, "")
}

func TestMarkersThroughTheAgent(t *testing.T) {
	d, store := newAgentDir(t)
	t.Cleanup(func() { store.Close() })
	b := &storeBackend{Store: store, output: map[string]string{}}
	b.output[d.ids[0]] = "migrated 12 tables\n"
	serveAgent(t, d, b)

	checkMarkersCommands(t, d)

	t.Run("tail", func(t *testing.T) {
		out, _, err := runCLI(t, "markers", "tail", d.ids[0], "--config", d.config)
		if err != nil || out != "migrated 12 tables\n" {
			t.Errorf("tail = %q, %v", out, err)
		}
	})
	t.Run("verify", func(t *testing.T) {
		out, _, err := runCLI(t, "markers", "verify", "--require-sealed", "--socket", (hostagent.Config{DataDir: d.dataDir}).ControlSocketPath(),
			"--data-dir", d.dataDir)
		if err != nil || !strings.HasPrefix(out, "PASS") {
			t.Errorf("verify = %s, %v", out, err)
		}
	})
	t.Run("verify with the wrong key fails", func(t *testing.T) {
		_, vkey, err := markers.LoadOrCreateAuditKey(filepath.Join(t.TempDir(), "other.key"), "other")
		if err != nil {
			t.Fatal(err)
		}
		keyFile := filepath.Join(t.TempDir(), "other.pub")
		os.WriteFile(keyFile, []byte(vkey), 0o600)
		out, _, err := runCLI(t, "markers", "verify", "--config", d.config, "--key", keyFile)
		if !errors.Is(err, errVerifyFailed) || !strings.HasPrefix(out, "FAIL") {
			t.Errorf("verify = %s, %v; want FAIL", out, err)
		}
	})
	t.Run("marker checkpoint", func(t *testing.T) {
		running := d.ids[2]
		b.mu.Lock()
		b.allowPID = os.Getpid()
		b.mu.Unlock()
		env := map[string]string{hostproto.EnvExecutionID: running, hostproto.EnvMarkerSocket: (hostagent.Config{DataDir: d.dataDir}).ControlSocketPath()}
		cmd := &MarkerCommand{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(k string) string { return env[k] }}
		if err := cmd.Run(context.Background(), []string{"checkpoint", "schema applied"}); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Run(context.Background(), []string{"validated"}); err != nil {
			t.Fatal(err)
		}
		rec, err := store.Get(running)
		if err != nil || len(rec.Checkpoints) != 1 || rec.Checkpoints[0].Note != "schema applied" || !rec.Validated {
			t.Errorf("marker after checkpoint = %+v, %v", rec, err)
		}
		b.mu.Lock()
		b.allowPID = 1
		b.mu.Unlock()
		if err := cmd.Run(context.Background(), []string{"checkpoint", "x"}); !errors.Is(err, hostproto.ErrForbidden) {
			t.Errorf("checkpoint from outside the process tree = %v; want hostproto.ErrForbidden", err)
		}
	})
}

func TestMarkersWithTheAgentDown(t *testing.T) {
	d, store := newAgentDir(t)
	// A spool for the running execution, as the shim leaves it.
	spool := filepath.Join(d.dataDir, "spool", d.ids[2])
	os.MkdirAll(spool, 0o700)
	os.WriteFile(filepath.Join(spool, "stdout"), []byte("so far\n"), 0o600)
	if _, err := store.Update(context.Background(), d.ids[2], "", func(r *markers.Record) error {
		r.SpoolDir = spool
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	checkMarkersCommands(t, d)

	t.Run("tail reads the spool", func(t *testing.T) {
		out, _, err := runCLI(t, "markers", "tail", d.ids[2], "--config", d.config)
		if err != nil || out != "so far\n" {
			t.Errorf("tail = %q, %v", out, err)
		}
		if _, _, err := runCLI(t, "markers", "tail", "--follow", d.ids[2], "--config", d.config); err == nil {
			t.Error("tail --follow without the agent succeeded")
		}
	})
	t.Run("verify the directory", func(t *testing.T) {
		out, _, err := runCLI(t, "markers", "verify", "--json", "--config", d.config)
		var rep markers.Report
		if err != nil || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || rep.Records != 3 {
			t.Errorf("verify = %s, %v", out, err)
		}
	})
}

func TestMarkerCommandUsage(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantErr  string
	}{
		{name: "no subcommand", args: []string{"marker"}, wantCode: 2},
		{name: "checkpoint without note", args: []string{"marker", "checkpoint"}, wantCode: 2},
		{name: "unknown", args: []string{"marker", "done"}, wantCode: 2},
		{name: "outside an execution", args: []string{"marker", "validated"}, wantCode: 1, wantErr: "not set"},
		{name: "agent gone", args: []string{"marker", "checkpoint", "x"}, wantCode: 1, wantErr: "dial",
			env: map[string]string{hostproto.EnvExecutionID: "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW", hostproto.EnvMarkerSocket: "/nonexistent/control.sock"}},
		{name: "markers without subcommand", args: []string{"markers"}, wantCode: 2},
		{name: "markers show without id", args: []string{"markers", "show", "--socket", "/x"}, wantCode: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			var err error
			if tt.args[0] == "marker" {
				err = (&MarkerCommand{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return tt.env[k] }}).Run(context.Background(), tt.args[1:])
			} else {
				err = run(context.Background(), tt.args, &stdout, &stderr)
			}
			if got := prog.ExitCode(err, &stderr); got != tt.wantCode {
				t.Errorf("exit code = %d (err %v); want %d", got, err, tt.wantCode)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err = %v; want it to mention %q", err, tt.wantErr)
			}
		})
	}
}
