package fleet

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"
	gossh "golang.org/x/crypto/ssh"
)

// Bulk enrollment (docs/inventory.md, "Importing hosts"): an import file lists hosts with
// their pinned keys (or @cert-authority); every host is checked, and the inventory changes
// in one atomic write only when every one of them passes.

// Bounds of an import file.
const (
	MaxImportBytes = 32 << 20
	MaxImportHosts = 100_000
)

// ImportFormat is how an import file is written.
type ImportFormat string

const (
	ImportTOML ImportFormat = "toml"
	ImportCSV  ImportFormat = "csv"
)

// ImportRow is one host of an import file and the line it starts on (1-based; 0 when it
// cannot be told).
type ImportRow struct {
	Line int
	Host Host
	// Expect is the host key fingerprint the file gives instead of the key (SHA256:…, as
	// `postern-hostagent install` prints it): ScanImport fetches the key and checks it.
	Expect string
}

// ImportProblem is why one host of an import file (or the file, Line 0 and no Name) cannot
// be imported.
type ImportProblem struct {
	Line int
	Name string
	Err  error
}

func (p ImportProblem) Error() string {
	var sb strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&sb, "line %d: ", p.Line)
	}
	if p.Name != "" {
		fmt.Fprintf(&sb, "host %s: ", p.Name)
	}
	sb.WriteString(p.Err.Error())
	return sb.String()
}

// importEntry is one host as a TOML import file writes it: the inventory's keys that an
// operator may give at enrollment.
type importEntry struct {
	Name        string            `toml:"name"`
	Addr        string            `toml:"addr"`
	Account     string            `toml:"account"`
	HostKey     string            `toml:"host_key"`
	Description string            `toml:"description"`
	Labels      map[string]string `toml:"labels"`
	OS          string            `toml:"os"`
	Groups      []string          `toml:"groups"`
	Cwd         string            `toml:"cwd"`
	AcceptEnv   []string          `toml:"accept_env"`
}

type importFile struct {
	// Account is the account of every host that names none.
	Account string        `toml:"account"`
	Hosts   []importEntry `toml:"hosts"`
}

// ParseImport reads an import file. account is the account of hosts that name none (the
// file's own default comes first). rows are the hosts that passed every check of their own
// (name, address, key, labels…); problems are those that did not, by line, and names given
// twice in the file. err is a file that cannot be read as a whole (its syntax, its header):
// then nothing of it is used.
func ParseImport(data []byte, format ImportFormat, account string) (rows []ImportRow, problems []ImportProblem, err error) {
	if len(data) > MaxImportBytes {
		return nil, nil, fmt.Errorf("import file larger than %d bytes: split it", MaxImportBytes)
	}
	var entries []importEntry
	var lines []int
	switch format {
	case ImportTOML:
		var fileAccount string
		entries, lines, fileAccount, err = parseImportTOML(data)
		account = cmpOr(fileAccount, account)
	case ImportCSV:
		entries, lines, err = parseImportCSV(data)
	default:
		return nil, nil, fmt.Errorf("import format %q: want toml or csv", format)
	}
	if err != nil {
		return nil, nil, err
	}
	if len(entries) > MaxImportHosts {
		return nil, nil, fmt.Errorf("import file lists %d hosts, at most %d: split it", len(entries), MaxImportHosts)
	}
	first := map[string]int{} // name → the line it was first seen on
	for i, e := range entries {
		e.Account = cmpOr(e.Account, account)
		h, expect, err := e.check()
		if err != nil {
			problems = append(problems, ImportProblem{Line: lines[i], Name: printableName(e.Name), Err: err})
			continue
		}
		if at, dup := first[h.Name]; dup {
			problems = append(problems, ImportProblem{Line: lines[i], Name: h.Name, Err: fmt.Errorf("listed again (first at line %d): keep one", at)})
			continue
		}
		first[h.Name] = lines[i]
		rows = append(rows, ImportRow{Line: lines[i], Host: h, Expect: expect})
	}
	return rows, problems, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// printableName is a name for a problem report: as given when printable, else quoted.
func printableName(s string) string {
	if s == "" {
		return `""`
	}
	if len(s) <= 64 && printableLine(s, false) {
		return s
	}
	if len(s) > 64 {
		s = s[:64]
	}
	return strconv.QuoteToASCII(s)
}

// fingerprintSHA256 is a key fingerprint as ssh-keygen -l and x/crypto print it.
var fingerprintSHA256 = regexp.MustCompile(`^SHA256:[A-Za-z0-9+/]{43}$`)

// check validates e as an enrollment: the inventory's own checks, and an address of a host
// and a numeric port. A host_key that is a fingerprint is returned as expect, the host
// without a key.
func (e importEntry) check() (h Host, expect string, err error) {
	if e.HostKey == "" {
		return Host{}, "", fmt.Errorf("host_key is required: the host's public key (its ssh_host_ed25519_key.pub, or the hostagent's host_ed25519_key.pub), its fingerprint (SHA256:…, checked against the key the host presents) or %s", CertAuthorityMarker)
	}
	if e.Account == "" {
		return Host{}, "", errors.New("account is required: give it for the host, for the file (account = \"…\" before the hosts, in TOML), or with --account")
	}
	if e.Addr == "" {
		return Host{}, "", errors.New("addr is required: host:port of its hostagent")
	}
	if host, port, err := net.SplitHostPort(e.Addr); err != nil {
		return Host{}, "", fmt.Errorf("addr %q: want host:port: %w", e.Addr, err)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
		return Host{}, "", fmt.Errorf("addr %q: want host:port with a port of 1-65535", e.Addr)
	}
	key := e.HostKey
	if fingerprintSHA256.MatchString(key) {
		expect, key = key, CertAuthorityMarker // the rest is checked as for any host
	}
	entry := hostEntry{Name: e.Name, Addr: e.Addr, Account: e.Account, HostKey: key, Cwd: e.Cwd,
		Groups: e.Groups, AcceptEnv: e.AcceptEnv, Description: e.Description, Labels: e.Labels, OS: e.OS}
	if len(entry.Labels) == 0 {
		entry.Labels = nil
	}
	h, err = entry.host()
	if err != nil {
		// entry.host names the host itself; the report does too.
		return Host{}, "", errors.New(strings.TrimPrefix(err.Error(), "host "+e.Name+": "))
	}
	if expect != "" {
		h.HostCA = false // no key yet: ScanImport fetches it
	}
	return h, expect, nil
}

// ScanImport fetches the host key of every row that gives its fingerprint (Expect), at most
// parallel hosts at once, and keeps the rows whose host presents that key (with the key
// filled in). A host that presents another key, or cannot be reached, is a problem: the
// address reaches another machine, someone is in the middle, or the host is not up yet.
func ScanImport(ctx context.Context, rows []ImportRow, parallel int) ([]ImportRow, []ImportProblem) {
	problems := make([]error, len(rows))
	sem := make(chan struct{}, max(1, parallel))
	var wg sync.WaitGroup
	for i := range rows {
		if rows[i].Expect == "" {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r := &rows[i]
			key, err := ScanHostKey(ctx, r.Host.Addr)
			switch {
			case err != nil:
				problems[i] = fmt.Errorf("its key could not be fetched to check against %s: %w", r.Expect, err)
			case gossh.FingerprintSHA256(key) != r.Expect:
				problems[i] = fmt.Errorf("%s presents %s, not the expected %s: the address reaches another machine, or someone is in the middle",
					r.Host.Addr, gossh.FingerprintSHA256(key), r.Expect)
			default:
				r.Host.HostKey, r.Expect = key, ""
			}
		})
	}
	wg.Wait()
	var kept []ImportRow
	var out []ImportProblem
	for i, r := range rows {
		if problems[i] != nil {
			out = append(out, ImportProblem{Line: r.Line, Name: r.Host.Name, Err: problems[i]})
			continue
		}
		kept = append(kept, r)
	}
	return kept, out
}

// hostsHeader is a TOML [[hosts]] table header on a line of its own.
var hostsHeader = regexp.MustCompile(`^[ \t]*\[\[[ \t]*hosts[ \t]*\]\][ \t]*(#.*)?$`)

// parseImportTOML returns the hosts, the line each starts on, and the file's account.
func parseImportTOML(data []byte) ([]importEntry, []int, string, error) {
	var f importFile
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, nil, "", fmt.Errorf("line %d: %s", pe.Position.Line, pe.Message)
		}
		return nil, nil, "", err
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, nil, "", fmt.Errorf("unknown key %s: a host has name, addr, account, host_key, description, labels, os, groups, cwd and accept_env", und[0])
	}
	// The line of each [[hosts]] header, in order: hosts[i] starts on lines[i]. A file that
	// writes hosts otherwise (hosts = [{…}]) is reported without lines.
	var lines []int
	for n, l := range bytes.Split(data, []byte("\n")) {
		if hostsHeader.Match(l) {
			lines = append(lines, n+1)
		}
	}
	if len(lines) != len(f.Hosts) {
		lines = make([]int, len(f.Hosts))
	}
	return f.Hosts, lines, f.Account, nil
}

// csvColumns are the columns a CSV import file may have, in its header row; labels are
// space-separated KEY=VALUE, groups and accept_env space-separated names.
var csvColumns = []string{"name", "addr", "account", "host_key", "description", "labels", "os", "groups", "cwd", "accept_env"}

func parseImportCSV(data []byte) ([]importEntry, []int, error) {
	r := csv.NewReader(bytes.NewReader(data))
	r.Comment = '#'
	r.TrimLeadingSpace = true
	header, err := r.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, csvError(err)
	}
	col := map[string]int{}
	for i, h := range header {
		h = strings.ToLower(strings.TrimSpace(h))
		if i == 0 {
			h = strings.TrimPrefix(h, "\ufeff")
		}
		if !slices.Contains(csvColumns, h) {
			return nil, nil, fmt.Errorf("line 1: column %q: the header row names the columns, of %s", printableName(h), strings.Join(csvColumns, ", "))
		}
		if _, dup := col[h]; dup {
			return nil, nil, fmt.Errorf("line 1: column %s given twice", h)
		}
		col[h] = i
	}
	for _, need := range []string{"name", "addr", "host_key"} {
		if _, ok := col[need]; !ok {
			return nil, nil, fmt.Errorf("line 1: the header row has no %s column (it needs name, addr and host_key)", need)
		}
	}
	var entries []importEntry
	var lines []int
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return entries, lines, nil
		}
		if err != nil {
			return nil, nil, csvError(err)
		}
		if len(entries) >= MaxImportHosts {
			return nil, nil, fmt.Errorf("more than %d hosts: split the file", MaxImportHosts)
		}
		line, _ := r.FieldPos(0)
		get := func(c string) string {
			if i, ok := col[c]; ok {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		e := importEntry{Name: get("name"), Addr: get("addr"), Account: get("account"), HostKey: get("host_key"),
			Description: get("description"), OS: get("os"), Cwd: get("cwd"),
			Groups: strings.Fields(get("groups")), AcceptEnv: strings.Fields(get("accept_env"))}
		if labels := strings.Fields(get("labels")); len(labels) > 0 {
			e.Labels = map[string]string{}
			for _, kv := range labels {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					// Left for check to refuse, with the other problems of the row.
					k, v = kv, ""
				}
				e.Labels[k] = v
			}
		}
		entries = append(entries, e)
		lines = append(lines, line)
	}
}

// csvError is a CSV syntax error as "line N: what".
func csvError(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("line %d: %v", pe.Line, pe.Err)
	}
	return err
}

// ImportReport is what an import did, or (dry run, or problems) would have done.
type ImportReport struct {
	// Added are hosts not enrolled before; Replaced were enrolled otherwise (Was is how);
	// Unchanged are enrolled exactly so already.
	Added, Unchanged []ImportRow
	Replaced         []Replacement
	// Problems are the hosts that cannot be imported: with any, nothing is.
	Problems []ImportProblem
	// Applied: the inventory was written.
	Applied bool
}

// Replacement is a host enrolled before, which the import changes.
type Replacement struct {
	ImportRow
	// Was is the enrolled host's key fingerprint (or @cert-authority); Changes the fields
	// the import changes.
	Was     string
	Changes []string
}

// ErrImportFailed: some hosts of the import file did not pass; nothing was imported.
var ErrImportFailed = errors.New("nothing was imported")

// Import records rows in the inventory at path as one change: every host is checked against
// the inventory (a name enrolled otherwise needs replace), and only when no host has a
// problem (problems are ParseImport's, reported with these) and dryRun is false is the
// inventory written, once, atomically and durably. Hosts enrolled and not in the file are
// kept. A report with problems comes with ErrImportFailed.
func Import(path string, rows []ImportRow, problems []ImportProblem, replace, dryRun bool) (ImportReport, error) {
	rep := ImportReport{Problems: slices.Clone(problems)}
	f, err := readInventoryFile(path)
	if err != nil {
		return rep, err
	}
	enrolled := map[string]int{}
	for i, e := range f.Hosts {
		enrolled[e.Name] = i
	}
	entries := make([]hostEntry, 0, len(rows))
	for _, row := range rows {
		if row.Expect != "" {
			rep.Problems = append(rep.Problems, ImportProblem{Line: row.Line, Name: row.Host.Name, Err: errors.New("its key was not fetched (ScanImport) to check against " + row.Expect)})
			continue
		}
		entry, err := entryOf(row.Host)
		if err != nil {
			rep.Problems = append(rep.Problems, ImportProblem{Line: row.Line, Name: row.Host.Name, Err: err})
			continue
		}
		i, ok := enrolled[row.Host.Name]
		if !ok {
			rep.Added = append(rep.Added, row)
			entries = append(entries, entry)
			continue
		}
		old := f.Hosts[i]
		if h, err := old.host(); err == nil {
			if normal, err := entryOf(h); err == nil {
				old = normal // as written by Enroll: the key without its comment
			}
		}
		changes := entryChanges(old, entry)
		if len(changes) == 0 {
			rep.Unchanged = append(rep.Unchanged, row)
			continue
		}
		was := old.HostKey
		if k, err := parseHostKey(old.HostKey); err == nil && k != nil {
			was = gossh.FingerprintSHA256(k)
		}
		if !replace {
			why := fmt.Sprintf("already enrolled with other %s", strings.Join(changes, ", "))
			if slices.Contains(changes, "host_key") {
				why = fmt.Sprintf("already enrolled with host key %s, the file has %s: check the new key out of band (on the host: ssh-keygen -lf its host key .pub)", was, cmpOr(row.Host.Fingerprint(), CertAuthorityMarker))
			}
			rep.Problems = append(rep.Problems, ImportProblem{Line: row.Line, Name: row.Host.Name,
				Err: fmt.Errorf("%s; import with --replace to overwrite the entry", why)})
			continue
		}
		rep.Replaced = append(rep.Replaced, Replacement{ImportRow: row, Was: was, Changes: changes})
		entries = append(entries, entry)
	}
	slices.SortStableFunc(rep.Problems, func(a, b ImportProblem) int { return a.Line - b.Line })
	if len(rep.Problems) > 0 {
		return rep, fmt.Errorf("%d of %d hosts cannot be imported: %w", len(rep.Problems), len(rows)+len(problems), ErrImportFailed)
	}
	if dryRun || len(entries) == 0 {
		return rep, nil
	}
	for _, e := range entries {
		if i, ok := enrolled[e.Name]; ok {
			f.Hosts[i] = e
		} else {
			f.Hosts = append(f.Hosts, e)
		}
	}
	slices.SortFunc(f.Hosts, func(a, b hostEntry) int { return strings.Compare(a.Name, b.Name) })
	if err := saveInventory(path, f); err != nil {
		return rep, err
	}
	rep.Applied = true
	return rep, nil
}

// entryChanges names the keys in which b differs from a (nil and empty alike).
func entryChanges(a, b hostEntry) []string {
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	t := va.Type()
	for i := range t.NumField() {
		fa, fb := va.Field(i), vb.Field(i)
		if fa.IsZero() && fb.IsZero() || (fa.Kind() == reflect.Slice || fa.Kind() == reflect.Map) && fa.Len() == 0 && fb.Len() == 0 {
			continue
		}
		if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
			out = append(out, name)
		}
	}
	return out
}
