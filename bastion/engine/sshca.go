package engine

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/sshca"
)

// openSSHCA is the issuer of this bastion's user certificates when [ssh_ca] is enabled
// (docs/ssh-ca.md), nil when it is not. A single node makes the CA on its first start; a
// replica does not — each would make its own and the hosts trust one — so on etcd the CA
// must exist first (postern ca init on one replica, then its key_dir shared or copied).
// Read-only, nothing is created: an engine without a CA to read cannot ask hosts.
//
// The certificate's principals are the accounts the bastion may use on hosts: every
// enrolled host's account and every account a policy grant names (read per signing, so a
// reload or an enrollment shows at the next renewal; a dial for an account not covered yet
// signs at once). Its key id names the replica.
func openSSHCA(cfg config.Config, inv *fleet.Inventory, rules func() config.Config, replica string, readOnly bool, log *slog.Logger, now func() time.Time) (*sshca.Issuer, error) {
	if !cfg.SSHCA.Enabled {
		return nil, nil
	}
	store := sshca.Open(cfg.SSHCADir())
	if !readOnly && !cfg.Journal.Etcd() {
		if _, created, err := store.Init(now(), "postern serve"); err != nil {
			return nil, fmt.Errorf("bastion: ssh_ca: %w", err)
		} else if created {
			log.Info("created the SSH CA: hosts must trust it (postern ca keys)", "dir", store.Dir())
		}
	}
	if st, err := store.State(); err != nil && !readOnly {
		return nil, fmt.Errorf("bastion: ssh_ca: %w; replicas share one CA: run postern ca init on one of them and share or copy %s to the others", err, store.Dir())
	} else if err == nil && !readOnly {
		// A CA that cannot sign is found at start, not at the first dial.
		g, ok := st.Signing(now())
		if !ok {
			return nil, fmt.Errorf("bastion: ssh_ca: no CA generation signs now (postern ca status)")
		}
		if _, err := store.Signer(g); err != nil {
			return nil, fmt.Errorf("bastion: ssh_ca: %w", err)
		}
	}
	principals := func() []string {
		var out []string
		if hosts, err := inv.Hosts(); err == nil {
			for _, h := range hosts {
				out = append(out, h.Account)
			}
		} else {
			log.Warn("ssh certificate: the inventory could not be read; signing for the accounts asked only", "err", err)
		}
		for _, r := range rules().Rules {
			out = append(out, r.Accounts...)
		}
		return out
	}
	return sshca.NewIssuer(sshca.IssuerOptions{
		Store: store, KeyID: CertKeyID(replica), Lifetime: cfg.SSHCA.CertLifetime,
		Principals: principals, SourceAddresses: cfg.SSHCA.SourceAddresses,
		Logger: log.With("component", "ssh-ca"), Now: now,
	})
}

// CertKeyID is the key id of the certificates of the replica named replica ("" on a single
// node: the machine's name): what a host logs for each login.
func CertKeyID(replica string) string {
	if replica == "" {
		host, _ := os.Hostname()
		return "postern-bastion host=" + host
	}
	return "postern-bastion replica=" + replica
}
