package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/locate"
	"github.com/postern-dev/postern/internal/version"
)

// doctorCommand checks what a working installation needs — config, state dir permissions,
// keys, the daemon and its port, every enrolled host (reachable, pinned host key, hostagent
// version) — and prints the fix for each problem.
type doctorCommand struct{ operatorIO }

// doctorCheck is one finding.
type doctorCheck struct {
	Check string `json:"check"`
	// Status is ok, problem or note.
	Status string `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// errDoctorProblems: at least one check found a problem (exit status 1).
var errDoctorProblems = errors.New("doctor found problems")

func (c *doctorCommand) Run(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("doctor [flags]")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := cli.ParseArgs(fs, args, 0); err != nil {
		return err
	}
	checks := c.checks(ctx, loc)
	problems := 0
	for _, ch := range checks {
		if ch.Status == "problem" {
			problems++
		}
	}
	if *asJSON {
		if err := cli.WriteJSON(c.stdout, checks); err != nil {
			return err
		}
	} else {
		for _, ch := range checks {
			// A detail of several lines (a config's problems, one a line) keeps its lines.
			for i, line := range strings.Split(ch.Detail, "\n") {
				if i == 0 {
					fmt.Fprintf(c.stdout, "%-7s %-10s %s\n", ch.Status, ch.Check, cli.Printable(line))
				} else {
					fmt.Fprintf(c.stdout, "        %-10s %s\n", "", cli.Printable(line))
				}
			}
			if ch.Fix != "" {
				label := "fix"
				if ch.Status != "problem" {
					label = "next"
				}
				fmt.Fprintf(c.stdout, "        %-10s %s: %s\n", "", label, cli.Printable(ch.Fix))
			}
		}
	}
	if problems > 0 {
		return fmt.Errorf("%w: %d", errDoctorProblems, problems)
	}
	return nil
}

func (c *doctorCommand) checks(ctx context.Context, loc *locator) []doctorCheck {
	var out []doctorCheck
	add := func(check, status, detail, fix string) {
		out = append(out, doctorCheck{Check: check, Status: status, Detail: detail, Fix: fix})
	}
	cfg, err := loc.config()
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		add("config", "problem", err.Error(), "fix the config file (every problem is listed above), or point --config/--state-dir at the bastion's")
		return out
	}
	add("config", "ok", "valid: "+loc.where(), "")
	out = append(out, stateDirChecks(cfg)...)
	out = append(out, keyChecks(cfg)...)
	out = append(out, sshCAChecks(cfg, time.Now())...)

	add("version", "note", "this CLI and its stdio bridge (postern mcp): "+version.String(), "")
	var rep api.DoctorReport
	op := newOperatorClient(cfg.OperatorSocketPath())
	op.where = loc.where()
	err = op.getJSON(ctx, "/v1/doctor", nil, &rep)
	if errors.Is(err, errBastionDown) {
		add("daemon", "problem", err.Error(), startFix(*loc.found))
		out = append(out, portChecks(cfg.Listen, false)...)
		out = append(out, journalChecks(offlineJournalHealth(ctx, cfg))...)
		add("hosts", "note", "not checked: only the running bastion can reach the hosts with its key", "")
		return out
	}
	if err != nil {
		add("daemon", "problem", err.Error(), "check the operator socket "+cfg.OperatorSocketPath()+" and the daemon's log")
		return out
	}
	if rep.Version != version.String() {
		add("daemon", "problem", "the running bastion is "+rep.Version+", this CLI "+version.String(),
			"restart the daemon so it runs the installed binary (or use the CLI of the same build)")
	} else {
		add("daemon", "ok", "running, "+rep.Version, "")
	}
	// The daemon's own listener, as bound (postern up --listen, a port 0): the config's
	// listen only for a daemon too old to say.
	listen := cfg.Listen
	if rep.Serving != nil {
		listen = rep.Serving.HTTP
		if listen != cfg.Listen && cfg.Listen != "" {
			add("port", "note", fmt.Sprintf("the daemon listens on %s, not on the config's %s (started with --listen?)", orNone(listen), cfg.Listen), "")
		}
	}
	out = append(out, portChecks(listen, true)...)
	if rep.Journal != nil {
		out = append(out, journalChecks(rep.Journal)...)
	}
	if len(rep.Hosts) == 0 {
		add("hosts", "note", "no host is enrolled", "on each host run `postern-hostagent install` and the enroll command it prints")
	}
	for _, h := range rep.Hosts {
		if !h.OK {
			add("host", "problem", fmt.Sprintf("%s (%s): %s", h.Name, h.Addr, h.Problem), h.Fix)
			continue
		}
		switch fleet.Guarantee(h.Guarantee) {
		case fleet.GuaranteeMarkerScript:
			add("host", "ok", fmt.Sprintf("%s (%s): reachable, pinned host key verified, stock sshd with the marker script (digest verified)", h.Name, h.Addr), "")
			continue
		case fleet.GuaranteeNone:
			add("host", "ok", fmt.Sprintf("%s (%s): reachable, pinned host key verified, stock sshd (guarantee none)", h.Name, h.Addr), "")
			continue
		}
		add("host", "ok", fmt.Sprintf("%s (%s): reachable, pinned host key verified, hostagent %s", h.Name, h.Addr, h.Version), "")
		if h.Version != rep.Version {
			add("host", "note", fmt.Sprintf("%s runs hostagent %s, the bastion %s", h.Name, h.Version, rep.Version),
				"upgrade one or the other when convenient: the protocol between them is versioned, the builds need not match")
		}
	}
	return out
}

// startFix says how to start the bastion the discovery rule found.
func startFix(f locate.Found) string {
	switch {
	case f.Source == locate.FromPackaged:
		return "start it: systemctl start postern (the packaged service), or postern serve"
	case f.Source == locate.FromUser:
		return "start it: postern up (the quick start, on this state dir), or postern serve"
	case f.Source == locate.FromFlags && f.Config != "":
		return "start it: postern serve --config " + f.Config + " (or postern up --config " + f.Config + ", with a local hostagent)"
	case f.Source == locate.FromFlags:
		return "start it: postern up --state-dir " + f.Dir + " (quick start) or postern serve --state-dir " + f.Dir
	}
	return "start it: postern up (quick start) or postern serve, with the same " + envConfig + "/" + envStateDir
}

// stateDirChecks: the state dir belongs to this user and admits nobody else.
func stateDirChecks(cfg config.Config) []doctorCheck {
	info, err := os.Stat(cfg.StateDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return []doctorCheck{{Check: "state dir", Status: "note", Detail: cfg.StateDir + " does not exist yet", Fix: "the first postern serve or up creates it"}}
	case err != nil:
		return []doctorCheck{{Check: "state dir", Status: "problem", Detail: err.Error(), Fix: "run doctor as the bastion's user"}}
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return []doctorCheck{{Check: "state dir", Status: "problem", Detail: err.Error(), Fix: "run doctor (and every postern command) as the bastion's user"}}
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return []doctorCheck{{Check: "state dir", Status: "problem", Detail: fmt.Sprintf("%s is mode %04o: other users can reach the journal and keys", cfg.StateDir, perm),
			Fix: "chmod 700 " + cfg.StateDir + " (postern serve also tightens it at start)"}}
	}
	return []doctorCheck{{Check: "state dir", Status: "ok", Detail: cfg.StateDir + ": yours, mode 0700", Fix: ""}}
}

// keyChecks: the client key and its public half, and the audit key: present, private, and
// the public file matching the key.
func keyChecks(cfg config.Config) []doctorCheck {
	var out []doctorCheck
	for _, p := range []string{cfg.ClientKeyPath(), cfg.AuditKeyPath()} {
		info, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			out = append(out, doctorCheck{Check: "keys", Status: "note", Detail: p + " does not exist yet", Fix: "the first postern serve or up creates it"})
			continue
		case err != nil:
			out = append(out, doctorCheck{Check: "keys", Status: "problem", Detail: err.Error(), Fix: "run doctor as the bastion's user"})
			continue
		case info.Mode().Perm()&0o077 != 0:
			out = append(out, doctorCheck{Check: "keys", Status: "problem", Detail: fmt.Sprintf("%s is mode %04o", p, info.Mode().Perm()), Fix: "chmod 600 " + p})
			continue
		}
		out = append(out, doctorCheck{Check: "keys", Status: "ok", Detail: p + ": mode 0600"})
	}
	data, err := os.ReadFile(cfg.ClientKeyPath())
	if err != nil {
		return out
	}
	signer, err := gossh.ParsePrivateKey(data)
	if err != nil {
		return append(out, doctorCheck{Check: "keys", Status: "problem", Detail: fmt.Sprintf("%s: %v", cfg.ClientKeyPath(), err),
			Fix: "restore the key from a backup; a new key must be authorized on every host again"})
	}
	line := gossh.MarshalAuthorizedKey(signer.PublicKey())
	pub, err := os.ReadFile(cfg.ClientPublicKeyPath())
	if err != nil || string(pub) != string(line) {
		return append(out, doctorCheck{Check: "keys", Status: "problem", Detail: cfg.ClientPublicKeyPath() + " is missing or does not match the client key",
			Fix: "postern hosts key rewrites it"})
	}
	return append(out, doctorCheck{Check: "keys", Status: "ok", Detail: "client key " + gossh.FingerprintSHA256(signer.PublicKey()) + " (postern hosts key prints the line hosts authorize)"})
}

// portChecks: the HTTP listen address answers while the daemon runs, and is free while it
// does not.
func portChecks(listen string, running bool) []doctorCheck {
	if listen == "" {
		return []doctorCheck{{Check: "port", Status: "note", Detail: "Streamable HTTP is disabled (listen = \"\"): local agents only"}}
	}
	if running {
		conn, err := net.DialTimeout("tcp", listen, 3*time.Second)
		if err != nil {
			return []doctorCheck{{Check: "port", Status: "problem", Detail: fmt.Sprintf("nothing answers on %s: %v", listen, err),
				Fix: "is the running bastion configured with another listen address? Check the config it was started with"}}
		}
		conn.Close()
		return []doctorCheck{{Check: "port", Status: "ok", Detail: "Streamable HTTP answers on " + listen}}
	}
	l, err := net.Listen("tcp", listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return []doctorCheck{{Check: "port", Status: "problem", Detail: listen + " is in use by another process",
			Fix: "stop that process, or choose another address: listen in the config (postern up: --listen)"}}
	}
	if err != nil {
		return []doctorCheck{{Check: "port", Status: "problem", Detail: fmt.Sprintf("%s: %v", listen, err), Fix: "set listen in the config to an address of this machine"}}
	}
	l.Close()
	return []doctorCheck{{Check: "port", Status: "ok", Detail: listen + " is free for the bastion"}}
}
