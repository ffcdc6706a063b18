package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/user"
	"regexp"
	"strconv"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/tokens"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/dirlock"
)

// namePattern is what the bastion accepts as an actor or host name.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// tokenCommand is `postern token`: the running bastion issues a bearer token for an actor
// (with an id and an expiry) and shows it once; `list` shows the credentials and `revoke`
// ends one at once. --static makes a static token instead and prints the config lines that
// let the actor in (the config holds the token's SHA-256, never the token).
type tokenCommand struct{ operatorIO }

const tokenUsage = `usage: postern token NAME [--expires 30d|12h|2026-12-31T00:00:00Z|never] [--json]
       postern token issue NAME [...]   (the same, for an actor named list, revoke or issue)
       postern token list [--json]
       postern token revoke ID
       postern token --static NAME

  NAME         the running bastion issues a token for remote actor NAME (declared in the
               config with remote = true, or with a static token_sha256), with an id
               (tok_…) and an expiry (default 90d; --expires never for none), and
               prints it once. It is accepted at once; each request is checked against
               its expiry and revocation.
  list         the remote actors' credentials: id, actor, state, issued, expires, revoked,
               last use (since the daemon started); never a token or its hash
  revoke ID    the token is refused from its next request on, on every connection and
               session; logged to <state dir>/tokens.jsonl (who, when, which id). With the
               daemon down, the store is changed under the state dir's lock instead.
  --static     print a new static token and the [[actors]] lines that accept it (no id, no
               expiry, no daemon needed; revoked by removing the lines and postern reload)

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *tokenCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "list":
			return c.list(ctx, args[1:])
		case "revoke":
			return c.revoke(ctx, args[1:])
		case "issue":
			return c.issue(ctx, args[1:])
		case "help", "-h", "--help":
			fmt.Fprint(c.stdout, tokenUsage)
			return nil
		}
	}
	return c.issue(ctx, args)
}

func (c *tokenCommand) issue(ctx context.Context, args []string) error {
	fs, loc := c.tokenFlags("token NAME [flags]")
	static := fs.Bool("static", false, "print a static token and its config lines instead (no id, no expiry)")
	expires := fs.String("expires", "", "when the token stops working: a lifetime (30d, 12h, 90m), an instant (RFC 3339) or never (default 90d)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	name := pos[0]
	if !namePattern.MatchString(name) {
		return prog.UsageErrorf(c.stderr, "actor name %q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", cli.Printable(name))
	}
	if *static {
		if *expires != "" {
			return prog.UsageErrorf(c.stderr, "--expires: a static config token never expires; leave out --static to have the bastion issue one that does")
		}
		return c.printStatic(name)
	}
	// Checked here as well, so that a typo is caught before the daemon is asked.
	if _, err := tokens.ParseExpiry(*expires, time.Now()); err != nil {
		return prog.UsageErrorf(c.stderr, "--expires: %v", err)
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var issued api.IssuedToken
	if err := op.postJSON(ctx, "/v1/tokens", api.TokenRequest{Actor: name, Expires: *expires}, &issued); err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, issued)
	}
	until := "never expires"
	if !issued.View.Expires.IsZero() {
		until = "expires " + issued.View.Expires.UTC().Format(time.RFC3339)
	}
	_, err = fmt.Fprintf(c.stdout, `Bearer token %[1]s for actor %[2]s (%[3]s; shown once: give it to the client, which sends it as
"Authorization: Bearer <token>"):

%[4]s

The bastion accepts it now. postern token list shows it; postern token revoke %[1]s ends it.
`, issued.View.ID, issued.View.Actor, until, issued.Token)
	return err
}

// printStatic is `postern token --config NAME`: a token the config accepts for as long as
// it holds its hash.
func (c *tokenCommand) printStatic(name string) error {
	tok, err := transport.NewToken()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, `Bearer token for actor %[1]s (shown once: give it to the client, which sends it as
"Authorization: Bearer <token>"):

%[2]s

Add the actor to the bastion's config. The config holds only the token's SHA-256; the token
itself must not go in it:

[[actors]]
name = %[1]q
token_sha256 = %[3]q
`, name, tok, transport.HashToken(tok))
	return err
}

// tokenFlags is flagSet with the token command's usage.
func (c *tokenCommand) tokenFlags(usage string) (*flag.FlagSet, *locator) {
	fs, loc := c.flagSet(usage)
	fs.Usage = func() { fmt.Fprint(fs.Output(), tokenUsage+"\nflags:\n"); fs.PrintDefaults() }
	return fs, loc
}

func (c *tokenCommand) list(ctx context.Context, args []string) error {
	fs, loc := c.tokenFlags("token list [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var list api.TokenList
	if err := op.getJSON(ctx, "/v1/tokens", nil, &list); err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, list)
	}
	if len(list.Tokens) == 0 {
		_, err := fmt.Fprintln(c.stdout, "No remote actor has a token: postern token NAME issues one.")
		return err
	}
	rows := make([][]string, 0, len(list.Tokens))
	for _, t := range list.Tokens {
		expires := "never"
		if !t.Expires.IsZero() {
			expires = cli.FormatTime(t.Expires)
		}
		revoked := cli.FormatTime(t.Revoked)
		if t.RevokedBy != "" {
			revoked += " by " + cli.Printable(t.RevokedBy)
		}
		rows = append(rows, []string{t.ID, cli.Printable(t.Actor), t.State, cli.FormatTime(t.Created), expires, revoked, cli.FormatTime(t.LastUsed), cli.Dash(cli.Printable(t.Note))})
	}
	return cli.PrintTable(c.stdout, cli.TableWidth(c.stdout), []string{"ID", "ACTOR", "STATE", "ISSUED", "EXPIRES", "REVOKED", "LAST USED", "NOTE"}, rows)
}

func (c *tokenCommand) revoke(ctx context.Context, args []string) error {
	fs, loc := c.tokenFlags("token revoke ID [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	id := pos[0]
	if !tokens.ValidID(id) {
		return prog.UsageErrorf(c.stderr, "%q is not a token id (tok_ and 16 letters and digits; postern token list shows them). A config token is revoked by removing its actor's token_sha256 and running postern reload", cli.Printable(id))
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var rev api.TokenRevocation
	err = op.postJSON(ctx, "/v1/tokens/"+id+"/revoke", struct{}{}, &rev)
	var ae *apiError
	if errors.As(err, &ae) && ae.Code == api.CodeBastionDown {
		rev, err = c.revokeOffline(loc, id)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, rev)
	}
	if !rev.Changed {
		_, err = fmt.Fprintf(c.stdout, "Token %s (actor %s) was revoked already, at %s by %s.\n", id, rev.View.Actor, cli.FormatTime(rev.View.Revoked), cli.Printable(rev.View.RevokedBy))
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "Revoked token %s (actor %s): its next request is refused, on every connection.\n", id, rev.View.Actor)
	return err
}

// revokeOffline revokes id in the store with the daemon down, holding the state dir's lock
// so that no daemon starts meanwhile: its next start reads the revocation.
func (c *tokenCommand) revokeOffline(loc *locator, id string) (api.TokenRevocation, error) {
	cfg, err := loc.config()
	if err != nil {
		return api.TokenRevocation{}, err
	}
	lock, err := dirlock.Acquire(cfg.StateDir)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return api.TokenRevocation{}, fmt.Errorf("a postern holds %s but does not answer on its operator socket (%v): revoke again once it does", cfg.StateDir, err)
	}
	if err != nil {
		return api.TokenRevocation{}, err
	}
	defer lock.Release()
	store, err := tokens.Open(cfg.StateDir)
	if err != nil {
		return api.TokenRevocation{}, err
	}
	now := time.Now()
	t, changed, err := store.Revoke(id, operatorName(), now)
	if errors.Is(err, tokens.ErrNotFound) {
		return api.TokenRevocation{}, fmt.Errorf("no token %s in %s: postern token list shows the tokens", id, cfg.StateDir)
	}
	if err != nil {
		return api.TokenRevocation{}, err
	}
	fmt.Fprintf(c.stderr, "note: the bastion is not running; revoked in its token store in %s, which its next start reads\n", cfg.StateDir)
	return api.TokenRevocation{View: api.TokenView{ID: t.ID, Actor: t.Actor, Source: "issued", State: string(t.StateAt(now)), Revoked: t.Revoked, RevokedBy: t.RevokedBy}, Changed: changed}, nil
}

// operatorName names this process's user as the operator API names a peer.
func operatorName() string {
	uid := strconv.Itoa(os.Getuid())
	if u, err := user.LookupId(uid); err == nil {
		return "operator:" + u.Username
	}
	return "operator:uid" + uid
}
