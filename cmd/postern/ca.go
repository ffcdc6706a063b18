package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/sshca"
	"github.com/postern-dev/postern/internal/cli"
)

// caCommand is `postern ca`: the bastion's SSH user certificate authority ([ssh_ca],
// docs/ssh-ca.md). It changes the CA's files in its key_dir, which the daemon (and every
// replica sharing the dir) reads again on its own; no daemon is needed.
type caCommand struct{ operatorIO }

const caUsage = `usage: postern ca SUBCOMMAND [flags]

subcommands:
  init           make the CA (its first key) if there is none, and print the line hosts
                 trust; postern serve makes it too on a single node with [ssh_ca] enabled
  keys           print the CA keys hosts must trust now: the lines of the hostagent's
                 trusted_user_ca_keys_file, or of sshd's TrustedUserCAKeys file
  status [--json]
                 every CA key: signing, pending (from when), previous or retired
  rotate [--overlap DURATION]
                 make the next CA key; it signs after the overlap (default [ssh_ca]
                 rotation_overlap, 24h), by when every host must trust it (postern ca keys)
  activate       the pending key signs now (every host already trusts it)
  retire [--force]
                 retire the keys older than the one signing, once their certificates have
                 expired (--force: now); their private keys are deleted, and hosts may
                 drop them (postern ca keys no longer lists them)

Each change is logged to events.jsonl in the CA's key_dir (default <state dir>/ssh_ca).

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *caCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "ca", caUsage, cli.Subcommands{
		"init": c.init, "keys": c.keys, "status": c.status, "rotate": c.rotate, "activate": c.activate, "retire": c.retire,
	}, args, c.stdout, c.stderr)
}

// parse parses args (none positional) and opens the CA of the located config.
func parseCA(fs *flag.FlagSet, loc *locator, args []string) (*sshca.Store, config.Config, error) {
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return nil, config.Config{}, err
	}
	cfg, err := loc.config()
	if err != nil {
		return nil, config.Config{}, err
	}
	return sshca.Open(cfg.SSHCADir()), cfg, nil
}

func (c *caCommand) init(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("ca init [flags]")
	s, cfg, err := parseCA(fs, loc, args)
	if err != nil {
		return err
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}
	st, created, err := s.Init(time.Now(), "postern ca init")
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(c.stdout, "made the SSH CA in %s; every host must trust this line (postern ca keys prints it again):\n", s.Dir())
	} else {
		fmt.Fprintf(c.stdout, "the SSH CA in %s exists; the lines hosts trust:\n", s.Dir())
	}
	fmt.Fprint(c.stdout, st.TrustedLines())
	if !cfg.SSHCA.Enabled {
		fmt.Fprintln(c.stdout, "([ssh_ca] is not enabled yet: the bastion still logs in with its static key until you set enabled = true and restart it)")
	}
	return nil
}

func (c *caCommand) keys(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("ca keys [flags]")
	s, _, err := parseCA(fs, loc, args)
	if err != nil {
		return err
	}
	st, err := s.State()
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(c.stdout, st.TrustedLines())
	return err
}

// caKeyStatus is one CA key in `postern ca status --json`.
type caKeyStatus struct {
	sshca.Generation
	State string `json:"state"` // signing, pending, previous, retired
}

func (c *caCommand) status(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("ca status [--json] [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	s, cfg, err := parseCA(fs, loc, args)
	if err != nil {
		return err
	}
	st, err := s.State()
	if err != nil {
		return err
	}
	now := time.Now()
	signing, _ := st.Signing(now)
	var keys []caKeyStatus
	for _, g := range st.Generations {
		state := "previous"
		switch {
		case !g.Retired.IsZero():
			state = "retired"
		case g.ID == signing.ID:
			state = "signing"
		case now.Before(g.SignsFrom):
			state = "pending"
		}
		keys = append(keys, caKeyStatus{Generation: g, State: state})
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, map[string]any{"enabled": cfg.SSHCA.Enabled, "dir": s.Dir(), "cert_lifetime": cfg.SSHCA.CertLifetime.String(), "keys": keys})
	}
	fmt.Fprintf(c.stdout, "ssh_ca enabled: %v, certificates valid %v, in %s\n", cfg.SSHCA.Enabled, cfg.SSHCA.CertLifetime, s.Dir())
	rows := make([][]string, 0, len(keys))
	for _, k := range keys {
		when := k.SignsFrom.UTC().Format(time.RFC3339)
		if !k.Retired.IsZero() {
			when = "retired " + k.Retired.UTC().Format(time.RFC3339)
		}
		rows = append(rows, []string{strconv.Itoa(k.ID), k.State, k.Fingerprint, when})
	}
	return cli.PrintTable(c.stdout, 0, []string{"GENERATION", "STATE", "FINGERPRINT", "SIGNS FROM"}, rows)
}

func (c *caCommand) rotate(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("ca rotate [--overlap DURATION] [flags]")
	overlap := fs.String("overlap", "", "how long until the new key signs (default [ssh_ca] rotation_overlap); 0s signs at once, for hosts that already trust it")
	s, cfg, err := parseCA(fs, loc, args)
	if err != nil {
		return err
	}
	d := cfg.SSHCA.RotationOverlap
	if *overlap != "" {
		if d, err = time.ParseDuration(*overlap); err != nil || d < 0 {
			return prog.UsageErrorf(c.stderr, "--overlap %q: want a duration such as 24h or 0s", *overlap)
		}
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}
	g, err := s.Rotate(time.Now(), d, "postern ca rotate")
	if err != nil {
		return err
	}
	st, err := s.State()
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "made CA generation %d (%s); it signs from %s.\nBefore then, every host must trust these lines (its trusted_user_ca_keys_file, or sshd's TrustedUserCAKeys):\n",
		g.ID, g.Fingerprint, g.SignsFrom.UTC().Format(time.RFC3339))
	fmt.Fprint(c.stdout, st.TrustedLines())
	return nil
}

func (c *caCommand) activate(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("ca activate [flags]")
	s, cfg, err := parseCA(fs, loc, args)
	if err != nil {
		return err
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}
	g, err := s.Activate(time.Now(), "postern ca activate")
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "CA generation %d (%s) signs from now on; the bastion's next certificate is signed with it\n", g.ID, g.Fingerprint)
	return nil
}

func (c *caCommand) retire(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("ca retire [--force] [flags]")
	force := fs.Bool("force", false, "retire now, even though certificates of the old keys may still be valid (hosts that drop them refuse those)")
	s, cfg, err := parseCA(fs, loc, args)
	if err != nil {
		return err
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}
	retired, err := s.Retire(time.Now(), cfg.SSHCA.CertLifetime, *force, "postern ca retire")
	if err != nil {
		return err
	}
	for _, g := range retired {
		fmt.Fprintf(c.stdout, "retired CA generation %d (%s): its key is deleted\n", g.ID, g.Fingerprint)
	}
	st, err := s.State()
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "hosts may now trust these lines only:\n%s", st.TrustedLines())
	return nil
}

// cliCertLifetime bounds the certificate the CLI signs itself to check or set up a host.
const cliCertLifetime = 5 * time.Minute

// bastionLogin is the signer the CLI logs in to a host with, as the daemon would: with
// [ssh_ca] enabled, a certificate of the CA for account (valid cliCertLifetime, key id naming
// the CLI), and nothing else; otherwise the bastion's static key. A single node's CA is made
// here if the daemon has not made it yet.
func bastionLogin(cfg config.Config, account string) (gossh.Signer, error) {
	if !cfg.SSHCA.Enabled {
		return fleet.LoadOrCreateClientKey(cfg.ClientKeyPath())
	}
	store := sshca.Open(cfg.SSHCADir())
	if !cfg.Journal.Etcd() {
		if _, _, err := store.Init(time.Now(), "postern hosts"); err != nil {
			return nil, err
		}
	}
	host, _ := os.Hostname()
	iss, err := sshca.NewIssuer(sshca.IssuerOptions{
		Store: store, KeyID: "postern-cli host=" + host, Lifetime: cliCertLifetime,
		Principals: func() []string { return []string{account} }, SourceAddresses: cfg.SSHCA.SourceAddresses,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	return iss.Signer(account)
}

// trustLines is what a host must be given so the bastion can log in: the CA's lines with
// [ssh_ca] enabled, else the static key's authorized_keys line.
func trustLines(cfg config.Config, signer gossh.Signer) ([]byte, error) {
	if !cfg.SSHCA.Enabled {
		return gossh.MarshalAuthorizedKey(signer.PublicKey()), nil
	}
	st, err := sshca.Open(cfg.SSHCADir()).State()
	if err != nil {
		return nil, err
	}
	return []byte(st.TrustedLines()), nil
}

// sshCAChecks are doctor's checks of [ssh_ca]: the CA exists and a generation signs, with its
// key private; a pending generation says by when hosts must trust it, and generations kept
// past their certificates' lifetime say they can be retired. None when the CA is off.
func sshCAChecks(cfg config.Config, now time.Time) []doctorCheck {
	if !cfg.SSHCA.Enabled {
		return nil
	}
	const check = "ssh ca"
	store := sshca.Open(cfg.SSHCADir())
	st, err := store.State()
	if err != nil {
		return []doctorCheck{{Check: check, Status: "problem", Detail: err.Error(), Fix: "postern ca init (replicas: on one, then share key_dir)"}}
	}
	g, ok := st.Signing(now)
	if !ok {
		return []doctorCheck{{Check: check, Status: "problem", Detail: "no CA generation signs now", Fix: "postern ca status; postern ca activate"}}
	}
	if _, err := store.Signer(g); err != nil {
		return []doctorCheck{{Check: check, Status: "problem", Detail: err.Error(), Fix: "restore the CA's key from where key_dir is kept, or rotate (postern ca rotate)"}}
	}
	out := []doctorCheck{{Check: check, Status: "ok", Detail: fmt.Sprintf("generation %d (%s) signs certificates valid %v", g.ID, g.Fingerprint, cfg.SSHCA.CertLifetime)}}
	if p, ok := st.Pending(now); ok {
		out = append(out, doctorCheck{Check: check, Status: "note", Detail: fmt.Sprintf("generation %d signs from %s", p.ID, p.SignsFrom.UTC().Format(time.RFC3339)),
			Fix: "before then, every host must trust what postern ca keys prints"})
	}
	for _, old := range st.Trusted() {
		if old.ID < g.ID && !now.Before(g.SignsFrom.Add(cfg.SSHCA.CertLifetime)) {
			out = append(out, doctorCheck{Check: check, Status: "note", Detail: fmt.Sprintf("generation %d no longer signs and none of its certificates is valid", old.ID),
				Fix: "postern ca retire, then give hosts what postern ca keys prints"})
		}
	}
	return out
}
