package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/envpolicy"
)

// hostsCommand lists the enrolled hosts and enrolls new ones. Enrollment writes the
// inventory file, which the daemon re-reads on its next lookup, so it needs no daemon.
type hostsCommand struct{ operatorIO }

const hostsUsage = `usage: postern hosts SUBCOMMAND [flags]

subcommands:
  list [--label KEY=VALUE,...] [--limit N [--cursor NAME]] [--json]
                 the enrolled hosts (from the inventory file when the bastion is down),
                 those with every label given; --limit: one page, and the next one's cursor
  enroll NAME ADDR [--account USER] [--cwd DIR] [--group G]... [--accept-env NAME]...
         [--description TEXT] [--label KEY=VALUE]... [--os OS]
         [--expect-host-key SHA256:…] [--yes] [--replace] [--agentless [--marker-script]]
                 scan the host's key, show it, and record it once confirmed (or, with
                 --expect-host-key, once it matches the fingerprint postern-hostagent
                 install printed on the host); --agentless: the host runs a stock sshd,
                 no hostagent (guarantee none); --marker-script: and install the marker
                 script ~/.postern/run there over SSH (guarantee marker_script; the
                 bastion's key must be in the account's authorized_keys first)
  import FILE [--format toml|csv] [--account USER] [--replace] [--dry-run] [--json]
                 enroll every host of a TOML or CSV file (name, addr, account,
                 host_key, labels, description…) in one change: every host is checked
                 first, and with any problem (reported by line) nothing is imported;
                 host_key is the host's public key, its fingerprint SHA256:… (the
                 host is asked for its key, which must match), or @cert-authority
                 (a [[host_cas]] CA vouches for it)
  label NAME [KEY=VALUE | KEY-]... [--description TEXT] [--os OS]
                 set or remove labels (env=prod, role=db), the description and the OS
                 agents read in hosts_list
  key            print the bastion's public key: the line every hostagent's
                 authorized_keys file needs (also in the state dir, bastion_ed25519.pub)

common flags: --state-dir DIR, --config FILE (where the bastion is)
`

func (c *hostsCommand) Run(ctx context.Context, args []string) error {
	return prog.Dispatch(ctx, "hosts", hostsUsage, cli.Subcommands{"list": c.list, "enroll": c.enroll, "import": c.importFile, "label": c.label, "key": c.key}, args, c.stdout, c.stderr)
}

func (c *hostsCommand) list(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("hosts list [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	labels := fs.String("label", "", "only hosts with these labels, KEY=VALUE[,KEY=VALUE…] (e.g. role=db,env=prod)")
	limit := fs.Int("limit", 0, fmt.Sprintf("print one page of at most this many hosts (1-%d) and the cursor of the next; default every host", fleet.MaxHostsPage))
	cursor := fs.String("cursor", "", "start after this host (the cursor a --limit page printed)")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	if *limit < 0 || *limit > fleet.MaxHostsPage {
		return prog.UsageErrorf(c.stderr, "--limit must be in 1..%d", fleet.MaxHostsPage)
	}
	if _, err := fleet.ParseSelector(*labels); err != nil {
		return prog.UsageErrorf(c.stderr, "--label: %v", err)
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	res, live, err := c.hostsPages(ctx, cfg, api.HostsArgs{Labels: *labels, Cursor: *cursor, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.WriteJSON(c.stdout, res)
	}
	rows := make([][]string, 0, len(res.Hosts))
	for _, h := range res.Hosts {
		connected := "no"
		switch {
		case !live:
			connected = "-"
		case h.Connected:
			connected = "yes"
		}
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(h.Labels)) {
			labels = append(labels, k+"="+h.Labels[k])
		}
		rows = append(rows, []string{cli.Printable(h.Name), cli.Printable(h.Addr), cli.Printable(h.Account),
			cli.Printable(strings.TrimSpace(h.HostKeyType + " " + h.HostKey)), guaranteeText(fleet.Guarantee(h.Guarantee)), connected, cli.Printable(strings.Join(h.Groups, ",")),
			cli.Printable(strings.Join(labels, ",")), cli.Printable(h.OS)})
	}
	if err := cli.PrintTable(c.stdout, 0, []string{"NAME", "ADDR", "ACCOUNT", "HOST KEY", "GUARANTEE", "CONNECTED", "GROUPS", "LABELS", "OS"}, rows); err != nil {
		return err
	}
	if res.NextCursor != "" {
		fmt.Fprintf(c.stdout, "%d of %d hosts; next page: --cursor %s\n", len(res.Hosts), res.Total, res.NextCursor)
	}
	return nil
}

// hostsPages asks the daemon for the hosts a selects (or reads the inventory when it is
// down: live is false): the page of a.Limit hosts, or with no limit every page, in order.
func (c *hostsCommand) hostsPages(ctx context.Context, cfg config.Config, a api.HostsArgs) (res api.HostsResult, live bool, err error) {
	res.Hosts = []api.HostInfo{}
	live = true
	for {
		var page api.HostsResult
		if live {
			q := url.Values{"labels": {a.Labels}, "cursor": {a.Cursor}}
			if a.Limit > 0 {
				q.Set("limit", strconv.Itoa(a.Limit))
			}
			err = newOperatorClient(cfg.OperatorSocketPath()).getJSON(ctx, "/v1/hosts", q, &page)
			if errors.Is(err, errBastionDown) && len(res.Hosts) == 0 {
				fmt.Fprintf(c.stderr, "note: %v; reading the inventory %s directly (connections unknown)\n", err, cfg.InventoryPath())
				live = false
			}
		}
		if !live {
			page, err = readInventoryHosts(cfg.InventoryPath(), a)
		}
		if err != nil {
			return res, live, err
		}
		res.Hosts = append(res.Hosts, page.Hosts...)
		res.Total, res.NextCursor = page.Total, page.NextCursor
		if a.Limit > 0 || page.NextCursor == "" {
			return res, live, nil
		}
		a.Cursor = page.NextCursor
	}
}

// guaranteeText is a host's guarantee level as the hosts table shows it.
func guaranteeText(g fleet.Guarantee) string {
	switch g {
	case fleet.GuaranteeMarkerScript:
		return "marker script"
	case fleet.GuaranteeNone:
		return "none"
	}
	return "hostagent"
}

// readInventoryHosts reads the inventory file as the daemon would list it, without
// connection states: the page a asks for.
func readInventoryHosts(path string, a api.HostsArgs) (api.HostsResult, error) {
	inv, err := fleet.OpenInventory(path)
	if err != nil {
		return api.HostsResult{}, err
	}
	hosts, err := inv.Hosts()
	if err != nil {
		return api.HostsResult{}, err
	}
	sel, err := fleet.ParseSelector(a.Labels)
	if err != nil {
		return api.HostsResult{}, err
	}
	page, next, total, err := fleet.PageHosts(hosts, sel, a.Cursor, a.Limit)
	if err != nil {
		return api.HostsResult{}, err
	}
	res := api.HostsResult{Hosts: []api.HostInfo{}, Total: total, NextCursor: next}
	for _, h := range page {
		res.Hosts = append(res.Hosts, api.HostInfo{
			Name: h.Name, Addr: h.Addr, Account: h.Account, Description: h.Description, Labels: h.Labels, OS: h.OS,
			HostKey:     h.Fingerprint(),
			HostKeyType: h.KeyType(), Groups: h.Groups, DefaultCwd: h.Cwd, Guarantee: string(h.Level()),
		})
	}
	return res, nil
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

var _ flag.Value = (*stringList)(nil)

// errNotConfirmed: the operator did not confirm the host key.
var errNotConfirmed = errors.New("not enrolled: the host key was not confirmed")

// maxAnswerBytes bounds the confirmation line read from stdin.
const maxAnswerBytes = 1 << 10

func (c *hostsCommand) enroll(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("hosts enroll NAME ADDR [flags]")
	account := fs.String("account", "", "the account commands run as on the host (default the current user)")
	cwd := fs.String("cwd", "", "the default working directory on the host (absolute; default the account's home)")
	var groups stringList
	fs.Var(&groups, "group", "a group the host belongs to (repeatable)")
	var acceptEnv stringList
	fs.Var(&acceptEnv, "accept-env", "a variable (or PREFIX*) the host's hostagent accepts in accept_env, so agents may set it (repeatable)")
	description := fs.String("description", "", "what the host is, in one line agents read in hosts_list (re-enrolling without it keeps the old one)")
	var labelFlags stringList
	fs.Var(&labelFlags, "label", "a label agents read, KEY=VALUE, e.g. env=prod (repeatable; re-enrolling without any keeps the old ones)")
	osName := fs.String("os", "", "the host's operating system, e.g. \"Debian 12\" (re-enrolling without it keeps the old one)")
	yes := fs.Bool("yes", false, "record the key without asking")
	expect := fs.String("expect-host-key", "", "the host key fingerprint (SHA256:…) the host must present; a match needs no confirmation")
	replace := fs.Bool("replace", false, "record the key even though the host was enrolled with another one")
	agentlessHost := fs.Bool("agentless", false, "the host runs a stock OpenSSH server, no hostagent: an outcome lost after dispatch is unknown for good (guarantee none)")
	markerScript := fs.Bool("marker-script", false, "with --agentless: install the marker script ~/.postern/run over SSH, so lost outcomes are resolved from its marker (guarantee marker_script)")
	pos, err := cli.ParseArgs(fs, args, 2)
	if err != nil {
		return err
	}
	name, addr := pos[0], pos[1]
	// Checked before the operator is asked about the key, not after.
	if !namePattern.MatchString(name) {
		return prog.UsageErrorf(c.stderr, "host name %q: want 1-64 of [A-Za-z0-9_.-], starting with a letter or digit", name)
	}
	if *cwd != "" && (!filepath.IsAbs(*cwd) || filepath.Clean(*cwd) != *cwd) {
		return prog.UsageErrorf(c.stderr, "--cwd %q: want an absolute, clean path", *cwd)
	}
	if _, err := envpolicy.New(acceptEnv); err != nil {
		return prog.UsageErrorf(c.stderr, "--accept-env: %v", err)
	}
	if *markerScript && !*agentlessHost {
		return prog.UsageErrorf(c.stderr, "--marker-script is for hosts without the hostagent: add --agentless")
	}
	labels, err := parseLabels(labelFlags)
	if err == nil {
		err = fleet.ValidateHostInfo(*description, labels, *osName)
	}
	if err != nil {
		return prog.UsageErrorf(c.stderr, "%v", err)
	}
	if *account == "" {
		u, err := user.Current()
		if err != nil {
			return fmt.Errorf("--account: no current user: %w", err)
		}
		*account = u.Username
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}

	key, err := fleet.ScanHostKey(ctx, addr)
	if err != nil {
		return err
	}
	h := fleet.Host{Name: name, Addr: addr, Account: *account, HostKey: key, Cwd: *cwd, Groups: groups, AcceptEnv: acceptEnv,
		Description: *description, Labels: labels, OS: *osName}
	if err := keepHostInfo(cfg.InventoryPath(), &h); err != nil {
		return err
	}
	if *agentlessHost {
		h.Guarantee = fleet.GuaranteeNone
	}
	plan, err := fleet.PlanEnrollment(cfg.InventoryPath(), h)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "host %s at %s presents %s %s\n", cli.Printable(name), cli.Printable(addr), key.Type(), plan.Fingerprint)
	if *expect != "" && *expect != plan.Fingerprint {
		return fmt.Errorf("host %s at %s presents %s, not the expected %s: the address reaches another machine, or someone is in the middle; nothing was enrolled",
			cli.Printable(name), cli.Printable(addr), plan.Fingerprint, cli.Printable(*expect))
	}
	alreadyTrusted := false
	switch {
	case plan.Replaces != "" && !*replace:
		fmt.Fprintf(c.stderr, "WARNING: host %s was enrolled with key %s, but %s now presents %s.\n"+
			"This is a different machine, a reinstalled one, or someone in the middle. Check the new key\n"+
			"out of band (on the host: ssh-keygen -lf <its host key>.pub) before re-enrolling with --replace.\n",
			cli.Printable(name), plan.Replaces, cli.Printable(addr), plan.Fingerprint)
		return fmt.Errorf("refusing to replace host %s's key %s with %s (use --replace once you have checked it)", cli.Printable(name), plan.Replaces, plan.Fingerprint)
	case plan.Replaces != "":
		fmt.Fprintf(c.stdout, "this replaces host %s's enrolled key %s\n", cli.Printable(name), plan.Replaces)
	default:
		alreadyTrusted, err = keyEnrolled(cfg.InventoryPath(), name)
		if err != nil {
			return err
		}
	}
	switch {
	case alreadyTrusted:
		fmt.Fprintf(c.stdout, "the key is the one already enrolled for %s\n", cli.Printable(name))
	case *expect != "":
		fmt.Fprintf(c.stdout, "the key matches the expected %s\n", plan.Fingerprint)
	case !*yes:
		ok, err := confirm(c.stdin, c.stdout, "Record this key? [y/N] ")
		if err != nil {
			return err
		}
		if !ok {
			return errNotConfirmed
		}
	}
	if *markerScript {
		if err := c.installMarkerScript(ctx, cfg, &h); err != nil {
			return err
		}
	}
	if err := fleet.Enroll(cfg.InventoryPath(), h); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "enrolled host %s (%s, account %s, guarantee %s) in %s\n", cli.Printable(name), cli.Printable(addr), cli.Printable(*account), guaranteeText(h.Level()), cfg.InventoryPath())
	if h.Level() == fleet.GuaranteeMarkerScript {
		return nil // the key is in place: the install used it
	}
	return c.printBastionKey(ctx, cfg, h)
}

// installMarkerScript installs the marker script on h over SSH, with the pinned key the
// operator just confirmed, and records its digest in h. Without the bastion's key in the
// account's authorized_keys nothing is enrolled: the operator is shown the line to add.
func (c *hostsCommand) installMarkerScript(ctx context.Context, cfg config.Config, h *fleet.Host) error {
	signer, err := bastionLogin(cfg, h.Account)
	if err != nil {
		return err
	}
	digest, err := fleet.InstallMarkerScript(ctx, *h, signer)
	if err != nil && strings.Contains(err.Error(), "unable to authenticate") {
		lines, lerr := trustLines(cfg, signer)
		if lerr != nil {
			return lerr
		}
		if cfg.SSHCA.Enabled {
			fmt.Fprintf(c.stdout, "\nsshd on %s does not accept the bastion's ssh certificate yet. Put these lines in the file its TrustedUserCAKeys names, then run this command again:\n\n",
				cli.Printable(h.Name))
		} else {
			fmt.Fprintf(c.stdout, "\nsshd on %s does not accept the bastion's key yet. Add this line to ~%s/.ssh/authorized_keys there, then run this command again:\n\n",
				cli.Printable(h.Name), cli.Printable(h.Account))
		}
		c.stdout.Write(lines)
		return fmt.Errorf("not enrolled: the marker script could not be installed on %s: %w", cli.Printable(h.Name), err)
	}
	if err != nil {
		return fmt.Errorf("not enrolled: %w", err)
	}
	h.Guarantee, h.ScriptSHA256 = fleet.GuaranteeMarkerScript, digest
	fmt.Fprintf(c.stdout, "installed the marker script ~/.postern/run on %s (sha256 %s)\n", cli.Printable(h.Name), digest)
	return nil
}

// keepHostInfo carries the description, labels and OS of a host enrolled again over to h
// where the enrollment gives none: re-enrolling (a new key, a new address) keeps what agents
// are told about the host.
func keepHostInfo(inventory string, h *fleet.Host) error {
	inv, err := fleet.OpenInventory(inventory)
	if err != nil {
		return err
	}
	old, err := inv.Host(h.Name)
	if errors.Is(err, fleet.ErrUnknownHost) {
		return nil
	}
	if err != nil {
		return err
	}
	h.Description = cmp.Or(h.Description, old.Description)
	h.OS = cmp.Or(h.OS, old.OS)
	if h.Labels == nil {
		h.Labels = old.Labels
	}
	return nil
}

// keyEnrolled reports whether name is already in the inventory (PlanEnrollment has found
// its key to be the same one).
func keyEnrolled(inventory, name string) (bool, error) {
	inv, err := fleet.OpenInventory(inventory)
	if err != nil {
		return false, err
	}
	_, err = inv.Host(name)
	if errors.Is(err, fleet.ErrUnknownHost) {
		return false, nil
	}
	return err == nil, err
}

// confirm asks question and reads one line: only y or yes (any case) confirms.
func confirm(stdin io.Reader, stdout io.Writer, question string) (bool, error) {
	fmt.Fprint(stdout, question)
	line, err := bufio.NewReaderSize(io.LimitReader(stdin, maxAnswerBytes), 64).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read the answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// key prints the bastion's public client key (creating the key pair on first use, as the
// daemon would).
func (c *hostsCommand) key(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("hosts key [flags]")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}
	signer, err := fleet.LoadOrCreateClientKey(cfg.ClientKeyPath())
	if err != nil {
		return err
	}
	if cfg.SSHCA.Enabled {
		fmt.Fprintln(c.stderr, "note: [ssh_ca] is enabled: the bastion logs in with certificates of its CA, never with this key; hosts trust the CA instead (postern ca keys), and this key can be removed from them (docs/ssh-ca.md)")
	}
	_, err = c.stdout.Write(gossh.MarshalAuthorizedKey(signer.PublicKey()))
	return err
}

// keyCheckTimeout bounds the login enroll tries with the bastion's key.
const keyCheckTimeout = 10 * time.Second

// printBastionKey says whether the host already accepts the bastion's key — it logs in with
// it, over the pinned host key, as the daemon would — and when it does not (or that cannot be
// told), prints the line the host must authorize: the bastion's public client key, for its
// hostagent or, without one, for sshd. A state dir without a key gets one now, as the daemon
// would on its first start.
func (c *hostsCommand) printBastionKey(ctx context.Context, cfg config.Config, h fleet.Host) error {
	signer, err := bastionLogin(cfg, h.Account)
	if err != nil {
		return fmt.Errorf("the host is enrolled, but the bastion's client key cannot be read: %w", err)
	}
	accepted, err := acceptsKey(ctx, h, signer)
	switch {
	case accepted && cfg.SSHCA.Enabled:
		fmt.Fprintf(c.stdout, "%s accepts the bastion's ssh certificate as %s: ready\n", cli.Printable(h.Name), cli.Printable(h.Account))
		return nil
	case accepted:
		fmt.Fprintf(c.stdout, "%s accepts the bastion's key as %s: ready\n", cli.Printable(h.Name), cli.Printable(h.Account))
		return nil
	case err != nil:
		fmt.Fprintf(c.stdout, "(whether %s accepts the bastion's key could not be checked: %s)\n", cli.Printable(h.Name), cli.Printable(err.Error()))
	}
	if cfg.SSHCA.Enabled {
		lines, err := trustLines(cfg, signer)
		if err != nil {
			return err
		}
		if h.Level() == fleet.GuaranteeHostagent {
			fmt.Fprintf(c.stdout, "\nOn %s, put these lines in the hostagent's trusted_user_ca_keys_file (no authorized key is needed; %s must be in its allowed_accounts):\n\n", cli.Printable(h.Name), cli.Printable(h.Account))
		} else {
			fmt.Fprintf(c.stdout, "\nOn %s, put these lines in the file sshd's TrustedUserCAKeys names (no authorized key is needed):\n\n", cli.Printable(h.Name))
		}
		_, err = c.stdout.Write(lines)
		return err
	}
	if h.Level() == fleet.GuaranteeHostagent {
		fmt.Fprintf(c.stdout, "\nOn %s, add the bastion's key to the hostagent's authorized_keys file (its authorized_keys_file setting):\n\n", cli.Printable(h.Name))
	} else {
		fmt.Fprintf(c.stdout, "\nOn %s, add the bastion's key to ~%s/.ssh/authorized_keys (sshd's AuthorizedKeysFile):\n\n", cli.Printable(h.Name), cli.Printable(h.Account))
	}
	_, err = c.stdout.Write(gossh.MarshalAuthorizedKey(signer.PublicKey()))
	return err
}

// checkOwnState refuses to write into a state dir that belongs to another user: the files
// enrollment writes (the inventory, the client key) would become unreadable to the daemon.
func checkOwnState(dir string) error {
	info, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil // created by us, for us
	}
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Getuid(); int(st.Uid) != uid {
		owner := fmt.Sprint(st.Uid)
		if u, err := user.LookupId(owner); err == nil {
			owner = u.Username
		}
		return fmt.Errorf("state dir %s belongs to %s: run this as that user (e.g. sudo -u %s postern hosts enroll ...) so the bastion can read what it writes",
			filepath.Clean(dir), owner, owner)
	}
	return nil
}

// acceptsKey logs in to h with signer, checking its pinned host key: true when the host
// accepts the key; false with no error when it refused it; an error when that could not be
// told (the host cannot be reached, or another failure).
func acceptsKey(ctx context.Context, h fleet.Host, signer gossh.Signer) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, keyCheckTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", h.Addr)
	if err != nil {
		return false, err
	}
	defer raw.Close()
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	conn, _, _, err := gossh.NewClientConn(raw, h.Addr, &gossh.ClientConfig{
		User:              h.Account,
		Auth:              []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback:   gossh.FixedHostKey(h.HostKey),
		HostKeyAlgorithms: []string{h.HostKey.Type()},
	})
	switch {
	case err == nil:
		conn.Close()
		return true, nil
	case strings.Contains(err.Error(), "unable to authenticate"):
		return false, nil
	}
	return false, err
}
