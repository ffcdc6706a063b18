package fleet

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
)

// writeInventory writes an inventory file of the given TOML host tables.
func writeInventory(t testing.TB, path string, hosts ...string) {
	t.Helper()
	var b strings.Builder
	for _, h := range hosts {
		b.WriteString("[[hosts]]\n" + h + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// hostTOML is a valid host table named name with key (an authorized_keys line) and extra
// lines.
func hostTOML(name, key string, extra ...string) string {
	return strings.Join(append([]string{
		fmt.Sprintf("name = %q", name), `addr = "10.0.0.1:2222"`, `account = "deploy"`, fmt.Sprintf("host_key = %q", key),
	}, extra...), "\n")
}

func names(hosts []Host) []string {
	var out []string
	for _, h := range hosts {
		out = append(out, h.Name)
	}
	return out
}

func TestInventoryMissingFileIsEmpty(t *testing.T) {
	inv, err := OpenInventory(filepath.Join(t.TempDir(), "hosts.toml"))
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := inv.Hosts()
	if err != nil || len(hosts) != 0 {
		t.Fatalf("Hosts = %v, %v; want none", hosts, err)
	}
	if _, err := inv.Host("web1"); !errors.Is(err, ErrUnknownHost) || !strings.Contains(err.Error(), "postern hosts enroll") {
		t.Fatalf("Host(web1) = %v; want ErrUnknownHost telling how to enroll", err)
	}
}

func TestInventoryReloadsOnChange(t *testing.T) {
	key := testutil.NewSSHKey(t).AuthorizedLine()
	path := filepath.Join(t.TempDir(), "hosts.toml")
	writeInventory(t, path, hostTOML("web2", key), hostTOML("web1", key, `cwd = "/srv"`, `groups = ["web"]`))
	inv, err := OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := inv.Hosts()
	if err != nil || !slices.Equal(names(hosts), []string{"web1", "web2"}) {
		t.Fatalf("Hosts = %v, %v; want web1, web2 sorted", names(hosts), err)
	}
	h, err := inv.Host("web1")
	if err != nil || h.Cwd != "/srv" || !slices.Equal(h.Groups, []string{"web"}) || h.Account != "deploy" || h.Level() != GuaranteeHostagent {
		t.Fatalf("Host(web1) = %+v, %v; want its entry", h, err)
	}

	// Same size, another modification time: reloaded.
	writeInventory(t, path, hostTOML("db01", key), hostTOML("db02", key, `cwd = "/srv"`, `groups = ["web"]`))
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	hosts, err = inv.Hosts()
	if err != nil || !slices.Equal(names(hosts), []string{"db01", "db02"}) {
		t.Fatalf("Hosts after the edit = %v, %v; want db01, db02", names(hosts), err)
	}
	if _, err := inv.Host("web1"); !errors.Is(err, ErrUnknownHost) {
		t.Fatalf("Host(web1) after its removal = %v; want ErrUnknownHost", err)
	}

	// An edit that breaks the file is reported, not half applied.
	if err := os.WriteFile(path, []byte("[[hosts]]\nname = \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.Hosts(); err == nil {
		t.Fatal("Hosts of a broken file succeeded")
	}
	if _, err := inv.Host("db01"); err == nil {
		t.Fatal("Host of a broken file succeeded")
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if hosts, err := inv.Hosts(); err != nil || len(hosts) != 0 {
		t.Fatalf("Hosts after the file's removal = %v, %v; want none", names(hosts), err)
	}
}

func TestInventoryInvalid(t *testing.T) {
	key := testutil.NewSSHKey(t).AuthorizedLine()
	digest := strings.Repeat("0f", 32)
	tests := []struct {
		name    string
		hosts   []string
		raw     string // the whole file instead of hosts
		wantErr string
	}{
		{name: "duplicate names", hosts: []string{hostTOML("web1", key), hostTOML("web1", key)}, wantErr: `host "web1" listed twice`},
		{name: "bad name reported with its index", hosts: []string{hostTOML("web1", key), hostTOML("-web", key)}, wantErr: `hosts[1]: name "-web"`},
		{name: "name too long", hosts: []string{hostTOML(strings.Repeat("a", 65), key)}, wantErr: "hosts[0]: name"},
		{name: "addr without port", hosts: []string{strings.Replace(hostTOML("web1", key), "10.0.0.1:2222", "10.0.0.1", 1)}, wantErr: "hosts[0]: host web1: addr"},
		{name: "no account", hosts: []string{strings.Replace(hostTOML("web1", key), `"deploy"`, `""`, 1)}, wantErr: "account is required"},
		{name: "relative cwd", hosts: []string{hostTOML("web1", key, `cwd = "srv"`)}, wantErr: "cwd must be an absolute, clean path"},
		{name: "unclean cwd", hosts: []string{hostTOML("web1", key, `cwd = "/srv/../etc"`)}, wantErr: "cwd must be an absolute, clean path"},
		{name: "bad accept_env", hosts: []string{hostTOML("web1", key, `accept_env = ["LD_PRELOAD"]`)}, wantErr: "host web1:"},
		{name: "bad host key", hosts: []string{hostTOML("web1", "ssh-ed25519 AAAAnope")}, wantErr: "host_key"},
		{name: "marker script without digest", hosts: []string{hostTOML("web1", key, `guarantee = "marker_script"`)}, wantErr: "needs marker_script_sha256"},
		{name: "digest without marker script", hosts: []string{hostTOML("web1", key, fmt.Sprintf("marker_script_sha256 = %q", digest))}, wantErr: "only for guarantee"},
		{name: "unknown guarantee", hosts: []string{hostTOML("web1", key, `guarantee = "faith"`)}, wantErr: `guarantee "faith"`},
		{name: "unknown key", hosts: []string{hostTOML("web1", key, `port = 22`)}, wantErr: "unknown key hosts.port"},
		{name: "not TOML", raw: "[[hosts]\n", wantErr: "inventory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hosts.toml")
			if tt.raw != "" {
				if err := os.WriteFile(path, []byte(tt.raw), 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				writeInventory(t, path, tt.hosts...)
			}
			_, err := OpenInventory(path)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("OpenInventory = %v; want an error with %q", err, tt.wantErr)
			}
		})
	}
}

func TestInventoryGuarantees(t *testing.T) {
	key := testutil.NewSSHKey(t).AuthorizedLine()
	digest := strings.Repeat("0f", 32)
	path := filepath.Join(t.TempDir(), "hosts.toml")
	writeInventory(t, path,
		hostTOML("agent", key),
		hostTOML("script", key, `guarantee = "marker_script"`, fmt.Sprintf("marker_script_sha256 = %q", digest)),
		hostTOML("bare", key, `guarantee = "none"`))
	inv, err := OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		want       Guarantee
		wantDigest string
	}{
		{"agent", GuaranteeHostagent, ""},
		{"script", GuaranteeMarkerScript, digest},
		{"bare", GuaranteeNone, ""},
	}
	for _, tt := range tests {
		h, err := inv.Host(tt.name)
		if err != nil {
			t.Fatal(err)
		}
		if h.Level() != tt.want || h.ScriptSHA256 != tt.wantDigest {
			t.Errorf("%s: level %s, digest %q; want %s, %q", tt.name, h.Level(), h.ScriptSHA256, tt.want, tt.wantDigest)
		}
	}
}

func TestInventoryUnreadable(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenInventory(filepath.Join(notDir, "hosts.toml")); err == nil {
		t.Fatal("OpenInventory under a file succeeded")
	}
	if _, err := OpenInventory(dir); err == nil {
		t.Fatal("OpenInventory of a directory succeeded")
	}
}

func TestPlanEnrollment(t *testing.T) {
	key, other := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	path := filepath.Join(t.TempDir(), "hosts.toml")
	writeInventory(t, path, hostTOML("web1", key.AuthorizedLine()))
	tests := []struct {
		name         string
		host         Host
		wantReplaces string
	}{
		{name: "same key: nothing replaced", host: Host{Name: "web1", HostKey: key.Public()}},
		{name: "another key replaces the enrolled one", host: Host{Name: "web1", HostKey: other.Public()}, wantReplaces: Host{HostKey: key.Public()}.Fingerprint()},
		{name: "a new host", host: Host{Name: "web2", HostKey: other.Public()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := PlanEnrollment(path, tt.host)
			if err != nil {
				t.Fatal(err)
			}
			if e.Replaces != tt.wantReplaces || e.Fingerprint != tt.host.Fingerprint() {
				t.Fatalf("plan = replaces %q, fingerprint %q; want %q, %q", e.Replaces, e.Fingerprint, tt.wantReplaces, tt.host.Fingerprint())
			}
		})
	}
	broken := filepath.Join(t.TempDir(), "broken.toml")
	writeInventory(t, broken, hostTOML("web1", "nope"))
	if _, err := PlanEnrollment(broken, Host{Name: "web1", HostKey: key.Public()}); err == nil {
		t.Fatal("PlanEnrollment over a broken inventory succeeded")
	}
}

func TestEnroll(t *testing.T) {
	key, other := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "hosts.toml")
	digest := strings.Repeat("ab", 32)
	enroll := []Host{
		{Name: "web2", Addr: "10.0.0.2:2222", Account: "deploy", HostKey: key.Public()},
		{Name: "db01", Addr: "10.0.0.3:22", Account: "postgres", HostKey: key.Public(), Guarantee: GuaranteeMarkerScript, ScriptSHA256: digest},
		{Name: "web1", Addr: "10.0.0.1:2222", Account: "deploy", HostKey: key.Public(), Cwd: "/srv", Groups: []string{"web"}, AcceptEnv: []string{"APP_ENV"}},
		{Name: "web2", Addr: "10.0.0.9:2222", Account: "deploy", HostKey: other.Public(), Guarantee: GuaranteeHostagent}, // re-enrolled
	}
	for _, h := range enroll {
		if err := Enroll(path, h); err != nil {
			t.Fatalf("Enroll(%s): %v", h.Name, err)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("inventory mode = %v; want 0600", fi.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("state dir holds %v (%v); want only the inventory: no temporary file left", entries, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if i, j, k := strings.Index(text, `"db01"`), strings.Index(text, `"web1"`), strings.Index(text, `"web2"`); i < 0 || !(i < j && j < k) {
		t.Fatalf("inventory not sorted by name:\n%s", text)
	}
	if strings.Count(text, "[[hosts]]") != 3 {
		t.Fatalf("inventory has %d hosts; want 3 (web2 replaced):\n%s", strings.Count(text, "[[hosts]]"), text)
	}
	if strings.Count(text, "guarantee = ") != 1 || strings.Count(text, "marker_script_sha256 = ") != 1 { // db01's; the hostagent default is not written
		t.Fatalf("guarantee written for other than the marker script host:\n%s", text)
	}

	inv, err := OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	web2, err := inv.Host("web2")
	if err != nil || web2.Addr != "10.0.0.9:2222" || web2.Fingerprint() != (Host{HostKey: other.Public()}).Fingerprint() {
		t.Fatalf("web2 = %+v, %v; want the re-enrolled entry", web2, err)
	}
	db, err := inv.Host("db01")
	if err != nil || db.Level() != GuaranteeMarkerScript || db.ScriptSHA256 != digest {
		t.Fatalf("db01 = %+v, %v; want the marker script and its digest", db, err)
	}
	web1, err := inv.Host("web1")
	if err != nil || web1.Cwd != "/srv" || !slices.Equal(web1.Groups, []string{"web"}) || !slices.Equal(web1.AcceptEnv, []string{"APP_ENV"}) {
		t.Fatalf("web1 = %+v, %v; want its cwd, groups and accept_env", web1, err)
	}

	// An invalid host is refused and leaves the file as it was.
	if err := Enroll(path, Host{Name: "bad name", Addr: "10.0.0.4:22", Account: "x", HostKey: key.Public()}); err == nil {
		t.Fatal("Enroll of an invalid host succeeded")
	}
	if after, _ := os.ReadFile(path); string(after) != text {
		t.Fatal("a refused enrollment changed the inventory")
	}
	// A broken inventory is not overwritten.
	if err := os.WriteFile(path, []byte("[[hosts]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Enroll(path, enroll[0]); err == nil {
		t.Fatal("Enroll over a broken inventory succeeded")
	}
}

// TestHostInfo: a description, labels and the OS go into the inventory at enrollment and are
// changed by SetInfo without touching the rest of the entry; what does not validate is
// refused and changes nothing.
func TestHostInfo(t *testing.T) {
	key := testutil.NewSSHKey(t)
	path := filepath.Join(t.TempDir(), "hosts.toml")
	h := Host{Name: "db1", Addr: "10.0.0.3:22", Account: "postgres", HostKey: key.Public(), Groups: []string{"db"},
		Description: "primary PostgreSQL of the shop", Labels: map[string]string{"env": "prod", "role": "db"}, OS: "Debian 12"}
	if err := Enroll(path, h); err != nil {
		t.Fatal(err)
	}
	host := func() Host {
		t.Helper()
		inv, err := OpenInventory(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := inv.Host("db1")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := host(); got.Description != h.Description || !maps.Equal(got.Labels, h.Labels) || got.OS != h.OS {
		t.Fatalf("enrolled %+v; want its description, labels and OS", got)
	}

	info, err := SetInfo(path, "db1", func(i *Info) {
		i.Labels["env"] = "staging"
		delete(i.Labels, "role")
		i.Labels["team/owner"] = "payments"
		i.OS = "Debian 13"
	})
	want := map[string]string{"env": "staging", "team/owner": "payments"}
	if err != nil || !maps.Equal(info.Labels, want) || info.Description != h.Description || info.OS != "Debian 13" {
		t.Fatalf("SetInfo = %+v, %v; want labels %v, the description kept, OS Debian 13", info, err, want)
	}
	if got := host(); !maps.Equal(got.Labels, want) || got.OS != "Debian 13" || got.Addr != h.Addr || !slices.Equal(got.Groups, h.Groups) || got.Fingerprint() != h.Fingerprint() {
		t.Fatalf("after SetInfo: %+v; want the new labels and OS, the rest as enrolled", got)
	}

	before, _ := os.ReadFile(path)
	for name, edit := range map[string]func(*Info){
		"two lines":            func(i *Info) { i.Description = "a\nb" },
		"a long description":   func(i *Info) { i.Description = strings.Repeat("x", 257) },
		"a label with a space": func(i *Info) { i.Labels["env"] = "prod east" },
		"an empty label value": func(i *Info) { i.Labels["env"] = "" },
		"a bad label name":     func(i *Info) { i.Labels["-x"] = "y" },
		"a control character":  func(i *Info) { i.OS = "Linux\x07" },
	} {
		if _, err := SetInfo(path, "db1", edit); err == nil {
			t.Errorf("%s: SetInfo succeeded", name)
		}
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("a refused SetInfo changed the inventory")
	}
	if _, err := SetInfo(path, "db9", func(*Info) {}); !errors.Is(err, ErrUnknownHost) {
		t.Fatalf("SetInfo of an unknown host = %v; want ErrUnknownHost", err)
	}
}

func TestLoadOrCreateClientKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "client")
	signer, err := LoadOrCreateClientKey(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + ".pub"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode = %v; want 0600", p, fi.Mode().Perm())
		}
	}
	line := strings.TrimSpace(string(mustRead(t, path+".pub")))
	if want := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(signer.PublicKey()))); line != want || !strings.HasPrefix(line, "ssh-ed25519 ") {
		t.Fatalf(".pub = %q; want %q", line, want)
	}

	// Reused, and its public half rewritten if it was lost or changed.
	if err := os.WriteFile(path+".pub", []byte("stale\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := LoadOrCreateClientKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(gossh.MarshalAuthorizedKey(again.PublicKey())) != string(gossh.MarshalAuthorizedKey(signer.PublicKey())) {
		t.Fatal("a second load made another key")
	}
	if got := strings.TrimSpace(string(mustRead(t, path+".pub"))); got != line {
		t.Fatalf(".pub after reload = %q; want %q", got, line)
	}

	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateClientKey(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("load of a corrupt key = %v; want an error naming it", err)
	}
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateClientKey(filepath.Join(notDir, "client")); err == nil {
		t.Fatal("a key under a file was created")
	}
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
