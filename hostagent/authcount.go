package hostagent

import "log/slog"

// AuthorizedKeyCount is how many keys and CA keys cfg lets log in now, read as a login reads
// them (the same parsing, owner and mode checks and size bound; the files are re-read at every
// login): 0 means nobody can log in — not even the bastion — until a key is added. An
// agent that starts so says it (postern-hostagent serve).
func AuthorizedKeyCount(cfg Config) int {
	a := newAuthenticator(cfg, slog.New(slog.DiscardHandler))
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refreshLocked(&a.authorizedKeys, false)
	a.refreshLocked(&a.userCAs, true)
	n := len(a.authorizedKeys.keys) + len(a.userCAs.keys)
	for _, kf := range a.accountKeys {
		a.refreshLocked(kf, false)
		n += len(kf.keys)
	}
	return n
}
