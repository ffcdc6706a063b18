package transport

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/internal/unixpath"
)

func TestUnixCallerFromKernel(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	self, _, err := procFS{root: "/proc"}.process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	want := Caller{
		Actor:      defaultLocalActor(os.Getuid()),
		Scope:      selfScope(t),
		Local:      true,
		PID:        os.Getpid(),
		UID:        os.Getuid(),
		Exe:        exe,
		Cmdline:    strings.Join(os.Args, "\x00"),
		StartTicks: self.StartTicks,
	}
	tests := []struct {
		name   string
		header http.Header
	}{
		{name: "no headers"},
		{name: "forged bearer and run id", header: http.Header{"Authorization": {"Bearer x"}, RunHeader: {"forged"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "0"}, nil)
			cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{
				Endpoint:   "http://localhost/mcp",
				HTTPClient: unixHTTPClient(sock, tt.header),
			}, nil)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer cs.Close()
			got := callWhoami(t, cs)
			if !got.OK || got.Caller != want {
				t.Errorf("whoami = %+v; want ok and %+v", got, want)
			}
			if got.SawAuthorization {
				t.Error("an Authorization header reached the tool handler")
			}
		})
	}
}

// TestUnixBridgeClaimRefused: a request that names a parent the connecting process does not
// have is refused with the reason, and reaches no tool.
func TestUnixBridgeClaimRefused(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	for _, claim := range []string{"1-1", "not-a-process", strings.Repeat("9", 50)} {
		hc := unixHTTPClient(sock, http.Header{BridgeParentHeader: {claim}})
		req, err := http.NewRequest(http.MethodPost, "http://localhost/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami"}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), BridgeParentHeader) {
			t.Errorf("claim %q: HTTP %d %q; want 401 naming %s", claim, resp.StatusCode, body, BridgeParentHeader)
		}
	}
}

func TestUnixBodyBound(t *testing.T) {
	ts := newTestServer(t, nil)
	sock := serveUnix(t, ts)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://localhost/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := unixHTTPClient(sock, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status = %d; want 413", resp.StatusCode)
	}
}

func TestListenUnix(t *testing.T) {
	dir := sockdir.New(t)
	path := filepath.Join(dir, "sub", "p.sock")

	l, err := ListenUnix(path, UnixAccess{})
	if err != nil {
		t.Fatal(err)
	}
	assertMode(t, filepath.Dir(path), fs.ModeDir|0o700)
	assertMode(t, path, fs.ModeSocket|0o600)

	if _, err := ListenUnix(path, UnixAccess{}); !errors.Is(err, ErrSocketInUse) {
		t.Errorf("second ListenUnix err = %v; want ErrSocketInUse", err)
	}

	// A crashed daemon leaves its socket behind; the next start replaces it.
	l.Listener.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := ListenUnix(path, UnixAccess{})
	if err != nil {
		t.Fatalf("ListenUnix over a stale socket: %v", err)
	}
	l2.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still present after Close: %v", err)
	}

	notSocket := filepath.Join(dir, "file")
	if err := os.WriteFile(notSocket, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(notSocket, UnixAccess{}); err == nil {
		t.Error("ListenUnix over a regular file succeeded; want an error")
	}
	if data, err := os.ReadFile(notSocket); err != nil || string(data) != "keep me" {
		t.Errorf("regular file after refused ListenUnix = %q, %v; want it untouched", data, err)
	}
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != want {
		t.Errorf("mode of %s = %v; want %v", path, got, want)
	}
}

// fakeProc builds a /proc tree: self -> selfPID, and per pid an exe symlink and a stat file.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) fakeProc {
	return fakeProc{t: t, root: t.TempDir()}
}

func (p fakeProc) add(pid, ppid int, start uint64, exe string) {
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if exe != "" {
		if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
			p.t.Fatal(err)
		}
	}
	stat := strconv.Itoa(pid) + " (we(i)rd) comm) S " + strconv.Itoa(ppid) +
		" 1 1 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 " + strconv.FormatUint(start, 10) + " 1000 100 18446744073709551615\n"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// TestPeerAgent is the local scope rule: a peer that names no parent is the agent; a bridge
// that names its real parent (whatever binary or version the bridge is) means that parent;
// any other claim is refused.
func TestPeerAgent(t *testing.T) {
	const agentBin, otherAgentBin = "/usr/bin/claude", "/usr/bin/codex"
	p := newFakeProc(t)
	p.add(20, 1, 2000, agentBin)                 // an agent on the socket
	p.add(21, 1, 2100, otherAgentBin)            // another agent
	p.add(30, 20, 3000, "/usr/bin/postern")      // a bridge launched by agent 20
	p.add(31, 20, 3100, "/tmp/go-build/postern") // another build of the bridge, same agent
	p.add(32, 21, 3200, "/usr/bin/postern")      // a bridge of the other agent
	p.add(40, 1, 4000, "")                       // exe unreadable (other user's process)
	p.add(50, 99, 5000, "/usr/bin/postern")      // bridge whose parent is gone
	p.add(51, 40, 5100, "/usr/bin/postern")      // bridge whose parent is unreadable
	p.add(60, 1, 6000, agentBin)                 // malformed stat, written below
	if err := os.WriteFile(filepath.Join(p.root, "60", "stat"), []byte("60 (x"), 0o644); err != nil {
		t.Fatal(err)
	}
	agent20 := agentProcess{PID: 20, Exe: agentBin, StartTicks: 2000, Scope: "run:20-2000"}
	agent21 := agentProcess{PID: 21, Exe: otherAgentBin, StartTicks: 2100, Scope: "run:21-2100"}
	tests := []struct {
		name         string
		peer         int
		claim        string
		want         agentProcess
		wantErr      bool // the peer is refused
		wantClaimErr bool // the claim is refused
	}{
		{name: "agent itself", peer: 20, want: agent20},
		{name: "bridge names its parent", peer: 30, claim: "20-2000", want: agent20},
		{name: "another binary of the bridge, same agent", peer: 31, claim: "20-2000", want: agent20},
		{name: "bridge of another agent", peer: 32, claim: "21-2100", want: agent21},
		{name: "a process that names no parent is its own agent", peer: 30, want: agentProcess{PID: 30, Exe: "/usr/bin/postern", StartTicks: 3000, Scope: "run:30-3000"}},
		{name: "claim of another process's parent", peer: 32, claim: "20-2000", wantClaimErr: true},
		{name: "claim with a reused pid (other start time)", peer: 30, claim: "20-1999", wantClaimErr: true},
		{name: "malformed claim", peer: 30, claim: "20", wantClaimErr: true},
		{name: "orphaned bridge's claim", peer: 50, claim: "99-1", wantClaimErr: true},
		{name: "unreadable parent", peer: 51, claim: "40-4000", wantClaimErr: true},
		{name: "unreadable exe fails closed", peer: 40, wantErr: true},
		{name: "malformed stat", peer: 60, wantErr: true},
		{name: "no such process", peer: 70, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pp, err := procFS{root: p.root}.resolvePeer(tt.peer)
			if (err != nil) != tt.wantErr {
				t.Fatalf("resolvePeer(%d) err = %v; want error: %v", tt.peer, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			got, err := pp.agent(tt.claim)
			if (err != nil) != tt.wantClaimErr {
				t.Fatalf("agent(%q) of peer %d err = %v; want error: %v", tt.claim, tt.peer, err, tt.wantClaimErr)
			}
			if got != tt.want {
				t.Errorf("agent(%q) of peer %d = %+v; want %+v", tt.claim, tt.peer, got, tt.want)
			}
		})
	}
}

func TestParseProcessRef(t *testing.T) {
	tests := []struct {
		in      string
		want    processRef
		wantErr bool
	}{
		{in: "20-2000", want: processRef{PID: 20, StartTicks: 2000}},
		{in: "1-0", want: processRef{PID: 1, StartTicks: 0}},
		{in: "0-5", wantErr: true},
		{in: "-5", wantErr: true},
		{in: "5-", wantErr: true},
		{in: "5", wantErr: true},
		{in: "+5-1", wantErr: true},
		{in: "5-1-2", wantErr: true},
		{in: " 5-1", wantErr: true},
		{in: "5-18446744073709551616", wantErr: true},
		{in: "99999999999999999999-1", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseProcessRef(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseProcessRef(%q) = %+v, %v; want %+v, error: %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzParseProcessRef(f *testing.F) {
	for _, seed := range []string{"20-2000", "1-0", "0-1", "-", "5-1-2", "99999999999999999999-1", "٣-1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := parseProcessRef(s)
		if err != nil {
			if ref != (processRef{}) {
				t.Fatalf("error %v with non-zero result %+v", err, ref)
			}
			return
		}
		if ref.PID <= 0 || ref.String() != strings.TrimLeft(strings.SplitN(s, "-", 2)[0], "0")+"-"+trimZeros(strings.SplitN(s, "-", 2)[1]) {
			t.Fatalf("parseProcessRef(%q) = %+v does not round-trip", s, ref)
		}
	})
}

// trimZeros drops leading zeros of a decimal, keeping "0".
func trimZeros(s string) string {
	s = strings.TrimLeft(s, "0")
	if s == "" {
		return "0"
	}
	return s
}

// TestListenUnixNamesTheLengthLimit: a socket path past sun_path's limit is refused before
// anything is created, with an error that names the limit and the setting to shorten.
func TestListenUnixNamesTheLengthLimit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	_, err := ListenUnix(filepath.Join(dir, "mcp.sock"), UnixAccess{})
	if !errors.Is(err, unixpath.ErrTooLong) || !strings.Contains(err.Error(), "state_dir") {
		t.Fatalf("ListenUnix: %v, want unixpath.ErrTooLong naming state_dir", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the socket's dir was created anyway: %v", err)
	}
}
