package hostagent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ErrAccountNotAllowed is returned for an SSH user name the hostagent may not run commands as.
var ErrAccountNotAllowed = errors.New("account not allowed")

// Account is the local account a command runs as.
type Account struct {
	Name  string
	Home  string
	Shell string // the account's login shell from /etc/passwd, or Config.Shell when unknown
	// Credential switches the child to the account's uid, gid and supplementary groups; nil
	// when the hostagent already runs as this account and does not switch.
	Credential *syscall.Credential
}

// accountResolver maps an SSH user name to a local account.
type accountResolver struct {
	allowed      []string
	defaultShell string
	euid         int
	self         *user.User // the account the hostagent runs as
}

func newAccountResolver(cfg Config) (*accountResolver, error) {
	self, err := user.Current()
	if err != nil {
		return nil, fmt.Errorf("resolve own account: %w", err)
	}
	return &accountResolver{allowed: cfg.AllowedAccounts, defaultShell: cfg.Shell, euid: os.Geteuid(), self: self}, nil
}

// resolve returns the account for name. Only names in AllowedAccounts are considered; when
// the hostagent is not root it can only run commands as itself.
func (r *accountResolver) resolve(name string) (Account, error) {
	if !slices.Contains(r.allowed, name) {
		return Account{}, fmt.Errorf("%w: %q is not in allowed_accounts", ErrAccountNotAllowed, name)
	}
	if r.euid != 0 {
		if name != r.self.Username {
			return Account{}, fmt.Errorf("%w: %q (the hostagent runs as %q and is not root)", ErrAccountNotAllowed, name, r.self.Username)
		}
		return Account{Name: name, Home: r.self.HomeDir, Shell: r.loginShell(name)}, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return Account{}, fmt.Errorf("%w: %w", ErrAccountNotAllowed, err)
	}
	cred, err := credentialFor(u)
	if err != nil {
		return Account{}, err
	}
	return Account{Name: name, Home: u.HomeDir, Shell: r.loginShell(name), Credential: cred}, nil
}

func credentialFor(u *user.User) (*syscall.Credential, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("account %s: uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("account %s: gid %q: %w", u.Username, u.Gid, err)
	}
	groupIDs, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("account %s: supplementary groups: %w", u.Username, err)
	}
	groups := make([]uint32, 0, len(groupIDs))
	for _, g := range groupIDs {
		id, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("account %s: group %q: %w", u.Username, g, err)
		}
		groups = append(groups, uint32(id))
	}
	// NoSetGroups stays false: the child must not keep root's supplementary groups.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}, nil
}

// loginShell reads the shell field of /etc/passwd; os/user does not expose it. Accounts
// served by other NSS sources fall back to the configured shell.
func (r *accountResolver) loginShell(name string) string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return r.defaultShell
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		fields := strings.Split(scanner.Text(), ":")
		if len(fields) == 7 && fields[0] == name && fields[6] != "" {
			return fields[6]
		}
	}
	return r.defaultShell
}
