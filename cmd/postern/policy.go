package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/internal/cli"
)

// policyCommand explains the policy without running anything: with --config FILE, FILE's
// policy; else the running daemon's, or the state dir's defaults when no daemon runs.
type policyCommand struct{ operatorIO }

func (c *policyCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "policy", policyUsage, cli.Subcommands{"check": c.check}, args, c.stdout, c.stderr)
}

const policyUsage = `usage: postern policy check [--config FILE] --actor NAME --host H [--json] -- WORDS...
       postern policy check [--config FILE] --actor NAME --endpoint E --method M --path P [--json]

  check  walk the decision ladder for a call and say which rule decides, why, and what the
         caller could do instead (nothing runs). The words after -- are joined with spaces
         into one command line, unquoted, as ssh joins its words: quote shell syntax for
         your own shell (-- 'ls *.log | wc -l'); the line is printed as the host would get
         it. The layers are the commands it would run, wrappers (sudo, env, sh -c, su -c,
         flock, ...) unwrapped, "=>" marking the one that decided; the writes are the
         files its redirections write.

         With --config FILE the decision is FILE's policy (a config change can be checked
         before it is served); without it, the running daemon's, or the state dir's
         defaults when no daemon runs. The output says which decided.

exit status: 0 authorized, 3 approval required, 4 rejected; 2 usage error, 1 other errors

common flags: --state-dir DIR, --config FILE (the bastion's config)
`

// Exit statuses of policy check for a decision that is not authorized.
const (
	exitApprovalRequired = 3
	exitRejected         = 4
)

// decisionStatus is policy check's answer when the decision is not authorized: the exit
// status says it (ExitStatus); the decision itself was printed.
type decisionStatus struct {
	outcome policy.Outcome
	status  int
}

func (e decisionStatus) Error() string   { return "policy check: " + string(e.outcome) }
func (e decisionStatus) ExitStatus() int { return e.status }

// checkResult is what policy check prints with --json: the decision, which policy made it,
// and the command line it judged.
type checkResult struct {
	policy.Decision
	DecidedBy   string // "the running daemon's policy (…)", or "FILE", or the state dir's defaults
	CommandLine string `json:",omitempty"` // ssh_exec: the words after --, joined with spaces
}

func (c *policyCommand) check(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("policy check [flags] -- WORDS...")
	actor := fs.String("actor", "self", `the actor, as named in the config ("self": local callers of the bastion's own user)`)
	host := fs.String("host", "", "the host (ssh_exec)")
	account := fs.String("account", "", "the account to run as (ssh_exec; default: the host's enrolled account)")
	endpoint := fs.String("endpoint", "", "the endpoint (http_request)")
	method := fs.String("method", "GET", "the HTTP method (http_request)")
	path := fs.String("path", "/", "the HTTP path (http_request)")
	asJSON := fs.Bool("json", false, "print JSON")
	var command []string
	for i, a := range args {
		if a == "--" {
			args, command = args[:i], args[i+1:]
			break
		}
	}
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if (*host == "") == (*endpoint == "") {
		return prog.UsageErrorf(c.stderr, "give --host H -- WORDS (ssh_exec) or --endpoint E (http_request)")
	}
	if *host != "" && len(command) == 0 {
		return prog.UsageErrorf(c.stderr, "give the command after --")
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	req := policy.Request{Actor: *actor}
	if *host != "" {
		// Joined like ssh joins its words: what the host's shell gets is this one line.
		req.Tool, req.Host, req.Command, req.Account = policy.ToolSSHExec, *host, strings.Join(command, " "), *account
	} else {
		req.Tool, req.Endpoint, req.Method, req.Path = policy.ToolHTTPRequest, *endpoint, *method, *path
	}
	res := checkResult{CommandLine: req.Command}
	if loc.configPath != "" {
		// The file decides, never the daemon: a config change is checked before it is served.
		res.DecidedBy = loc.configPath
		res.Decision, err = c.decideFromConfig(cfg, req)
	} else {
		// The running daemon decides with the actors and rules it runs with (postern up's
		// actor exists in no file); without one, the state dir's defaults do.
		socket := cfg.OperatorSocketPath()
		res.DecidedBy = "the running daemon's policy (" + socket + ")"
		err = newOperatorClient(socket).postJSON(ctx, "/v1/policy/check", req, &res.Decision)
		if errors.Is(err, errBastionDown) {
			fmt.Fprintf(c.stderr, "note: %v; deciding with the defaults of state dir %s\n", err, cfg.StateDir)
			res.DecidedBy = "the defaults of state dir " + cfg.StateDir + " (no daemon answered; give --config FILE to check a config)"
			res.Decision, err = c.decideFromConfig(cfg, req)
		}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		if err := cli.WriteJSON(c.stdout, res); err != nil {
			return err
		}
	} else {
		c.printDecision(res)
	}
	switch res.Outcome {
	case policy.AwaitingApproval:
		return decisionStatus{res.Outcome, exitApprovalRequired}
	case policy.Rejected:
		return decisionStatus{res.Outcome, exitRejected}
	}
	return nil
}

func (c *policyCommand) printDecision(res checkResult) {
	dec := res.Decision
	row := func(name, value string) {
		if value != "" {
			fmt.Fprintf(c.stdout, "%-13s %s\n", name+":", cli.Printable(value))
		}
	}
	row("decided by", res.DecidedBy)
	row("command line", res.CommandLine)
	row("decision", string(dec.Outcome))
	row("class", dec.Class)
	row("rule", dec.Rule)
	row("code", dec.Code)
	row("reason", dec.Reason)
	row("repair", dec.Repair)
	if len(dec.Layers) > 0 {
		// Every command the line would run, wrappers unwrapped; the one that decided marked.
		fmt.Fprintln(c.stdout, "layers:")
		for i, l := range dec.Layers {
			mark := "  "
			if i == dec.Layer {
				mark = "=>"
			}
			via := ""
			if l.Via != "" {
				via = "  (via " + l.Via + ")"
			}
			fmt.Fprintf(c.stdout, "  %s %d %s%s%s\n", mark, i+1, strings.Repeat("  ", l.Depth), cli.Printable(l.String()), via)
		}
	}
	for _, files := range []struct {
		name  string
		files []policy.File
	}{{"writes", dec.Writes}, {"reads", dec.Reads}} {
		if len(files.files) == 0 {
			continue
		}
		fmt.Fprintf(c.stdout, "%s:\n", files.name)
		for _, f := range files.files {
			path := f.Path
			if f.Unknown {
				path = "‹" + path + "› (known only when it runs)"
			}
			by := ""
			if f.Layer >= 0 {
				by = fmt.Sprintf("  (layer %d)", f.Layer+1)
			}
			fmt.Fprintf(c.stdout, "     %s%s\n", cli.Printable(path), by)
		}
	}
	fmt.Fprintln(c.stdout, "ladder:")
	for _, s := range dec.Steps {
		fmt.Fprintf(c.stdout, "  %s\n", cli.Printable(s))
	}
}

// decideFromConfig decides req with the policy of cfg. A state dir of `postern up` has
// up's actor, as up would configure it.
func (c *policyCommand) decideFromConfig(cfg config.Config, req policy.Request) (policy.Decision, error) {
	if len(cfg.Actors) == 0 {
		actors, err := upActors(cfg.StateDir)
		if err != nil {
			return policy.Decision{}, err
		}
		cfg.Actors = actors
	}
	pol, err := cfg.Policy()
	if err != nil {
		return policy.Decision{}, err
	}
	if req.Host != "" {
		inv, err := fleet.OpenInventory(cfg.InventoryPath())
		if err != nil {
			return policy.Decision{}, err
		}
		h, err := inv.Host(req.Host)
		switch {
		case err == nil:
			req.Groups = h.Groups
			if req.Account == h.Account {
				req.Account = "" // the enrolled account needs no grant, as in ssh_exec
			}
		case errors.Is(err, fleet.ErrUnknownHost):
			fmt.Fprintf(c.stderr, "note: host %s is not enrolled; group rules are not applied\n", cli.Printable(req.Host))
		default:
			return policy.Decision{}, err
		}
	}
	for _, e := range cfg.Endpoints {
		if e.Name == req.Endpoint {
			req.EndpointClass = e.Class
		}
	}
	if _, ok := pol.Actor(req.Actor); !ok {
		fmt.Fprintf(c.stderr, "note: no actor %q is configured\n", cli.Printable(req.Actor))
	}
	return pol.Decide(req), nil
}
