// Package fleet is how the bastion knows and reaches its hosts: the inventory of enrolled
// hosts (name, address, account, the host key pinned once at enrollment, what the host can
// guarantee), the bastion's SSH client key, and the pool of one SSH connection per host with
// strict host key checking, keepalives and a redial backoff.
//
// Invariants: a host that presents another key than the one enrolled is sent nothing
// (ErrHostKeyMismatch); the inventory file is written atomically and durably, 0600.
package fleet

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/internal/envpolicy"
)

// inventoryFile is the TOML form of the enrolled hosts. Enrollment writes it; operators may
// edit it; the bastion reloads it when it changes.
type inventoryFile struct {
	Hosts []hostEntry `toml:"hosts"`
}

type hostEntry struct {
	Name    string `toml:"name"`
	Addr    string `toml:"addr"`
	Account string `toml:"account"`
	// HostKey is the pinned key in authorized_keys form ("ssh-ed25519 AAAA…"), or
	// "@cert-authority": the host presents a certificate of a trusted host CA (hostca.go).
	HostKey string   `toml:"host_key"`
	Cwd     string   `toml:"cwd,omitempty"`
	Groups  []string `toml:"groups,omitempty"`
	// AcceptEnv is the host's accept_env, as its hostagent is configured.
	AcceptEnv []string `toml:"accept_env,omitempty"`
	// Guarantee is hostagent (the default when absent), marker_script or none.
	Guarantee string `toml:"guarantee,omitempty"`
	// MarkerScriptSHA256 is the digest of ~/.postern/run installed at enrollment.
	MarkerScriptSHA256 string `toml:"marker_script_sha256,omitempty"`
	// Description, Labels and OS are what agents are told about the host (Host).
	Description string            `toml:"description,omitempty"`
	Labels      map[string]string `toml:"labels,omitempty"`
	OS          string            `toml:"os,omitempty"`
}

// hostName is what a host may be called: 1-64 of [A-Za-z0-9_.-], starting with a letter or
// digit (as actors and endpoints are).
var hostName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// ErrUnknownHost: the name is not in the inventory.
var ErrUnknownHost = errors.New("bastion: unknown host")

// Inventory is the set of enrolled hosts, read from its file and re-read when the file
// changes, so `postern hosts enroll` takes effect without a restart.
type Inventory struct {
	path string

	mu    sync.Mutex // guards hosts and stamp
	hosts map[string]Host
	stamp fileStamp
}

// The inode is part of it: every write replaces the file (durable.WriteFile renames a new
// one in), so two writes within the file system's timestamp granularity that leave the same
// size are still told apart.
type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

// OpenInventory reads the inventory at path; a missing file is an empty inventory.
func OpenInventory(path string) (*Inventory, error) {
	inv := &Inventory{path: path}
	if err := inv.reload(); err != nil {
		return nil, err
	}
	return inv, nil
}

// Host returns the enrolled host named name.
func (inv *Inventory) Host(name string) (Host, error) {
	if err := inv.reload(); err != nil {
		return Host{}, err
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	h, ok := inv.hosts[name]
	if !ok {
		return Host{}, fmt.Errorf("%w %q: enroll it with `postern hosts enroll`", ErrUnknownHost, name)
	}
	return h, nil
}

// Hosts returns every enrolled host, sorted by name.
func (inv *Inventory) Hosts() ([]Host, error) {
	if err := inv.reload(); err != nil {
		return nil, err
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	out := make([]Host, 0, len(inv.hosts))
	for _, h := range inv.hosts {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b Host) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (inv *Inventory) reload() error {
	info, err := os.Stat(inv.path)
	var stamp fileStamp
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("bastion: inventory: %w", err)
	default:
		stamp = fileStamp{mod: info.ModTime(), size: info.Size()}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			stamp.ino = st.Ino
		}
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.hosts != nil && stamp == inv.stamp {
		return nil
	}
	hosts, err := readInventory(inv.path)
	if err != nil {
		return err
	}
	inv.hosts, inv.stamp = hosts, stamp
	return nil
}

func readInventory(path string) (map[string]Host, error) {
	f, err := readInventoryFile(path)
	if err != nil {
		return nil, err
	}
	hosts := map[string]Host{}
	for i, e := range f.Hosts {
		h, err := e.host()
		if err != nil {
			return nil, fmt.Errorf("bastion: inventory %s: hosts[%d]: %w", path, i, err)
		}
		if _, dup := hosts[h.Name]; dup {
			return nil, fmt.Errorf("bastion: inventory %s: host %q listed twice", path, h.Name)
		}
		hosts[h.Name] = h
	}
	return hosts, nil
}

func readInventoryFile(path string) (inventoryFile, error) {
	var f inventoryFile
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("bastion: inventory: %w", err)
	}
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return f, fmt.Errorf("bastion: inventory %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return f, fmt.Errorf("bastion: inventory %s: unknown key %s", path, und[0])
	}
	return f, nil
}

func (e hostEntry) host() (Host, error) {
	if !hostName.MatchString(e.Name) {
		return Host{}, fmt.Errorf("name %q: want 1-64 of [A-Za-z0-9_.-]", e.Name)
	}
	if _, _, err := net.SplitHostPort(e.Addr); err != nil {
		return Host{}, fmt.Errorf("host %s: addr: %w", e.Name, err)
	}
	if e.Account == "" {
		return Host{}, fmt.Errorf("host %s: account is required", e.Name)
	}
	if e.Cwd != "" && (!filepath.IsAbs(e.Cwd) || filepath.Clean(e.Cwd) != e.Cwd) {
		return Host{}, fmt.Errorf("host %s: cwd must be an absolute, clean path", e.Name)
	}
	if _, err := envpolicy.New(e.AcceptEnv); err != nil {
		return Host{}, fmt.Errorf("host %s: %w", e.Name, err)
	}
	key, err := parseHostKey(e.HostKey)
	if err != nil {
		return Host{}, fmt.Errorf("host %s: host_key: %w", e.Name, err)
	}
	if err := checkGuarantee(Guarantee(e.Guarantee), e.MarkerScriptSHA256); err != nil {
		return Host{}, fmt.Errorf("host %s: %w", e.Name, err)
	}
	if err := ValidateHostInfo(e.Description, e.Labels, e.OS); err != nil {
		return Host{}, fmt.Errorf("host %s: %w", e.Name, err)
	}
	return Host{Name: e.Name, Addr: e.Addr, Account: e.Account, HostKey: key, HostCA: key == nil, Cwd: e.Cwd, Groups: e.Groups, AcceptEnv: e.AcceptEnv,
		Guarantee: Guarantee(e.Guarantee), ScriptSHA256: e.MarkerScriptSHA256,
		Description: e.Description, Labels: e.Labels, OS: e.OS}, nil
}

// parseHostKey reads a host_key: a public key in authorized_keys form, or (nil)
// CertAuthorityMarker. A certificate is not a key to pin: its CA is what to trust.
func parseHostKey(s string) (gossh.PublicKey, error) {
	if s == CertAuthorityMarker {
		return nil, nil
	}
	key, _, _, _, err := gossh.ParseAuthorizedKey([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("want a public key (ssh-ed25519 AAAA…, from the host's ssh_host_*_key.pub) or %s: %w", CertAuthorityMarker, err)
	}
	if _, ok := key.(*gossh.Certificate); ok {
		return nil, fmt.Errorf("a certificate is not pinned: trust its CA in [[host_cas]] and write %s", CertAuthorityMarker)
	}
	return key, nil
}

// Bounds of what agents are told about a host. Every agent that lists hosts reads it, so it
// is short, one line, and printable.
const (
	maxDescriptionBytes = 256
	maxLabels           = 32
	maxLabelValueBytes  = 128
	maxOSBytes          = 64
)

// labelName is a label's name: like a host name, and a "/" for a prefix (team/owner).
var labelName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_./-]{0,62}$`)

// ValidateHostInfo checks what agents are told about a host: a description of one line of
// printable text (at most 256 bytes), at most 32 labels named like hosts (a "/" allowed)
// whose values are at most 128 printable bytes without spaces, and an OS of at most 64
// printable bytes.
func ValidateHostInfo(description string, labels map[string]string, os string) error {
	switch {
	case len(description) > maxDescriptionBytes || !printableLine(description, true):
		return fmt.Errorf("description: want one line of printable text, at most %d bytes", maxDescriptionBytes)
	case len(os) > maxOSBytes || !printableLine(os, true):
		return fmt.Errorf("os: want printable text, at most %d bytes", maxOSBytes)
	case len(labels) > maxLabels:
		return fmt.Errorf("labels: at most %d", maxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		if !labelName.MatchString(k) {
			return fmt.Errorf("label %q: want a name of 1-63 of [A-Za-z0-9_./-], starting with a letter or digit", k)
		}
		if v == "" || len(v) > maxLabelValueBytes || !printableLine(v, false) {
			return fmt.Errorf("label %s: want a value of 1-%d printable characters without spaces", k, maxLabelValueBytes)
		}
	}
	return nil
}

// printableLine reports whether s is valid UTF-8 without control characters (and, unless
// spaces, without white space).
func printableLine(s string, spaces bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || !spaces && unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// Enrollment is what `postern hosts enroll` shows before it records a host.
type Enrollment struct {
	Host        Host
	Fingerprint string // SHA256:… of the presented host key
	// Replaces is the previously enrolled key's fingerprint when the host is re-enrolled.
	Replaces string
}

// ScanHostKey connects to addr and returns the host key it presents, without
// authenticating: enrollment shows its fingerprint to the operator before recording it.
func ScanHostKey(ctx context.Context, addr string) (gossh.PublicKey, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bastion: dial %s: %w", addr, err)
	}
	defer raw.Close()
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	var presented gossh.PublicKey
	errScanned := errors.New("host key scanned")
	_, _, _, err = gossh.NewClientConn(raw, addr, &gossh.ClientConfig{
		User: "postern-enroll",
		HostKeyCallback: func(_ string, _ net.Addr, key gossh.PublicKey) error {
			presented = key
			return errScanned
		},
		// The plain key, the one to pin, even from a host that also presents a certificate
		// (which x/crypto would prefer).
		HostKeyAlgorithms: plainHostKeyAlgorithms,
	})
	if presented == nil {
		return nil, fmt.Errorf("bastion: %s presented no host key: %w", addr, err)
	}
	return presented, nil
}

// PlanEnrollment describes recording h (whose HostKey was scanned) in the inventory at path.
// Enrolling a name again with the same key is a no-op; with another key it replaces the
// old one — a decision the operator must confirm (`--replace`).
func PlanEnrollment(path string, h Host) (Enrollment, error) {
	e := Enrollment{Host: h, Fingerprint: gossh.FingerprintSHA256(h.HostKey)}
	hosts, err := readInventory(path)
	if err != nil {
		return e, err
	}
	if old, ok := hosts[h.Name]; ok && old.trust() != h.trust() {
		e.Replaces = cmp.Or(old.Fingerprint(), CertAuthorityMarker)
	}
	return e, nil
}

// Enroll records h in the inventory at path (created 0600 if missing), replacing an entry of
// the same name. The write is atomic and durable.
func Enroll(path string, h Host) error {
	entry, err := entryOf(h)
	if err != nil {
		return fmt.Errorf("bastion: enroll: %w", err)
	}
	f, err := readInventoryFile(path)
	if err != nil {
		return err
	}
	f.Hosts = slices.DeleteFunc(f.Hosts, func(e hostEntry) bool { return e.Name == h.Name })
	f.Hosts = append(f.Hosts, entry)
	slices.SortFunc(f.Hosts, func(a, b hostEntry) int { return strings.Compare(a.Name, b.Name) })
	return saveInventory(path, f)
}

// entryOf is h as the inventory file records it, validated.
func entryOf(h Host) (hostEntry, error) {
	entry := hostEntry{
		Name: h.Name, Addr: h.Addr, Account: h.Account, Cwd: h.Cwd, Groups: h.Groups, AcceptEnv: h.AcceptEnv,
		HostKey:     h.KeyText(),
		Description: h.Description, Labels: h.Labels, OS: h.OS,
	}
	if h.Level() != GuaranteeHostagent {
		entry.Guarantee, entry.MarkerScriptSHA256 = string(h.Guarantee), h.ScriptSHA256
	}
	_, err := entry.host()
	return entry, err
}

// Info is what agents are told about a host (Host.Description, Labels, OS).
type Info struct {
	Description string
	Labels      map[string]string
	OS          string
}

// SetInfo changes what agents are told about the enrolled host named name: edit is given
// its Info as the inventory at path has it and changes it in place. Nothing else of the
// entry changes; the write is atomic and durable. An unknown name is ErrUnknownHost, an
// edit that does not validate (ValidateHostInfo) changes nothing.
func SetInfo(path, name string, edit func(*Info)) (Info, error) {
	f, err := readInventoryFile(path)
	if err != nil {
		return Info{}, err
	}
	i := slices.IndexFunc(f.Hosts, func(e hostEntry) bool { return e.Name == name })
	if i < 0 {
		return Info{}, fmt.Errorf("%w %q: enroll it first", ErrUnknownHost, name)
	}
	e := &f.Hosts[i]
	info := Info{Description: e.Description, Labels: maps.Clone(e.Labels), OS: e.OS}
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	edit(&info)
	if len(info.Labels) == 0 {
		info.Labels = nil
	}
	if err := ValidateHostInfo(info.Description, info.Labels, info.OS); err != nil {
		return Info{}, fmt.Errorf("bastion: host %s: %w", name, err)
	}
	e.Description, e.Labels, e.OS = info.Description, info.Labels, info.OS
	if _, err := e.host(); err != nil {
		return Info{}, fmt.Errorf("bastion: inventory %s: %w", path, err)
	}
	return info, saveInventory(path, f)
}

// saveInventory writes f to path, atomically and durably, 0600 (its dir 0700).
func saveInventory(path string, f inventoryFile) error {
	var buf bytes.Buffer
	buf.WriteString("# Enrolled hosts: written by `postern hosts enroll`. Each host_key was shown to the\n# operator and recorded once; a host presenting another key is refused.\n\n")
	if err := toml.NewEncoder(&buf).Encode(f); err != nil {
		return fmt.Errorf("bastion: encode inventory: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("bastion: inventory dir: %w", err)
	}
	if err := durable.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("bastion: write inventory: %w", err)
	}
	return nil
}

// Fingerprint is the SHA256:… fingerprint of the host's enrolled key; "" for a host trusted
// through a host CA.
func (h Host) Fingerprint() string {
	if h.HostKey == nil {
		return ""
	}
	return gossh.FingerprintSHA256(h.HostKey)
}

// KeyType is the enrolled key's type (ssh-ed25519), or CertAuthorityMarker.
func (h Host) KeyType() string {
	if h.HostKey == nil {
		return CertAuthorityMarker
	}
	return h.HostKey.Type()
}

// KeyText is the host_key as the inventory records it: the pinned key in authorized_keys
// form, or CertAuthorityMarker.
func (h Host) KeyText() string {
	switch {
	case h.HostCA:
		return CertAuthorityMarker
	case h.HostKey == nil:
		return ""
	}
	return string(bytes.TrimSpace(gossh.MarshalAuthorizedKey(h.HostKey)))
}
