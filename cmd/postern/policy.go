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

// policyCommand explains the policy without running anything: the running daemon's policy,
// or the config's when no daemon runs.
type policyCommand struct{ operatorIO }

func (c *policyCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "policy", policyUsage, cli.Subcommands{"check": c.check}, args, c.stdout, c.stderr)
}

const policyUsage = `usage: postern policy check --actor NAME --host H [--json] -- COMMAND...
       postern policy check --actor NAME --endpoint E --method M --path P [--json]

  check  walk the decision ladder for a call and say which rule decides (nothing runs);
         like ssh, the words after -- are joined with spaces into the command line; the
         layers are the commands it would run, wrappers (sudo, env, sh -c, ...) unwrapped,
         "=>" marking the layer that decided

common flags: --state-dir DIR, --config FILE (the bastion's config)
`

func (c *policyCommand) check(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("policy check [flags] -- COMMAND...")
	actor := fs.String("actor", "self", `the actor, as named in the config ("self": local callers of the bastion's own user)`)
	host := fs.String("host", "", "the host (ssh_exec)")
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
		return prog.UsageErrorf(c.stderr, "give --host H -- COMMAND (ssh_exec) or --endpoint E (http_request)")
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
		req.Tool, req.Host, req.Command = policy.ToolSSHExec, *host, strings.Join(command, " ")
	} else {
		req.Tool, req.Endpoint, req.Method, req.Path = policy.ToolHTTPRequest, *endpoint, *method, *path
	}
	// The running daemon decides with the actors and rules it runs with (postern up's actor
	// exists in no file); without one, the config decides.
	var dec policy.Decision
	err = newOperatorClient(cfg.OperatorSocketPath()).postJSON(ctx, "/v1/policy/check", req, &dec)
	if errors.Is(err, errBastionDown) {
		fmt.Fprintf(c.stderr, "note: %v; deciding with the config's actors and rules\n", err)
		dec, err = c.decideFromConfig(cfg, req)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, dec)
	}
	fmt.Fprintf(c.stdout, "decision: %s\n", dec.Outcome)
	if dec.Class != "" {
		fmt.Fprintf(c.stdout, "class:    %s\n", dec.Class)
	}
	fmt.Fprintf(c.stdout, "rule:     %s\n", cli.Printable(dec.Rule))
	if dec.Code != "" {
		fmt.Fprintf(c.stdout, "code:     %s\n", dec.Code)
	}
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
	fmt.Fprintln(c.stdout, "ladder:")
	for _, s := range dec.Steps {
		fmt.Fprintf(c.stdout, "  %s\n", cli.Printable(s))
	}
	return nil
}

// decideFromConfig decides req with the policy of cfg (the daemon is down). A state dir of
// `postern up` has up's actor, as up would configure it.
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
