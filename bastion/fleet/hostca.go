package fleet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// Host certificates (docs/inventory.md, "Host certificates"): a host enrolled with
// host_key = "@cert-authority" pins no key; it must present an SSH host certificate signed
// by a trusted host CA, valid now, naming the host (its enrolled name or its address's
// host) as a principal, and neither it, its key nor its CA may be revoked. A pinned key is
// checked as before and never falls back to a CA.

// CertAuthorityMarker is the host_key of a host trusted through a host CA, after the
// @cert-authority marker of OpenSSH's known_hosts.
const CertAuthorityMarker = "@cert-authority"

// ErrHostCertRefused: the host presented a host certificate (or a plain key where one was
// needed) that the bastion does not accept. Nothing is sent to it; the error says what to fix.
var ErrHostCertRefused = errors.New("bastion: host certificate refused")

// HostCA is a certificate authority whose host certificates the bastion trusts.
type HostCA struct {
	// Name is what errors and logs call it.
	Name string
	Key  gossh.PublicKey
	// Hosts are the enrolled host names (path.Match patterns, "db-*") it may vouch for;
	// empty: every host.
	Hosts []string
}

// vouchesFor reports whether ca may vouch for the host named name.
func (ca HostCA) vouchesFor(name string) bool {
	if len(ca.Hosts) == 0 {
		return true
	}
	for _, p := range ca.Hosts {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// plainHostKeyAlgorithms are the host key algorithms of keys that can be pinned.
var plainHostKeyAlgorithms = []string{
	gossh.KeyAlgoED25519, gossh.KeyAlgoECDSA256, gossh.KeyAlgoECDSA384, gossh.KeyAlgoECDSA521,
	gossh.KeyAlgoRSASHA512, gossh.KeyAlgoRSASHA256, gossh.KeyAlgoRSA,
}

// certAlgorithms are the host key algorithms a host trusted through a CA is asked for.
var certAlgorithms = []string{
	gossh.CertAlgoED25519v01, gossh.CertAlgoECDSA256v01, gossh.CertAlgoECDSA384v01, gossh.CertAlgoECDSA521v01,
	gossh.CertAlgoRSASHA512v01, gossh.CertAlgoRSASHA256v01,
}

// CheckHostKey decides whether key, presented by h at now, is one the bastion trusts: h's
// pinned key, or (h.HostCA) a host certificate of one of cas valid for h. revoked may be nil.
// It is a pure function of its arguments; the pool calls it on every dial and before it
// reuses a connection.
func CheckHostKey(h Host, key gossh.PublicKey, cas []HostCA, revoked *Revocations, now time.Time) error {
	if err := revoked.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrHostCertRefused, err)
	}
	if revoked.KeyRevoked(key) {
		return fmt.Errorf("%w: %s presents %s, which the revocation list names: issue the host a new key (and certificate)",
			ErrHostCertRefused, h.Name, gossh.FingerprintSHA256(key))
	}
	if !h.HostCA {
		if h.HostKey == nil || !bytes.Equal(key.Marshal(), h.HostKey.Marshal()) {
			return ErrHostKeyMismatch
		}
		return nil
	}
	cert, ok := key.(*gossh.Certificate)
	if !ok {
		return fmt.Errorf("%w: %s presents a plain host key %s, not a certificate: give its hostagent host_certificate_file (signed with ssh-keygen -s CA -h -n %s), or enroll its key instead",
			ErrHostCertRefused, h.Name, gossh.FingerprintSHA256(key), h.Name)
	}
	if cert.CertType != gossh.HostCert {
		return fmt.Errorf("%w: %s presents a user certificate as its host key: sign the host's key with ssh-keygen -h", ErrHostCertRefused, h.Name)
	}
	var ca *HostCA
	for i := range cas {
		if bytes.Equal(cas[i].Key.Marshal(), cert.SignatureKey.Marshal()) && cas[i].vouchesFor(h.Name) {
			ca = &cas[i]
			break
		}
	}
	if ca == nil {
		return fmt.Errorf("%w: %s's certificate is signed by %s, which no [[host_cas]] entry trusts for host %s: add that CA (or host %s to its hosts), or re-sign the certificate with a trusted CA",
			ErrHostCertRefused, h.Name, gossh.FingerprintSHA256(cert.SignatureKey), h.Name, h.Name)
	}
	if revoked.KeyRevoked(cert.SignatureKey) || revoked.KeyRevoked(cert.Key) || revoked.SerialRevoked(cert.Serial) {
		return fmt.Errorf("%w: %s's certificate (serial %d, key %s, CA %s) is revoked by the revocation list: issue the host a new key and certificate",
			ErrHostCertRefused, h.Name, cert.Serial, gossh.FingerprintSHA256(cert.Key), ca.Name)
	}
	addrHost, _, _ := net.SplitHostPort(h.Addr)
	principal := ""
	for _, p := range cert.ValidPrincipals {
		if p == h.Name || p == addrHost {
			principal = p
			break
		}
	}
	if principal == "" {
		return fmt.Errorf("%w: %s's certificate is for %s, not for %s or %s: re-sign it with ssh-keygen -s CA -h -n %s",
			ErrHostCertRefused, h.Name, principalsText(cert.ValidPrincipals), h.Name, addrHost, h.Name)
	}
	unix := uint64(now.Unix())
	if unix < cert.ValidAfter {
		return fmt.Errorf("%w: %s's certificate is not valid before %s: check the host's and the bastion's clocks, or re-sign it",
			ErrHostCertRefused, h.Name, certTime(cert.ValidAfter))
	}
	if cert.ValidBefore != gossh.CertTimeInfinity && unix >= cert.ValidBefore {
		return fmt.Errorf("%w: %s's certificate expired at %s: re-sign the host's key (ssh-keygen -s CA -h -n %s -V +52w) and install it",
			ErrHostCertRefused, h.Name, certTime(cert.ValidBefore), h.Name)
	}
	// CheckCert checks again what is checked above, the critical options, and the signature.
	checker := &gossh.CertChecker{Clock: func() time.Time { return now }}
	if err := checker.CheckCert(principal, cert); err != nil {
		return fmt.Errorf("%w: %s's certificate: %w", ErrHostCertRefused, h.Name, err)
	}
	return nil
}

func principalsText(ps []string) string {
	if len(ps) == 0 {
		return "no principal (any host, which Postern does not accept)"
	}
	return strconv.Quote(strings.Join(ps, ","))
}

func certTime(t uint64) string {
	if t > 1<<62 {
		return "forever"
	}
	return time.Unix(int64(t), 0).UTC().Format(time.RFC3339)
}

// Revocations is the revocation list of host keys and host certificates: a text file, one
// entry a line, "#" starting a comment:
//
//	SHA256:…              a key's fingerprint (a host key, a certificate's key, or a CA's
//	                      key: everything it signed)
//	ssh-ed25519 AAAA…     a public key, the same as its fingerprint
//	serial 42             a host certificate's serial, whichever trusted CA signed it
//
// The file is read again when it changes, so a revocation takes effect at the next dial and
// before a pooled connection is used again. A file that cannot be read or parsed refuses
// every host (fail closed). A nil *Revocations revokes nothing.
type Revocations struct {
	path string

	mu      sync.Mutex // guards the fields below
	stamp   fileStamp
	loaded  bool
	keys    map[string]bool // fingerprints
	serials map[uint64]bool
	err     error
}

// maxRevocationBytes bounds the revocation file.
const maxRevocationBytes = 16 << 20

// OpenRevocations reads the revocation list at path; "" is none (a nil list). The list is
// returned with the error when the file cannot be used now: it refuses every host until it can.
func OpenRevocations(path string) (*Revocations, error) {
	if path == "" {
		return nil, nil
	}
	r := &Revocations{path: path}
	return r, r.Err()
}

// Err is why the list cannot be used now (the file is gone or does not parse); nil when
// it can.
func (r *Revocations) Err() error {
	if r == nil {
		return nil
	}
	r.reload()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// KeyRevoked reports whether key (or, for a certificate, the certificate itself by its
// key) is listed; true when the list is unusable.
func (r *Revocations) KeyRevoked(key gossh.PublicKey) bool {
	if r == nil {
		return false
	}
	r.reload()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return true
	}
	if cert, ok := key.(*gossh.Certificate); ok {
		key = cert.Key
	}
	return r.keys[gossh.FingerprintSHA256(key)]
}

// SerialRevoked reports whether a certificate serial is listed; true when the list is unusable.
func (r *Revocations) SerialRevoked(serial uint64) bool {
	if r == nil {
		return false
	}
	r.reload()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err != nil || r.serials[serial]
}

func (r *Revocations) reload() {
	var stamp fileStamp
	info, err := os.Stat(r.path)
	if err == nil {
		stamp = fileStamp{mod: info.ModTime(), size: info.Size()}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.loaded && err == nil && stamp == r.stamp {
		return
	}
	r.loaded, r.stamp = true, stamp
	if err != nil {
		r.err = fmt.Errorf("bastion: revoked_host_keys_file: %w (every host trusted through a CA is refused until it can be read; it may be empty)", err)
		return
	}
	data, err := os.ReadFile(r.path)
	if err == nil && len(data) > maxRevocationBytes {
		err = fmt.Errorf("larger than %d bytes", maxRevocationBytes)
	}
	if err == nil {
		r.keys, r.serials, err = ParseRevocations(data)
	}
	r.err = nil
	if err != nil {
		r.err = fmt.Errorf("bastion: revoked_host_keys_file %s: %w (every host is refused until it is fixed)", r.path, err)
	}
}

// ParseRevocations reads the revocation list's text: the revoked keys' fingerprints and the
// revoked serials. An error names the line that does not parse.
func ParseRevocations(data []byte) (keys map[string]bool, serials map[uint64]bool, err error) {
	keys, serials = map[string]bool{}, map[uint64]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, "SHA256:"):
			if len(line) != len("SHA256:")+43 || strings.ContainsAny(line, " \t") {
				return nil, nil, fmt.Errorf("line %d: %q is not a SHA256 fingerprint (ssh-keygen -lf prints them)", n, line)
			}
			keys[line] = true
		case strings.HasPrefix(line, "serial"):
			s, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "serial")), 10, 64)
			if err != nil {
				return nil, nil, fmt.Errorf("line %d: want serial N (a certificate's serial, a decimal number)", n)
			}
			serials[s] = true
		default:
			key, _, _, _, err := gossh.ParseAuthorizedKey([]byte(line))
			if err != nil {
				return nil, nil, fmt.Errorf("line %d: want SHA256:…, a public key or serial N: %w", n, err)
			}
			if cert, ok := key.(*gossh.Certificate); ok {
				key = cert.Key
			}
			keys[gossh.FingerprintSHA256(key)] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	return keys, serials, nil
}
