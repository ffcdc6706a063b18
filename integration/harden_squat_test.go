package integration

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/unixuser"
)

// TestSupervisorSocketSquatting: an unprivileged user binds every abstract name the next
// supervisors could take — the previous release's @postern-supervisor-<pid>-<start time>,
// for the pids about to be handed out and the clock ticks about to come — and connects to
// every supervisor socket it can see, while the hostagent restarts (a new supervisor each
// time) and runs a command. Every command runs.
func TestSupervisorSocketSquatting(t *testing.T) {
	const rounds = 15
	stranger := unixuser.New(t, "hardensquat")
	h := harness.StartHostagent(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hostagent log:\n%s\nsupervisor log:\n%s", h.Logs(), readFile(filepath.Join(h.DataDir, "supervisor", "supervisor.log")))
		}
	})
	squatter := runAs(t, stranger, roleSquat)
	if line := squatter.line(t); line != "squatting" {
		t.Fatalf("squatter: %q", line)
	}
	failed := 0
	for i := range rounds {
		h.Kill(t) // the lease ends with it: its supervisor, idle, exits
		h.Start(t)
		o := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: newID(t), Command: "echo ran"})
		if o.err != nil || o.res.ExitStatus != 0 || o.stdout != "ran\n" {
			failed++
			t.Errorf("round %d: exec = %+v, stderr %q; want it run", i, o.res, o.stderr)
		}
	}
	fmt.Fprintln(squatter.stdin, "report")
	t.Logf("%d of %d executions failed; the squatter: %s", failed, rounds, squatter.line(t))
}

// squatProcess is roleSquat: it keeps the names @postern-supervisor-<pid>-<ticks> bound for
// the next pids (after /proc/sys/kernel/ns_last_pid) and the clock ticks just before and
// after now (/proc/uptime, in the USER_HZ ticks of /proc/<pid>/stat), releasing the ones
// that can no longer be taken; and connects once to every supervisor socket it finds in
// /proc/net/unix. On "report" from stdin it prints what it did; it ends with stdin.
func squatProcess() int {
	const pids, ticksAhead = 400, 4
	type name struct{ pid, tick int }
	bound := map[name]int{}
	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	binds, connects := 0, 0
	seen := map[string]bool{} // its own names, and the sockets it connected to
	fmt.Println("squatting")
	for round := 0; ; round++ {
		select {
		case cmd, ok := <-cmds:
			if !ok {
				return 0
			}
			if cmd == "report" {
				fmt.Printf("held %d names, bound %d in all, connected %d times\n", len(bound), binds, connects)
			}
		default:
		}
		last, now := readInt("/proc/sys/kernel/ns_last_pid"), uptimeTicks()
		for n, fd := range bound {
			if n.pid <= last-pids || n.tick < now-2 {
				unix.Close(fd)
				delete(bound, n)
			}
		}
		for pid := last + 1; pid <= last+pids; pid++ {
			for tick := now - 1; tick <= now+ticksAhead; tick++ {
				n := name{pid, tick}
				if _, ok := bound[n]; ok {
					continue
				}
				fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					continue
				}
				addr := &unix.SockaddrUnix{Name: fmt.Sprintf("@postern-supervisor-%d-%d", pid, tick)}
				if unix.Bind(fd, addr) != nil {
					unix.Close(fd)
					continue
				}
				bound[n] = fd
				seen[addr.Name] = true
				binds++
			}
		}
		for _, s := range abstractSockets("postern-supervisor") {
			if round%50 != 0 || seen[s] {
				continue
			}
			seen[s] = true
			if c, err := dialRetrying(s); err == nil {
				connects++
				c.Close()
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// uptimeTicks is the time since boot in the clock ticks (1/100 s) of /proc/<pid>/stat.
func uptimeTicks() int {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	secs, _, _ := strings.Cut(string(data), " ")
	whole, frac, _ := strings.Cut(secs, ".")
	w, _ := strconv.Atoi(whole)
	f, _ := strconv.Atoi((frac + "00")[:2])
	return w*100 + f
}

func readInt(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return n
}

func readFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// TestUpgradeFromAbstractSocketSupervisor: the previous release's supervisor listens on an
// abstract name. A command it runs when the package is upgraded goes on under it; the new
// agent adopts it through that name (a re-issue attaches and gets its exit), and runs new
// commands under a supervisor of its own on a path socket.
func TestUpgradeFromAbstractSocketSupervisor(t *testing.T) {
	previous := previousBuild(t)
	h := harness.NewHostagent(t)
	h.Bin = filepath.Join(previous, "postern-hostagent") // with its postern-shim next to it
	h.Start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hostagent log:\n%s", h.Logs())
		}
	})
	g := newGatedCommand(t)
	id := newID(t)
	waitFirst := execInBackground(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: g.cmd + "; exit 6"})
	oldSupervisor := readSupervisorPID(t, filepath.Join(h.DataDir, "spool", id))
	if rec := readFile(filepath.Join(h.DataDir, "spool", id, "shim.json")); !strings.Contains(rec, `"socket":"@postern-supervisor-`) {
		t.Fatalf("the previous release's supervisor record %s names no abstract socket", rec)
	}

	h.Kill(t)
	waitFirst()
	h.Bin = "" // this release's
	h.Start(t)
	fresh := newID(t)
	if o := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: fresh, Command: "true"}); o.err != nil || o.res.ExitStatus != 0 {
		t.Fatalf("a new command after the upgrade = %+v", o)
	}
	if rec := readFile(filepath.Join(h.DataDir, "spool", fresh, "shim.json")); !strings.Contains(rec, `"socket":"`+filepath.Join(h.DataDir, "supervisor")) {
		t.Errorf("this release's supervisor record %s names no socket in the supervisor directory", rec)
	}
	g.open(t)
	again := execOn(t, h.Dial(t), hostproto.Exec{ExecutionID: id, Command: g.cmd + "; exit 6"})
	if again.err != nil || again.res.ExitStatus != 6 || again.stdout != "done\n" || !again.res.Replayed() {
		t.Fatalf("re-issue after the upgrade = %+v; want exit 6 from the command under supervisor %d", again, oldSupervisor)
	}
	ranOnce(t, g.file)
}
