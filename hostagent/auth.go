package hostagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// maxKeyFileBytes bounds an authorized_keys or CA keys file; larger files are refused whole
// rather than read partially.
const maxKeyFileBytes = 4 << 20

// Where and why the hostagent refuses what anyone who reaches it can send: the labels of
// its refusal logs (internal/ratelog), whose summaries count every one.
const (
	whereSSH           = "ssh"
	whereControlSocket = "control_socket"

	reasonPublicKey        = "public_key"        // a key that may not log in
	reasonHandshake        = "handshake"         // the SSH handshake failed
	reasonHandshakeTimeout = "handshake_timeout" // no login within handshake_timeout
	reasonPeerCredentials  = "peer_credentials"  // SO_PEERCRED could not be read
	reasonBusy             = "busy"              // no connection slot (LocalLimits)
	reasonConnectionError  = "connection_error"  // a local peer's connection ended in error
)

// ErrNotAuthorized is the reason every refused public key carries.
var ErrNotAuthorized = errors.New("public key not authorized")

// benignKeyOptions are authorized_keys options whose restriction the server applies to every
// key anyway (it never offers a pty, forwarding, X11 or user rc). Any other option (command=,
// from=, cert-authority, expiry-time=, …) would be a restriction we do not implement, so a key
// carrying one is skipped rather than accepted with the restriction silently dropped.
var benignKeyOptions = map[string]bool{
	"restrict": true, "no-pty": true, "no-port-forwarding": true, "no-agent-forwarding": true,
	"no-x11-forwarding": true, "no-user-rc": true,
}

// authenticator decides whether a public key may log in as a user. It re-reads its key files
// whenever their identity (inode, size, mtime) changes, so revoking a key takes effect on the
// next authentication attempt without a restart, and on the connections it let in at the
// server's next key check (Server.checkKeys).
//
// A plain key may log in as an account if it is in the global authorized keys file (every
// key there may log in as every allowed account) or in that account's own file,
// <authorized_keys_dir>/<account>.
type authenticator struct {
	logger *slog.Logger
	now    func() time.Time
	euid   uint32

	mu             sync.Mutex // guards authorizedKeys, userCAs and accountKeys
	authorizedKeys keyFile
	userCAs        keyFile
	// accountKeys holds one file per allowed account under authorized_keys_dir (none when it
	// is not configured): the SSH user picks the file only among allowed account names.
	accountKeys map[string]*keyFile
}

// keyFile is a parsed key file and the identity of the version it was parsed from.
type keyFile struct {
	path     string // "" when not configured
	optional bool   // a missing file is normal (an account without keys of its own)
	stamp    fileStamp
	keys     map[string]bool // gossh.PublicKey.Marshal() of each accepted key
	// statErr is the last failure to stat the file, logged once while it lasts (the key
	// check reads the files every key_check_interval).
	statErr string
}

type fileStamp struct {
	exists      bool
	dev, ino    uint64
	size        int64
	modTimeNano int64
	mode        os.FileMode
	uid         uint32
}

func newAuthenticator(cfg Config, logger *slog.Logger) *authenticator {
	a := &authenticator{
		logger:         logger,
		now:            time.Now,
		euid:           uint32(os.Geteuid()),
		authorizedKeys: keyFile{path: cfg.AuthorizedKeysFile},
		userCAs:        keyFile{path: cfg.TrustedUserCAKeysFile},
		accountKeys:    map[string]*keyFile{},
	}
	if cfg.AuthorizedKeysDir != "" {
		for _, name := range cfg.AllowedAccounts {
			// Validate has checked the names: none can leave the directory.
			a.accountKeys[name] = &keyFile{path: filepath.Join(cfg.AuthorizedKeysDir, name), optional: true}
		}
	}
	return a
}

// authorize returns the permissions to grant key logging in as user from remote, or an error
// wrapping ErrNotAuthorized. Certificates are accepted only through a trusted CA (never
// through authorized_keys), plain keys only through authorized_keys.
func (a *authenticator) authorize(user string, remote net.Addr, key gossh.PublicKey) (*gossh.Permissions, error) {
	a.mu.Lock()
	a.refreshLocked(&a.authorizedKeys, false)
	a.refreshLocked(&a.userCAs, true)
	authorized, cas := a.authorizedKeys.keys, a.userCAs.keys
	var own map[string]bool
	if kf := a.accountKeys[user]; kf != nil {
		a.refreshLocked(kf, false)
		own = kf.keys
	}
	a.mu.Unlock()

	cert, isCert := key.(*gossh.Certificate)
	if !isCert {
		if authorized[string(key.Marshal())] || own[string(key.Marshal())] {
			return &gossh.Permissions{}, nil
		}
		return nil, fmt.Errorf("%w: key not in the authorized keys file nor in the account's own file", ErrNotAuthorized)
	}
	checker := gossh.CertChecker{
		// source-address is the only critical option understood (enforced below); any
		// other (force-command, verify-required, …) refuses the certificate.
		SupportedCriticalOptions: []string{"source-address"},
		IsUserAuthority:          func(ca gossh.PublicKey) bool { return cas[string(ca.Marshal())] },
		Clock:                    a.now,
	}
	if err := checker.CheckCert(user, cert); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotAuthorized, err)
	}
	if cert.CertType != gossh.UserCert || !cas[string(cert.SignatureKey.Marshal())] {
		return nil, fmt.Errorf("%w: certificate not signed by a trusted user CA", ErrNotAuthorized)
	}
	// x/crypto enforces source-address on the Permissions the auth callback returns; check
	// it here too so the restriction holds even if the permissions are lost in plumbing.
	if sources, ok := cert.CriticalOptions["source-address"]; ok {
		if err := checkSourceAddress(remote, sources); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotAuthorized, err)
		}
	}
	return &gossh.Permissions{
		CriticalOptions: maps.Clone(cert.CriticalOptions),
		Extensions:      maps.Clone(cert.Extensions),
	}, nil
}

// keySets are the keys the files held when they were last read. The maps are never changed
// once read (a refresh replaces them), so a snapshot is read without the lock.
type keySets struct {
	authorized, cas map[string]bool
	own             map[string]map[string]bool // by account
}

// current reads every key file that changed and returns what they hold now.
func (a *authenticator) current() keySets {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refreshLocked(&a.authorizedKeys, false)
	a.refreshLocked(&a.userCAs, true)
	ks := keySets{authorized: a.authorizedKeys.keys, cas: a.userCAs.keys, own: make(map[string]map[string]bool, len(a.accountKeys))}
	for name, kf := range a.accountKeys {
		a.refreshLocked(kf, false)
		ks.own[name] = kf.keys
	}
	return ks
}

// admits reports whether a connection that logged in as user with key may stay: a plain key
// must still be in the global file or the account's own, a certificate's authority still
// trusted. What a login checked once and cannot change since (a certificate's principals,
// its signature, the client's address) is not checked again, nor is a certificate's validity
// period: like OpenSSH, a certificate that expires ends no session it opened.
func (ks keySets) admits(user string, key gossh.PublicKey) error {
	cert, isCert := key.(*gossh.Certificate)
	if !isCert {
		if ks.authorized[string(key.Marshal())] || ks.own[user][string(key.Marshal())] {
			return nil
		}
		return fmt.Errorf("%w: key no longer in the authorized keys file nor in the account's own file", ErrNotAuthorized)
	}
	if !ks.cas[string(cert.SignatureKey.Marshal())] {
		return fmt.Errorf("%w: the certificate's authority is no longer trusted", ErrNotAuthorized)
	}
	return nil
}

// refreshLocked re-parses kf if the file changed since it was last read. A missing file
// means no keys; an unreadable or oversized file also means no keys (fail closed) and is
// logged.
func (a *authenticator) refreshLocked(kf *keyFile, caFile bool) {
	if kf.path == "" {
		return
	}
	stamp, err := statFile(kf.path)
	if err != nil {
		if err.Error() != kf.statErr {
			a.logger.Error("cannot stat key file; accepting no keys from it", "path", kf.path, "err", err)
		}
		kf.keys, kf.stamp, kf.statErr = nil, fileStamp{}, err.Error()
		return
	}
	kf.statErr = ""
	if stamp == kf.stamp && kf.keys != nil {
		return
	}
	kf.stamp = stamp
	kf.keys = map[string]bool{}
	if !stamp.exists {
		level := slog.LevelWarn
		if kf.optional {
			level = slog.LevelDebug
		}
		a.logger.Log(context.Background(), level, "key file does not exist; accepting no keys from it", "path", kf.path)
		return
	}
	// As OpenSSH's StrictModes: a key file someone else can write lets them in.
	if stamp.mode.Perm()&0o022 != 0 || stamp.uid != 0 && stamp.uid != a.euid {
		a.logger.Error("key file is writable by others or owned by another user; accepting no keys from it (chmod go-w and chown it to root)",
			"path", kf.path, "mode", fmt.Sprintf("%#o", stamp.mode.Perm()), "uid", stamp.uid)
		return
	}
	data, err := readBounded(kf.path, maxKeyFileBytes)
	if err != nil {
		a.logger.Error("cannot read key file; accepting no keys from it", "path", kf.path, "err", err)
		return
	}
	kf.keys = parseKeyFile(data, caFile, func(line int, reason string) {
		a.logger.Warn("skipping key file entry", "path", kf.path, "line", line, "reason", reason)
	})
	a.logger.Info("loaded key file", "path", kf.path, "keys", len(kf.keys))
}

// parseKeyFile parses OpenSSH authorized_keys syntax. For a CA file (TrustedUserCAKeys) no
// options are allowed. skip is told about every entry that is not used.
func parseKeyFile(data []byte, caFile bool, skip func(line int, reason string)) map[string]bool {
	keys := map[string]bool{}
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		key, _, options, _, err := gossh.ParseAuthorizedKey(line)
		if err != nil {
			skip(i+1, "unparsable")
			continue
		}
		if _, isCert := key.(*gossh.Certificate); isCert {
			skip(i+1, "certificates cannot be listed as keys")
			continue
		}
		if unsupported := unsupportedOptions(options, caFile); unsupported != "" {
			skip(i+1, "unsupported option "+unsupported)
			continue
		}
		keys[string(key.Marshal())] = true
	}
	return keys
}

func unsupportedOptions(options []string, caFile bool) string {
	for _, opt := range options {
		name, _, _ := strings.Cut(opt, "=")
		if caFile || !benignKeyOptions[strings.ToLower(name)] {
			return name
		}
	}
	return ""
}

// checkSourceAddress reports whether remote matches one of the comma-separated addresses or
// CIDR blocks of a certificate's source-address option.
func checkSourceAddress(remote net.Addr, sources string) error {
	tcp, ok := remote.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("source-address restriction needs a TCP client address, got %v", remote)
	}
	for _, source := range strings.Split(sources, ",") {
		if ip := net.ParseIP(source); ip != nil {
			if ip.Equal(tcp.IP) {
				return nil
			}
			continue
		}
		_, block, err := net.ParseCIDR(source)
		if err != nil {
			return fmt.Errorf("invalid source-address %q in certificate", source)
		}
		if block.Contains(tcp.IP) {
			return nil
		}
	}
	return fmt.Errorf("client address %s not allowed by certificate source-address %q", tcp.IP, sources)
}

func statFile(path string) (fileStamp, error) {
	info, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fileStamp{}, nil
	}
	if err != nil {
		return fileStamp{}, err
	}
	stamp := fileStamp{exists: true, size: info.Size(), modTimeNano: info.ModTime().UnixNano(), mode: info.Mode(), uid: ^uint32(0)}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		stamp.dev, stamp.ino, stamp.uid = uint64(st.Dev), st.Ino, st.Uid
	}
	return stamp, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}

// authIdentity is what the server remembers about the key that actually signed the login.
// It is stored in the connection context by the verified-key callback, which x/crypto calls
// only after the signature checked out; the public-key callback alone may have seen other
// keys that were offered but never used.
type authIdentity struct {
	Fingerprint string // SHA256 fingerprint of the signing key (a certificate's inner key)
	CertKeyID   string // certificate key id, "" for plain keys
	CertSerial  uint64
}

type authIdentityKey struct{}

// publicKeyHandler is the gliderlabs callback, asking the authenticator of the config in
// force. It always replaces the connection's Permissions: gliderlabs returns
// ctx.Permissions() from its callback, so leaving a previous attempt's certificate
// restrictions (or none) in place would attach them to the wrong key.
func (srv *Server) publicKeyHandler(ctx gliderssh.Context, key gliderssh.PublicKey) bool {
	ctx.Permissions().Permissions = &gossh.Permissions{}
	perms, err := srv.live.Load().auth.authorize(ctx.User(), ctx.RemoteAddr(), key)
	if err != nil {
		srv.refusals.Log(slog.LevelInfo, reasonPublicKey, "public key refused", "user", boundForLog(ctx.User()), "remote", ctx.RemoteAddr(),
			"key_type", boundForLog(key.Type()), "key", gossh.FingerprintSHA256(signingKey(key)), "err", err)
		return false
	}
	ctx.Permissions().Permissions = perms
	return true
}

// verifiedKeyCallback records the key that signed the successful login.
func verifiedKeyCallback(ctx gliderssh.Context) func(gossh.ConnMetadata, gossh.PublicKey, *gossh.Permissions, string) (*gossh.Permissions, error) {
	return func(_ gossh.ConnMetadata, key gossh.PublicKey, perms *gossh.Permissions, _ string) (*gossh.Permissions, error) {
		id := authIdentity{Fingerprint: gossh.FingerprintSHA256(signingKey(key))}
		if cert, ok := key.(*gossh.Certificate); ok {
			id.CertKeyID, id.CertSerial = cert.KeyId, cert.Serial
		}
		ctx.SetValue(authIdentityKey{}, id)
		return perms, nil
	}
}

func signingKey(key gossh.PublicKey) gossh.PublicKey {
	if cert, ok := key.(*gossh.Certificate); ok {
		return cert.Key
	}
	return key
}

// boundForLog truncates client-chosen strings before they reach the log.
func boundForLog(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
