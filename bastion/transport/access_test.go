package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

func TestListenUnixSharedMode(t *testing.T) {
	other := os.Geteuid() + 4242
	shared := unixuser.SharedDir(t, "bastionhard-")
	path := filepath.Join(shared, "run", "mcp.sock")
	l, err := ListenUnix(path, UnixAccess{UIDs: []int{other}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	assertMode(t, filepath.Dir(path), fs.ModeDir|0o755)
	assertMode(t, path, fs.ModeSocket|0o666)

	// Listing only the owners keeps the socket private.
	private := filepath.Join(sockdir.New(t), "p.sock")
	lp, err := ListenUnix(private, UnixAccess{UIDs: []int{0, os.Geteuid()}})
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Close()
	assertMode(t, private, fs.ModeSocket|0o600)

	// Other uids could not reach a socket under a 0700 directory: refused with a clear error.
	closed := filepath.Join(sockdir.New(t), "mcp.sock")
	if _, err := ListenUnix(closed, UnixAccess{UIDs: []int{other}}); !errors.Is(err, ErrSocketDirClosed) {
		t.Fatalf("ListenUnix under a 0700 dir = %v; want ErrSocketDirClosed", err)
	}
}

// helperEnv tells the test binary, re-run as another user, to connect to a socket.
const helperEnv = "POSTERN_TRANSPORT_TEST_CONNECT"

// TestHelperConnect is not a test: run as a child (helperEnv=socket,count), it opens count
// connections to the socket, sends one HTTP request on each and prints "ok" or "refused" per
// connection, then holds them open until its stdin closes.
func TestHelperConnect(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process")
	}
	path, count, _ := strings.Cut(spec, ",")
	n, _ := strconv.Atoi(count)
	var held []net.Conn
	for range n {
		c, err := net.Dial("unix", path)
		if err != nil {
			fmt.Println("refused")
			continue
		}
		held = append(held, c)
		fmt.Fprintf(c, "GET /who HTTP/1.1\r\nHost: local\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			fmt.Println("refused")
			continue
		}
		resp.Body.Close()
		fmt.Println("ok")
	}
	bufio.NewReader(os.Stdin).ReadString('\n')
	for _, c := range held {
		c.Close()
	}
	os.Exit(0)
}

// connector is a helper process holding connections as a user.
type connector struct {
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	lines *bufio.Scanner
}

// connectAs opens count connections to path as u, and returns what each got.
func connectAs(t *testing.T, bin string, u unixuser.User, path string, count int) (*connector, []string) {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestHelperConnect$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d", helperEnv, path, count))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.Credential()}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &connector{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	t.Cleanup(c.release)
	var got []string
	for len(got) < count && c.lines.Scan() {
		got = append(got, c.lines.Text())
	}
	if len(got) != count {
		t.Fatalf("helper as %s printed %q; want %d answers", u.Name, got, count)
	}
	return c, got
}

// release closes the helper's connections and waits for it.
func (c *connector) release() {
	if c.cmd.Process == nil || c.cmd.ProcessState != nil {
		return
	}
	c.stdin.Close()
	for c.lines.Scan() {
	}
	c.cmd.Wait()
}

func count(answers []string, want string) int {
	n := 0
	for _, a := range answers {
		if a == want {
			n++
		}
	}
	return n
}

// TestUnixAccessByUID runs real connections from throwaway users: a configured uid is
// admitted up to its limit, an unconfigured one is closed at accept (and logged), the last
// slots are kept for the owners, and a closed connection gives its slot back.
func TestUnixAccessByUID(t *testing.T) {
	allowed := unixuser.New(t, "bastionhard-a")
	stranger := unixuser.New(t, "bastionhard-s")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := unixuser.SharedBinary(t, exe)
	path := filepath.Join(unixuser.SharedDir(t, "bastionhard-"), "mcp.sock")
	var logs testutil.LockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	// 16 slots, the last one kept for the owners; 20 per uid, so the total binds first.
	l, err := ListenUnix(path, UnixAccess{UIDs: []int{allowed.UID}, MaxConns: 16, MaxConnsPerUID: 20, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello"))
	})}
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(l) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })

	_, got := connectAs(t, bin, stranger, path, 1)
	if got[0] != "refused" {
		t.Fatalf("unconfigured uid %d got %q; want refused at accept", stranger.UID, got)
	}
	logged := logs.String()
	if !strings.Contains(logged, "local connection refused") || !strings.Contains(logged, "uid="+strconv.Itoa(stranger.UID)) {
		t.Errorf("log = %q; want the refusal of uid %d", logged, stranger.UID)
	}

	holder, got := connectAs(t, bin, allowed, path, 16)
	if count(got, "ok") != 15 || got[15] != "refused" {
		t.Fatalf("configured uid got %q; want 15 admitted, the last slot kept for the owners", got)
	}
	// The owner (this process) takes the reserved slot; then the socket is full.
	ownerConns := func(n int) []string {
		var out []string
		for range n {
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: local\r\n\r\n")
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
				out = append(out, "ok")
			} else {
				out = append(out, "refused")
			}
		}
		return out
	}
	if got := ownerConns(2); got[0] != "ok" || got[1] != "refused" {
		t.Fatalf("owner got %q; want the reserved slot, then a full socket", got)
	}
	// The helper closes its connections; the server sees them go and the slots come back.
	holder.release()
	// The server sees them go asynchronously; a slot comes back once it has.
	testutil.WaitFor(t, "the closed connections' slots to come back", func() bool { return ownerConns(1)[0] == "ok" })
}

func TestUnixAccessPerUIDLimit(t *testing.T) {
	allowed := unixuser.New(t, "bastionhard-p")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := unixuser.SharedBinary(t, exe)
	path := filepath.Join(unixuser.SharedDir(t, "bastionhard-"), "mcp.sock")
	l, err := ListenUnix(path, UnixAccess{UIDs: []int{allowed.UID}, MaxConnsPerUID: 3})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(l) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	if _, got := connectAs(t, bin, allowed, path, 5); strings.Join(got, " ") != "ok ok ok refused refused" {
		t.Fatalf("got %q; want 3 admitted (max_local_conns_per_uid), then refused", got)
	}
}
