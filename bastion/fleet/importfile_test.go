package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/testutil"
)

// problemLines is where each problem is, as "LINE NAME".
func problemLines(ps []ImportProblem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%d %s", p.Line, p.Name))
	}
	return out
}

func TestParseImportTOML(t *testing.T) {
	k1, k2 := testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	file := fmt.Sprintf(`# fleet of two regions
account = "deploy"

[[hosts]]
name = "db-1"
addr = "10.0.0.1:2222"
host_key = %q
labels = { role = "db", env = "prod" }
description = "primary shard"

[[hosts]]  # a CA vouches for this one
name = "db-2"
addr = "10.0.0.2:2222"
account = "postgres"
host_key = "@cert-authority"
groups = ["db"]

[[hosts]]
name = "bad name!"
addr = "10.0.0.3:2222"
host_key = %q

[[hosts]]
name = "db-4"
addr = "10.0.0.4"
host_key = %q

[[hosts]]
name = "db-5"
addr = "10.0.0.5:2222"
host_key = "ssh-ed25519 AAAAnot-a-key"

[[hosts]]
name = "db-1"
addr = "10.0.0.6:2222"
host_key = %q

[[hosts]]
name = "db-7"
addr = "10.0.0.7:2222"
host_key = %q
labels = { "bad label" = "x" }
`, k1.AuthorizedLine(), k2.AuthorizedLine(), k2.AuthorizedLine(), k2.AuthorizedLine(), k2.AuthorizedLine())
	rows, problems, err := ParseImport([]byte(file), ImportTOML, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Line != 4 || rows[1].Line != 11 {
		t.Fatalf("rows = %+v; want db-1 at line 4, db-2 at line 11", rows)
	}
	db1, db2 := rows[0].Host, rows[1].Host
	if db1.Account != "deploy" || db1.Labels["role"] != "db" || db1.Description != "primary shard" || db1.Fingerprint() != fp(k1) || db1.HostCA {
		t.Errorf("db-1 = %+v", db1)
	}
	if db2.Account != "postgres" || !db2.HostCA || db2.HostKey != nil || !slices.Equal(db2.Groups, []string{"db"}) {
		t.Errorf("db-2 = %+v", db2)
	}
	want := []string{`18 "bad name!"`, "23 db-4", "28 db-5", "33 db-1", "38 db-7"}
	if got := problemLines(problems); !slices.Equal(got, want) {
		t.Fatalf("problems at %q; want %q\n%v", got, want, problems)
	}
	for i, substr := range []string{"want 1-64", "port", "host_key", "listed again (first at line 4)", "label"} {
		if !strings.Contains(problems[i].Error(), substr) {
			t.Errorf("problem %q; want it to mention %q", problems[i].Error(), substr)
		}
	}
}

func TestParseImportCSV(t *testing.T) {
	k1 := testutil.NewSSHKey(t)
	file := "name,addr,account,labels,description,host_key\n" +
		"# comment lines are skipped\n" +
		fmt.Sprintf("web-1,10.0.0.1:2222,deploy,role=web env=prod,\"front, west\",%s\n", k1.AuthorizedLine()) +
		"web-2,10.0.0.2:2222,,role=web,,@cert-authority\n" +
		"web-3,10.0.0.3:2222,deploy,role,,@cert-authority\n" +
		"web-4,[::1]:2222,deploy,,,\n" +
		"web-5,[::1]:2222,deploy,,,SHA256:" + strings.Repeat("a", 43) + "\n"
	rows, problems, err := ParseImport([]byte(file), ImportCSV, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Line != 3 || rows[1].Line != 4 || rows[2].Line != 7 {
		t.Fatalf("rows = %+v", rows)
	}
	if r := rows[2]; r.Expect != "SHA256:"+strings.Repeat("a", 43) || r.Host.HostKey != nil || r.Host.HostCA {
		t.Errorf("web-5 = %+v; want a fingerprint to check, no key yet", r)
	}
	// Not scanned: Import refuses it rather than enroll a host without a key.
	if rep, err := Import(filepath.Join(t.TempDir(), "hosts.toml"), rows[2:], nil, false, false); !errors.Is(err, ErrImportFailed) || rep.Applied {
		t.Errorf("Import of an unscanned row = %+v, %v; want refused", rep, err)
	}
	if h := rows[0].Host; h.Description != "front, west" || h.Labels["env"] != "prod" || h.Account != "deploy" {
		t.Errorf("web-1 = %+v", h)
	}
	if h := rows[1].Host; h.Account != "ops" || !h.HostCA {
		t.Errorf("web-2 = %+v; want the default account, trusted through a CA", h)
	}
	if got, want := problemLines(problems), []string{"5 web-3", "6 web-4"}; !slices.Equal(got, want) {
		t.Fatalf("problems %q; want %q (%v)", got, want, problems)
	}

	for _, tc := range []struct{ file, want string }{
		{"name,addr\nx,y\n", "no host_key column"},
		{"name,addr,host_key,colour\n", `column "colour"`},
		{"name,addr,host_key,name\n", "given twice"},
		{"name,addr,host_key\na,b\n", "line 2"},
		{"name,addr,host_key\n\"a,b,c\n", "line 2"},
	} {
		if _, _, err := ParseImport([]byte(tc.file), ImportCSV, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v; want %q", tc.file, err, tc.want)
		}
	}
	if _, _, err := ParseImport([]byte("[[hosts]]\nname = 1\n"), ImportTOML, ""); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("a TOML type error: %v", err)
	}
	if _, _, err := ParseImport([]byte("[[hosts]]\nnme = \"x\"\n"), ImportTOML, ""); err == nil || !strings.Contains(err.Error(), "unknown key hosts.nme") {
		t.Errorf("a misspelt key: %v", err)
	}
}

// TestImport: one change, all or nothing — a file with any problem writes nothing; a dry
// run writes nothing; a name enrolled otherwise needs --replace; hosts not in the file stay.
func TestImport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.toml")
	keep, k1, k2 := testutil.NewSSHKey(t), testutil.NewSSHKey(t), testutil.NewSSHKey(t)
	writeInventory(t, path, hostTOML("keep", keep.AuthorizedLine()), hostTOML("db-1", k1.AuthorizedLine()+" comment"))
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	csv := func(rows ...string) []ImportRow {
		t.Helper()
		out, problems, err := ParseImport([]byte("name,addr,account,host_key,labels\n"+strings.Join(rows, "\n")), ImportCSV, "")
		if err != nil || len(problems) > 0 {
			t.Fatal(err, problems)
		}
		return out
	}
	unchanged := func(what string) {
		t.Helper()
		if now, _ := os.ReadFile(path); !bytes.Equal(now, before) {
			t.Fatalf("%s changed the inventory", what)
		}
	}

	// The same entry as enrolled is unchanged; new names are added.
	rows := csv("db-1,10.0.0.1:2222,deploy,"+k1.AuthorizedLine()+",", "db-2,10.0.0.2:2222,deploy,@cert-authority,role=db")
	rep, err := Import(path, rows, nil, false, true)
	if err != nil || len(rep.Added) != 1 || len(rep.Unchanged) != 1 || rep.Applied {
		t.Fatalf("dry run = %+v, %v; want db-2 added, db-1 unchanged, nothing applied", rep, err)
	}
	unchanged("a dry run")

	// A problem of the parse is reported with the inventory's, and nothing is written.
	rep, err = Import(path, rows, []ImportProblem{{Line: 9, Name: "x", Err: errors.New("bad")}}, false, false)
	if !errors.Is(err, ErrImportFailed) || rep.Applied || len(rep.Problems) != 1 {
		t.Fatalf("Import with a problem = %+v, %v; want ErrImportFailed", rep, err)
	}
	unchanged("a failed import")

	// Another key for an enrolled name needs --replace.
	rekeyed := csv("db-1,10.0.0.1:2222,deploy,"+k2.AuthorizedLine()+",", "db-2,10.0.0.2:2222,deploy,@cert-authority,role=db")
	rep, err = Import(path, rekeyed, nil, false, false)
	if !errors.Is(err, ErrImportFailed) || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0].Error(), "line 2: host db-1: already enrolled with host key "+fp(k1)) ||
		!strings.Contains(rep.Problems[0].Error(), "--replace") {
		t.Fatalf("Import of a new key = %+v, %v; want refused, --replace named", rep, err)
	}
	unchanged("a refused replacement")

	rep, err = Import(path, rekeyed, nil, true, false)
	if err != nil || !rep.Applied || len(rep.Replaced) != 1 || rep.Replaced[0].Was != fp(k1) || !slices.Equal(rep.Replaced[0].Changes, []string{"host_key"}) || len(rep.Added) != 1 {
		t.Fatalf("Import --replace = %+v, %v", rep, err)
	}
	inv, err := OpenInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := inv.Hosts()
	if err != nil || !slices.Equal(names(hosts), []string{"db-1", "db-2", "keep"}) {
		t.Fatalf("hosts = %v, %v", names(hosts), err)
	}
	if hosts[0].Fingerprint() != fp(k2) || !hosts[1].HostCA || hosts[1].Labels["role"] != "db" || hosts[2].Fingerprint() != fp(keep) {
		t.Fatalf("hosts = %+v", hosts)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("inventory mode = %v, %v; want 0600", info.Mode(), err)
	}
}

// fuzzImport checks what ParseImport promises of any input: no panic, every row a host the
// inventory accepts, every line within the file, no name twice.
func fuzzImport(t *testing.T, data []byte, format ImportFormat) {
	rows, problems, err := ParseImport(data, format, "deploy")
	if err != nil {
		if len(rows) > 0 || len(problems) > 0 {
			t.Fatal("rows or problems with a file error")
		}
		return
	}
	lines := bytes.Count(data, []byte("\n")) + 1
	seen := map[string]bool{}
	for _, r := range rows {
		if r.Line < 0 || r.Line > lines {
			t.Fatalf("row at line %d of %d", r.Line, lines)
		}
		if seen[r.Host.Name] {
			t.Fatalf("host %q twice", r.Host.Name)
		}
		seen[r.Host.Name] = true
		if r.Expect != "" {
			if r.Host.HostKey != nil || r.Host.HostCA || !fingerprintSHA256.MatchString(r.Expect) {
				t.Fatalf("row %+v: a fingerprint to check, and a key or CA", r)
			}
			continue
		}
		if _, err := entryOf(r.Host); err != nil {
			t.Fatalf("row %+v does not enroll: %v", r, err)
		}
	}
	for _, p := range problems {
		if p.Line < 0 || p.Line > lines || p.Err == nil {
			t.Fatalf("problem %+v", p)
		}
	}
}

func FuzzParseImportCSV(f *testing.F) {
	f.Add([]byte("name,addr,account,labels,description,host_key\nweb-1,10.0.0.1:2222,deploy,role=web env=prod,\"front, west\",@cert-authority\n"))
	f.Add([]byte("name,addr,host_key\n# c\na,b:1,ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDx3\n"))
	f.Add([]byte("\ufeffNAME,ADDR,HOST_KEY,groups\nx,[::1]:22,@cert-authority,a b\n"))
	f.Fuzz(func(t *testing.T, data []byte) { fuzzImport(t, data, ImportCSV) })
}

func FuzzParseImportTOML(f *testing.F) {
	f.Add([]byte("account = \"deploy\"\n[[hosts]]\nname = \"db-1\"\naddr = \"10.0.0.1:2222\"\nhost_key = \"@cert-authority\"\nlabels = { role = \"db\" }\n"))
	f.Add([]byte("hosts = [{name = \"a\", addr = \"b:1\", host_key = \"@cert-authority\"}]\n"))
	f.Add([]byte("[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"a\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) { fuzzImport(t, data, ImportTOML) })
}

func fp(k testutil.SSHKey) string { return gossh.FingerprintSHA256(k.Public()) }
