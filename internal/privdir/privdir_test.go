package privdir

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// otherUID is an account that does not exist: root can chown to it, and it is nobody we are.
const otherUID = 4242

func TestParentVerdict(t *testing.T) {
	const us = 1000
	tests := []struct {
		name string
		m    meta
		want error
	}{
		{name: "root 0755", m: meta{uid: 0, mode: fs.ModeDir | 0o755}},
		{name: "ours 0700", m: meta{uid: us, mode: fs.ModeDir | 0o700}},
		{name: "ours 0755", m: meta{uid: us, mode: fs.ModeDir | 0o755}},
		{name: "root sticky world-writable (/tmp)", m: meta{uid: 0, mode: fs.ModeDir | fs.ModeSticky | 0o777}},
		{name: "ours sticky group-writable", m: meta{uid: us, mode: fs.ModeDir | fs.ModeSticky | 0o775}},
		{name: "root world-writable", m: meta{uid: 0, mode: fs.ModeDir | 0o777}, want: ErrUnsafeParent},
		{name: "root group-writable", m: meta{uid: 0, mode: fs.ModeDir | 0o775}, want: ErrUnsafeParent},
		{name: "ours world-writable", m: meta{uid: us, mode: fs.ModeDir | 0o757}, want: ErrUnsafeParent},
		{name: "another user's 0755", m: meta{uid: otherUID, mode: fs.ModeDir | 0o755}, want: ErrUnsafeParent},
		{name: "another user's sticky", m: meta{uid: otherUID, mode: fs.ModeDir | fs.ModeSticky | 0o777}, want: ErrUnsafeParent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parentVerdict("/p", tt.m, us); !errors.Is(got, tt.want) || (tt.want == nil) != (got == nil) {
				t.Errorf("parentVerdict = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestTightened(t *testing.T) {
	tests := []struct {
		name    string
		mode    fs.FileMode
		want    fs.FileMode
		wantFix bool
	}{
		{name: "private dir", mode: fs.ModeDir | 0o700, want: fs.ModeDir | 0o700},
		{name: "mkdir with umask 022", mode: fs.ModeDir | 0o755, want: 0o700, wantFix: true},
		{name: "setgid dir", mode: fs.ModeDir | fs.ModeSetgid | 0o700, want: 0o700, wantFix: true},
		{name: "private file", mode: 0o600, want: 0o600},
		{name: "read-only file stays read-only", mode: 0o400, want: 0o400},
		{name: "file with umask 022", mode: 0o644, want: 0o600, wantFix: true},
		{name: "group-readable file", mode: 0o640, want: 0o600, wantFix: true},
		{name: "setuid file", mode: fs.ModeSetuid | 0o700, want: 0o700, wantFix: true},
		{name: "socket keeps its mode", mode: fs.ModeSocket | 0o666, want: fs.ModeSocket | 0o666},
		{name: "symlink keeps its mode", mode: fs.ModeSymlink | 0o777, want: fs.ModeSymlink | 0o777},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fix := tightened(tt.mode)
			if got != tt.want || fix != tt.wantFix {
				t.Errorf("tightened(%v) = %v, %v; want %v, %v", tt.mode, got, fix, tt.want, tt.wantFix)
			}
		})
	}
}

func logger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, nil))
}

func perm(t *testing.T, path string) fs.FileMode {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode() &^ fs.ModeType
}

func TestEnsureCreatesPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "state")
	var logs bytes.Buffer
	if err := Ensure(dir, "state dir", logger(&logs)); err != nil {
		t.Fatal(err)
	}
	if got := perm(t, dir); got != 0o700 {
		t.Errorf("new dir mode = %v; want 0700", got)
	}
	if logs.Len() != 0 {
		t.Errorf("a fresh dir needed no fix, but logged:\n%s", logs.String())
	}
}

// TestEnsureTightensPremadeDir is the finding: a dir made beforehand with mkdir under umask
// 022 kept 0755, and the files in it 0644.
func TestEnsureTightensPremadeDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // whatever the test's umask
	sub := filepath.Join(dir, "journal")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(sub, fs.ModeSetgid|0o755)
	files := map[string]fs.FileMode{
		filepath.Join(dir, "audit.key"):     0o644,
		filepath.Join(sub, "000001.log"):    0o664,
		filepath.Join(sub, "OPTIONS"):       0o600,
		filepath.Join(dir, "readonly.conf"): 0o444,
	}
	for p, m := range files {
		if err := os.WriteFile(p, []byte("secret"), m); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, m)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chmod(sock, 0o666)

	var logs bytes.Buffer
	if err := Ensure(dir, "state dir", logger(&logs)); err != nil {
		t.Fatal(err)
	}
	want := map[string]fs.FileMode{
		dir: 0o700, sub: 0o700,
		filepath.Join(dir, "audit.key"): 0o600, filepath.Join(sub, "000001.log"): 0o600,
		filepath.Join(sub, "OPTIONS"): 0o600, filepath.Join(dir, "readonly.conf"): 0o400,
		sock: 0o666,
	}
	for p, m := range want {
		if got := perm(t, p); got != m {
			t.Errorf("%s: mode %v; want %v", p, got, m)
		}
	}
	if got := perm(t, "/etc/passwd"); got&0o004 == 0 {
		t.Errorf("/etc/passwd lost its mode through the symlink: %v", got)
	}
	// dir, sub, audit.key, 000001.log, readonly.conf: five fixes, each logged once.
	if n := strings.Count(logs.String(), "tightened permissions"); n != 5 {
		t.Errorf("%d fixes logged; want 5:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "from=0644 to=0600") || !strings.Contains(logs.String(), "from=2755 to=0700") {
		t.Errorf("logs do not say what changed:\n%s", logs.String())
	}

	logs.Reset()
	if err := Ensure(dir, "state dir", logger(&logs)); err != nil || logs.Len() != 0 {
		t.Errorf("second Ensure: %v, logged %q; want nothing to fix", err, logs.String())
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chown to another user needs root")
	}
}

func TestEnsureRefusesForeignOwner(t *testing.T) {
	needRoot(t)
	t.Run("the dir itself", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		os.Mkdir(dir, 0o755)
		if err := os.Chown(dir, otherUID, otherUID); err != nil {
			t.Fatal(err)
		}
		err := Ensure(dir, "state dir", nil)
		if !errors.Is(err, ErrForeignOwner) || !strings.Contains(err.Error(), "chown -R") {
			t.Fatalf("Ensure = %v; want ErrForeignOwner saying what to do", err)
		}
		if got := perm(t, dir); got != 0o755 {
			t.Errorf("refused dir was changed to %v", got)
		}
	})
	t.Run("a file inside", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		os.Mkdir(dir, 0o700)
		planted := filepath.Join(dir, "planted")
		os.WriteFile(planted, nil, 0o666)
		if err := os.Lchown(planted, otherUID, otherUID); err != nil {
			t.Fatal(err)
		}
		if err := Ensure(dir, "state dir", nil); !errors.Is(err, ErrForeignOwner) || !strings.Contains(err.Error(), planted) {
			t.Fatalf("Ensure = %v; want ErrForeignOwner naming %s", err, planted)
		}
	})
}

func TestEnsureRefusesUnsafeParent(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name    string
		mode    fs.FileMode // of the parent, special bits as os.Chmod takes them
		owner   int
		wantErr error
	}{
		{name: "world-writable", mode: 0o777, owner: 0, wantErr: ErrUnsafeParent},
		{name: "group-writable", mode: 0o770, owner: 0, wantErr: ErrUnsafeParent},
		{name: "another user's", mode: 0o755, owner: otherUID, wantErr: ErrUnsafeParent},
		{name: "another user's sticky", mode: 0o777 | fs.ModeSticky, owner: otherUID, wantErr: ErrUnsafeParent},
		{name: "root's sticky (like /tmp)", mode: 0o777 | fs.ModeSticky, owner: 0},
		{name: "ours, private", mode: 0o700, owner: os.Geteuid()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := filepath.Join(t.TempDir(), "parent")
			os.Mkdir(parent, 0o700)
			dir := filepath.Join(parent, "state")
			os.Mkdir(dir, 0o700)
			if err := os.Chown(parent, tt.owner, tt.owner); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(parent, tt.mode); err != nil {
				t.Fatal(err)
			}
			err := Ensure(dir, "data dir", nil)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Ensure = %v; want %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), parent) {
				t.Errorf("error %q does not name the parent %s", err, parent)
			}
		})
	}
}

// TestEnsureFollowsSymlinkedDir judges a symlinked dir by both paths: a safe link into an
// unsafe place is refused.
func TestEnsureFollowsSymlinkedDir(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	target := filepath.Join(open, "state")
	os.Mkdir(target, 0o700)
	link := filepath.Join(base, "state")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(link, "state dir", nil); !errors.Is(err, ErrUnsafeParent) {
		t.Fatalf("Ensure through a symlink into a world-writable dir = %v; want ErrUnsafeParent", err)
	}
}
