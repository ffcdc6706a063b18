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
	"os"
	"os/user"
	"path/filepath"
	"strconv"
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
	"github.com/postern-dev/postern/internal/locate"
	"github.com/postern-dev/postern/internal/privdir"
)

// localHost is the inventory name `postern up` enrolls its own hostagent under.
const localHost = "local"

// upCommand runs the quick start: a bastion and a hostagent in one process, on 127.0.0.1,
// with keys generated under the state dir on first run and reused after. The hostagent is
// enrolled as host "local" (its key is recorded once; a changed key is refused, as for any
// host). Its config is a file (the state dir's postern.toml, or --config FILE), written on
// the first run from the quick start's settings — its token's actor, its listen address —
// and taken as it is after, so actors, rules and hosts added there keep host "local" and the
// token. It prints how to connect an MCP client.
func upCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	loc := &locator{forUp: true}
	fs.StringVar(&loc.stateDir, "state-dir", "", "where keys, the journal and the markers live (else $"+envStateDir+", else "+locate.UserStateDirText+")")
	fs.StringVar(&loc.configPath, "config", "", "the config to run with, written from the quick start's settings if it does not exist (default <state-dir>/"+stateDirConfig+")")
	listen := fs.String("listen", config.DefaultConfig("").Listen, "the bastion's Streamable HTTP address (loopback); given, it overrides the config's listen")
	agentListen := fs.String("hostagent-listen", "127.0.0.1:7422", "the local hostagent's SSH address (loopback)")
	var origins stringList
	fs.Var(&origins, "allow-origin", "a browser origin (http(s)://host[:port]) that may connect besides the loopback ones (repeatable; given, it replaces the config's allowed_origins)")
	verbose := fs.Bool("v", false, "log at debug level")
	hold := fs.Bool("hold", false, holdUsage)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: postern up [--state-dir DIR] [--config FILE] [--listen ADDR] [--hostagent-listen ADDR] [--allow-origin ORIGIN]... [--hold]\n\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nWhich state dir: the first of these that names one decides (never the packaged\n/etc/postern, /var/lib/postern: those are the postern service's) —\n"+discoveryRule(true).Help("  "))
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
	listenSet := false
	fs.Visit(func(f *flag.Flag) { listenSet = listenSet || f.Name == "listen" })
	plan, err := planUp(loc)
	if err != nil {
		return err
	}
	dir := plan.dir
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// Ctrl-C (or SIGTERM) says that it was heard, and when everything is closed.
	said := make(chan struct{})
	stopAnnouncing := context.AfterFunc(ctx, func() {
		fmt.Fprintln(stdout, "postern: stopping… (running commands go on; the next start finds them)")
		close(said)
	})
	defer func() {
		if !stopAnnouncing() {
			<-said
			fmt.Fprintln(stdout, "postern: stopped")
		}
	}()

	// Before anything is written: a second up on this dir stops here, naming the first.
	claim, err := claimStateDir(dir, "--state-dir", logger.With("component", "bastion"))
	if err != nil {
		return err
	}
	defer claim.release()

	cfg, newConfig, err := upConfig(plan, *listen, listenSet, origins, logger.With("component", "bastion"))
	if err != nil {
		return err
	}
	// The HTTP port before the rest: a port in use fails before anything is enrolled.
	var httpLn net.Listener
	if cfg.Listen != "" {
		if httpLn, err = net.Listen("tcp", cfg.Listen); err != nil {
			return portHint(fmt.Errorf("bastion: listen %s: %w", cfg.Listen, err), "pass --listen ADDR to use another")
		}
		defer httpLn.Close()
	}
	// A reload reads the config file up keeps (written below on a first run), with this
	// run's flags over it as now.
	load := func() (config.Config, string, error) {
		next, digest, err := config.ReadConfig(plan.configPath)
		if err != nil {
			return config.Config{}, "", err
		}
		reread := plan
		reread.existing = &next
		next, _, err = upConfig(reread, *listen, listenSet, origins, logger)
		return next, digest, err
	}
	digest := ""
	if newConfig != nil {
		digest = config.Digest(newConfig)
	} else if data, err := os.ReadFile(plan.configPath); err == nil {
		digest = config.Digest(data)
	}
	b, err := bastion.Open(bastion.Options{Config: cfg, Logger: logger.With("component", "bastion"), Hold: *hold, HTTPListener: httpLn, Load: load, ConfigDigest: digest})
	if err != nil {
		return err
	}
	defer b.Close()
	defer reloadOnHangup(ctx, b, logger.With("component", "bastion"))()

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

	if err := enrollLocal(cfg.InventoryPath(), agentLn.Addr().String(), agent.Server().HostPublicKey(), stdout); err != nil {
		return err
	}
	if newConfig != nil {
		if err := writeUpConfig(plan.configPath, newConfig); err != nil {
			return err
		}
	}
	if err := b.Recover(ctx); err != nil {
		return err
	}
	return portHint(b.Serve(ctx, func(ep bastion.Endpoints) {
		claim.markServing()
		printConnect(stdout, ep, dir, plan.configPath, enrolledHosts(cfg.InventoryPath()))
		if *hold {
			fmt.Fprint(stdout, heldNote)
		}
	}), "pass --listen ADDR to use another")
}

// upPlan is where `postern up` runs: its state dir and config file, and that file's
// contents when it exists (nil: it is written from the quick start's settings).
type upPlan struct {
	dir, configPath string
	existing        *config.Config
}

// planUp applies the discovery rule (without the packaged level): a config found is taken as
// it is (a state dir given too overrides its state_dir); without one, the state dir's own
// postern.toml is written on this run — as is a --config FILE that does not exist yet.
func planUp(loc *locator) (upPlan, error) {
	f, err := loc.find()
	if err != nil {
		return upPlan{}, err
	}
	p := upPlan{dir: f.Dir, configPath: f.Config}
	if p.configPath == "" {
		p.configPath = filepath.Join(p.dir, stateDirConfig)
		return p, nil
	}
	cfg, err := config.LoadConfig(p.configPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if p.dir == "" {
			if p.dir = discoveryRule(true).UserDir; p.dir == "" {
				return upPlan{}, fmt.Errorf("%s does not exist and no state dir is named for it: pass --state-dir DIR", p.configPath)
			}
		}
	case err != nil:
		return upPlan{}, fmt.Errorf("%w\n(%s)", err, f.Why())
	default:
		p.existing = &cfg
		if p.dir == "" {
			p.dir = cfg.StateDir
		}
	}
	return p, nil
}

// upConfig is the quick start's config: the existing file's, or — on a first run — one made
// from the quick start's settings, whose text (newFile) is written once up has started its
// parts. The config holds only the token's hash; the token itself is in a 0600 file for the
// local user's clients. listen overrides the file's when listenSet; origins (the
// --allow-origin values) when given.
func upConfig(p upPlan, listen string, listenSet bool, origins []string, logger *slog.Logger) (cfg config.Config, newFile []byte, err error) {
	if p.existing != nil {
		cfg = *p.existing
		cfg.StateDir = p.dir
		if listenSet {
			cfg.Listen = listen
		}
		if len(origins) > 0 {
			cfg.AllowedOrigins = origins
		}
		return cfg, nil, cfg.Validate()
	}
	// Checked before the token is written into it; bastion.Open checks again.
	if err := privdir.Ensure(p.dir, "state dir", logger); err != nil {
		return config.Config{}, nil, err
	}
	tokenPath := filepath.Join(p.dir, "token")
	data, err := os.ReadFile(tokenPath)
	if errors.Is(err, os.ErrNotExist) {
		tok, terr := transport.NewToken()
		if terr != nil {
			return config.Config{}, nil, terr
		}
		if err := durable.WriteFile(tokenPath, []byte(tok+"\n"), 0o600); err != nil {
			return config.Config{}, nil, err
		}
		data = []byte(tok)
	} else if err != nil {
		return config.Config{}, nil, err
	}
	cfg = config.DefaultConfig(p.dir)
	cfg.Listen = listen
	cfg.AllowedOrigins = origins
	cfg.Actors = upActorsFor(strings.TrimSpace(string(data)))
	cfg.Principals = upPrincipals
	var buf bytes.Buffer
	if err := upConfigTemplate.Execute(&buf, cfg); err != nil {
		return config.Config{}, nil, fmt.Errorf("render the config: %w", err)
	}
	// Run with what the file says, so the next start (from the file) is this one.
	parsed, err := config.ParseConfig(bytes.NewReader(buf.Bytes()))
	if err == nil {
		err = parsed.Validate()
	}
	if err != nil {
		return config.Config{}, nil, fmt.Errorf("the config up would write: %w", err)
	}
	return parsed, buf.Bytes(), nil
}

// writeUpConfig writes the config a first run made, 0600, creating its dir (0700) if needed.
func writeUpConfig(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return durable.WriteFile(path, data, 0o600)
}

var upConfigTemplate = template.Must(template.New("config").Funcs(template.FuncMap{"quote": strconv.Quote}).Parse(
	`# postern configuration, written by ` + "`postern up`" + ` on its first run from the quick start's
# settings, and read by it (and by every postern command on this state dir) after.
# Edit it — actors, rules, classes, endpoints (docs/bastion.md lists every key, docs/policy.md
# the rules) — and restart ` + "`postern up`" + `: it keeps running host "local", its own hostagent.
# The same file runs the bastion as a service (docs/operations.md, "From the quick start to a
# service").

state_dir = {{quote .StateDir}}

# Streamable HTTP (loopback; anything else needs tls_cert_file/tls_key_file).
# ` + "`postern up --listen ADDR`" + ` overrides it for one run.
listen = {{quote .Listen}}
{{- if .AllowedOrigins}}
allowed_origins = [{{range $i, $o := .AllowedOrigins}}{{if $i}}, {{end}}{{quote $o}}{{end}}]
{{- else}}
# Browser origins that may connect besides the loopback ones:
# allowed_origins = ["https://console.example"]
{{- end}}

# The quick start's agent: whoever holds the bearer token in <state_dir>/token. Local agents
# of this user (through ` + "`postern mcp`" + `) are the implicit actor "self". More actors: add
# [[actors]] name = "NAME", remote = true, run ` + "`postern reload`" + `, then ` + "`postern token NAME`" + `
# issues its tokens (with an expiry; ` + "`postern token list`, `postern token revoke ID`" + `).
{{- range .Actors}}
[[actors]]
name = {{quote .Name}}
token_sha256 = {{quote .TokenSHA256}}
{{- end}}

# One principal: the token's holder and this user's local agents are one party, so an
# idempotency_key is one execution whichever of them sends it (docs/bastion.md, "Principals").
{{- range .Principals}}
[[principals]]
name = {{quote .Name}}
actors = [{{range $i, $a := .Actors}}{{if $i}}, {{end}}{{quote $a}}{{end}}]
{{- end}}

# Rules over the parsed command (docs/policy.md), e.g.:
# [[rules]]
# name = "no-rm"
# decision = "deny"
# commands = ["rm **"]
`))

// upActor is the actor `postern up` authorizes: the holder of the token in its state dir.
const upActor = "local-agent"

// upPrincipals make up's two callers one principal: the holder of its token (over HTTP) and
// the local user's agents (on the socket, and through postern mcp) are the same person, so
// one idempotency_key is one execution whichever of them sends it.
var upPrincipals = []config.Principal{{Name: "local-user", Actors: []string{upActor, config.SelfActor}}}

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

// enrollLocal records the local hostagent's key (key, taken from the hostagent itself: a scan
// of its port would only make it log a failed handshake) on first run; later runs find the
// same key. A different key is refused, never replaced silently.
func enrollLocal(inventory, addr string, key gossh.PublicKey, stdout io.Writer) error {
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
  Config: {{.Config}}   (add actors, rules, classes there, then restart up)
  MCP (Streamable HTTP): {{.URL}}   bearer token in {{.Dir}}/token
  MCP (local socket):    {{.Socket}}   (caller named by the kernel)
  Hosts: {{.Hosts}}

Connect an MCP client:

  Claude Code, stdio (build the binary once: go build -o ~/.local/bin/postern ./cmd/postern):
    claude mcp add postern -- postern mcp {{.Where}}

  Claude Code, HTTP:
    claude mcp add --transport http postern {{.URL}} --header "Authorization: Bearer $(cat {{.Dir}}/token)"

  JSON config (Claude Desktop, Cursor, ...):
    {"mcpServers": {"postern": {"command": "postern", "args": {{.WhereJSON}}}}}

  Browser clients (MCP Inspector): pages on http(s)://localhost, 127.0.0.1 or [::1] may connect
  (with the token); restart with --allow-origin ORIGIN to admit another origin.

  curl:
    curl -s {{.URL}} -H "Authorization: Bearer $(cat {{.Dir}}/token)" \
      -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
      -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ssh_exec","arguments":{"host":"local","command":"uname -a"}}}'

Operator: postern status{{.OperatorFlags}}   (Ctrl-C stops; running commands go on)
`))

// printConnect prints the banner of a started up on state dir dir with config file
// configPath.
func printConnect(w io.Writer, ep bastion.Endpoints, dir, configPath, hosts string) {
	// An MCP client may start the bridge with another environment: it is always told where.
	where := []string{"--state-dir", dir}
	if configPath != filepath.Join(dir, stateDirConfig) {
		where = []string{"--config", configPath, "--state-dir", dir}
	}
	whereJSON, _ := json.Marshal(append([]string{"mcp"}, where...))
	// The operator only where the discovery rule would not find this bastion by itself.
	operatorFlags := ""
	if f := discoveryRule(false).Find(locate.Given{Getenv: os.Getenv, Exists: pathExists}); f.Dir != dir || f.Config != configPath {
		operatorFlags = " " + strings.Join(where, " ")
	}
	var buf bytes.Buffer
	connectTemplate.Execute(&buf, map[string]string{
		"Dir": dir, "Config": configPath, "URL": orNone(ep.URL), "Socket": ep.Socket, "Hosts": hosts,
		"Where": strings.Join(where, " "), "WhereJSON": string(whereJSON), "OperatorFlags": operatorFlags,
	})
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
