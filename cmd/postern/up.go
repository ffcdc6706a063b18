package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"text/template"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/hostagent"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/internal/privdir"
)

// localHost is the inventory name `postern up` enrolls its own hostagent under.
const localHost = "local"

// upCommand runs the quick start: a bastion and a hostagent in one process, on 127.0.0.1,
// with keys generated under the state dir on first run and reused after. The hostagent is
// enrolled as host "local" (its key is recorded once; a changed key is refused, as for any
// host). It prints how to connect an MCP client.
func upCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", defaultStateDir(), "where keys, the journal and the markers live")
	listen := fs.String("listen", "127.0.0.1:7410", "the bastion's Streamable HTTP address (loopback)")
	agentListen := fs.String("hostagent-listen", "127.0.0.1:7422", "the local hostagent's SSH address (loopback)")
	var origins stringList
	fs.Var(&origins, "allow-origin", "a browser origin (http(s)://host[:port]) that may connect besides the loopback ones (repeatable)")
	verbose := fs.Bool("v", false, "log at debug level")
	hold := fs.Bool("hold", false, holdUsage)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: postern up [--state-dir DIR] [--listen ADDR] [--hostagent-listen ADDR] [--allow-origin ORIGIN]... [--hold]\n\n")
		fs.PrintDefaults()
	}
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	// Checked before anything is written, so a typo costs nothing.
	for _, o := range origins {
		if _, err := transport.ParseAllowedOrigin(o); err != nil {
			return fmt.Errorf("--allow-origin: %w", err)
		}
	}
	dir, err := filepath.Abs(*stateDir)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// Before anything is written: a second up on this dir stops here, naming the first.
	claim, err := claimStateDir(dir, "--state-dir", logger.With("component", "bastion"))
	if err != nil {
		return err
	}
	defer claim.release()

	cfg, err := upConfig(dir, *listen, origins, logger.With("component", "bastion"))
	if err != nil {
		return err
	}
	b, err := bastion.Open(bastion.Options{Config: cfg, Logger: logger.With("component", "bastion"), Hold: *hold})
	if err != nil {
		return err
	}
	defer b.Close()

	agent, agentLn, err := startLocalHostagent(ctx, filepath.Join(dir, "hostagent"), *agentListen, b.ClientPublicKey(), logger)
	if err != nil {
		return err
	}
	defer agent.Close()
	agentCtx, stopAgent := context.WithCancel(context.WithoutCancel(ctx))
	var agentDone sync.WaitGroup
	agentDone.Go(func() {
		if err := agent.Serve(agentCtx, agentLn, 5*time.Second); err != nil {
			logger.Error("local hostagent stopped", "err", err)
		}
	})
	defer func() { stopAgent(); agentDone.Wait() }()

	if err := enrollLocal(ctx, cfg.InventoryPath(), agentLn.Addr().String(), stdout); err != nil {
		return err
	}
	if err := b.Recover(ctx); err != nil {
		return err
	}
	return portHint(b.Serve(ctx, func(ep bastion.Endpoints) {
		claim.markServing()
		printConnect(stdout, ep, dir, enrolledHosts(cfg.InventoryPath()))
		if *hold {
			fmt.Fprint(stdout, heldNote)
		}
	}), "pass --listen ADDR to use another")
}

// upConfig writes the quick start's config and bearer token on first run and reads them
// after. The config holds only the token's hash; the token itself is in a 0600 file for the
// local user's clients. origins are the --allow-origin values.
func upConfig(dir, listen string, origins []string, logger *slog.Logger) (config.Config, error) {
	// Checked before the token is written into it; bastion.Open checks again.
	if err := privdir.Ensure(dir, "state dir", logger); err != nil {
		return config.Config{}, err
	}
	tokenPath := filepath.Join(dir, "token")
	data, err := os.ReadFile(tokenPath)
	if errors.Is(err, os.ErrNotExist) {
		tok, terr := transport.NewToken()
		if terr != nil {
			return config.Config{}, terr
		}
		if err := durable.WriteFile(tokenPath, []byte(tok+"\n"), 0o600); err != nil {
			return config.Config{}, err
		}
		data = []byte(tok)
	} else if err != nil {
		return config.Config{}, err
	}
	cfg := config.DefaultConfig(dir)
	cfg.Listen = listen
	cfg.AllowedOrigins = origins
	cfg.Actors = upActorsFor(strings.TrimSpace(string(data)))
	if err := cfg.Validate(); err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}

// upActor is the actor `postern up` authorizes: the holder of the token in its state dir.
const upActor = "local-agent"

func upActorsFor(token string) []policy.Actor {
	return []policy.Actor{{Name: upActor, TokenSHA256: transport.HashToken(token)}}
}

// upActors are the actors `postern up` runs with on state dir dir: none if up never ran there.
func upActors(dir string) ([]policy.Actor, error) {
	data, err := os.ReadFile(filepath.Join(dir, "token"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return upActorsFor(strings.TrimSpace(string(data))), nil
}

// startLocalHostagent opens a hostagent that authorizes only the bastion's key and runs
// commands as the current user.
func startLocalHostagent(ctx context.Context, dir, listen string, bastionKey gossh.PublicKey, logger *slog.Logger) (*hostagent.Agent, net.Listener, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	authorized := filepath.Join(dir, "authorized_keys")
	if err := durable.WriteFile(authorized, gossh.MarshalAuthorizedKey(bastionKey), 0o600); err != nil {
		return nil, nil, err
	}
	hcfg := hostagent.DefaultConfig()
	hcfg.Listen = listen
	hcfg.DataDir = dir
	hcfg.AuthorizedKeysFile = authorized
	hcfg.ControlSocket = filepath.Join(dir, "control.sock")
	if u, err := user.Current(); err == nil {
		hcfg.AllowedAccounts = []string{u.Username}
	}
	if err := hcfg.Validate(); err != nil {
		return nil, nil, err
	}
	agent, err := hostagent.OpenAgent(ctx, hcfg, hostagent.AgentOptions{Logger: logger.With("component", "hostagent")})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		agent.Close()
		return nil, nil, portHint(fmt.Errorf("hostagent listen %s: %w", listen, err), "pass --hostagent-listen ADDR to use another")
	}
	return agent, ln, nil
}

// enrollLocal records the local hostagent's key on first run; later runs find the same key.
// A different key is refused, never replaced silently.
func enrollLocal(ctx context.Context, inventory, addr string, stdout io.Writer) error {
	key, err := fleet.ScanHostKey(ctx, addr)
	if err != nil {
		return err
	}
	u, err := user.Current()
	if err != nil {
		return err
	}
	h := fleet.Host{Name: localHost, Addr: addr, Account: u.Username, HostKey: key}
	plan, err := fleet.PlanEnrollment(inventory, h)
	if err != nil {
		return err
	}
	if plan.Replaces != "" {
		return fmt.Errorf("host %q is enrolled with key %s but presents %s: refusing it (re-enroll explicitly with `postern hosts enroll --replace`)",
			localHost, plan.Replaces, plan.Fingerprint)
	}
	inv, err := fleet.OpenInventory(inventory)
	if err != nil {
		return err
	}
	if old, err := inv.Host(localHost); err == nil && old.Addr == addr {
		return nil
	}
	if err := fleet.Enroll(inventory, h); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "postern: enrolled host %q at %s, host key %s\n", localHost, addr, plan.Fingerprint)
	return nil
}

var connectTemplate = template.Must(template.New("connect").Parse(`
Postern is up. State: {{.Dir}}
  MCP (Streamable HTTP): {{.URL}}   bearer token in {{.Dir}}/token
  MCP (local socket):    {{.Socket}}   (caller named by the kernel)
  Hosts: {{.Hosts}}

Connect an MCP client:

  Claude Code, stdio (build the binary once: go build -o ~/.local/bin/postern ./cmd/postern):
    claude mcp add postern -- postern mcp --state-dir {{.Dir}}

  Claude Code, HTTP:
    claude mcp add --transport http postern {{.URL}} --header "Authorization: Bearer $(cat {{.Dir}}/token)"

  JSON config (Claude Desktop, Cursor, ...):
    {"mcpServers": {"postern": {"command": "postern", "args": ["mcp", "--state-dir", "{{.Dir}}"]}}}

  Browser clients (MCP Inspector): pages on http(s)://localhost, 127.0.0.1 or [::1] may connect
  (with the token); restart with --allow-origin ORIGIN to admit another origin.

  curl:
    curl -s {{.URL}} -H "Authorization: Bearer $(cat {{.Dir}}/token)" \
      -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
      -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ssh_exec","arguments":{"host":"local","command":"uname -a"}}}'

Operator: postern executions list --state-dir {{.Dir}}   (Ctrl-C stops; running commands go on)
`))

func printConnect(w io.Writer, ep bastion.Endpoints, dir, hosts string) {
	var buf bytes.Buffer
	connectTemplate.Execute(&buf, map[string]string{"Dir": dir, "URL": ep.URL, "Socket": ep.Socket, "Hosts": hosts})
	w.Write(buf.Bytes())
}

// enrolledHosts is the banner's list of every enrolled host: "local" (this machine, as ann),
// "db-1" (deploy@10.0.0.5:7422), ...
func enrolledHosts(inventory string) string {
	inv, err := fleet.OpenInventory(inventory)
	if err != nil {
		return "(the inventory cannot be read: " + cli.Printable(err.Error()) + ")"
	}
	hosts, err := inv.Hosts()
	if err != nil {
		return "(the inventory cannot be read: " + cli.Printable(err.Error()) + ")"
	}
	var names []string
	for _, h := range hosts {
		if h.Name == localHost {
			names = append(names, fmt.Sprintf("%q (this machine, as %s)", h.Name, cli.Printable(h.Account)))
			continue
		}
		names = append(names, fmt.Sprintf("%q (%s@%s)", cli.Printable(h.Name), cli.Printable(h.Account), cli.Printable(h.Addr)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
