package main

import (
	"context"
	"fmt"
	"regexp"

	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/cli"
)

// namePattern is what the bastion accepts as an actor or host name.
var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// tokenCommand makes a bearer token for an actor and prints it once, with the config lines
// that let the actor in: the config holds the token's SHA-256, never the token.
type tokenCommand struct{ operatorIO }

func (c *tokenCommand) Run(_ context.Context, args []string) error {
	fs := prog.FlagSet("token NAME", c.stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: postern token NAME\n\nMakes a bearer token for actor NAME and prints it once, with the lines to add to the bastion's config.\n")
	}
	pos, err := cli.ParseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	name := pos[0]
	if !namePattern.MatchString(name) {
		return prog.UsageErrorf(c.stderr, "actor name %q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", cli.Printable(name))
	}
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
